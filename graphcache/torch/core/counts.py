"""What the drop-in's calls were served by: the counters behind
``graphcache.torch.stats()``.

Every door (the SDPA drop-in, ``varlen_attn``, graphcache.hf's dense path,
the aten door; graphcache.torch.doors names them) counts each call here,
once, through ``Runtime.count``, in these totals and in its door's row
(``doors``). A call is exactly one of:

- **served from the store** (``served_from_store``; ``hits`` is the same
  number): its graph was in the store when this process first asked for it,
  put there by ``graphcache warm``, a prefetch or another process. The warm
  start the cache is for.
- **built here** (``built_here``): its graph was built by this process on a
  miss (on_miss ``build``). Served by a graph, but no hit: the cold build the
  store is there to avoid. ``built_graphs`` names those graphs. A call
  shape's plan says which it is (``Plan.built``), so counting costs the
  same either way.
- **a fallback** (``fallbacks``, by reason): torch ran it.
- **raised** NotFound (on_miss ``error``).

``misses`` counts the calls whose graph the store did not hold: those built
here, those that ran torch for it (``fallbacks["miss"]``) and those that
raised. A call a graph served takes no lock: its plan is logged at its door
and counted when ``stats()`` reads (graphcache.torch.doors: ``Doors.hit``,
``Doors.fold``); any other counter added here is a field, bumped under the
lock, and a key of ``stats()``.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Any, TypeVar

from graphcache.spec import GraphSpec
from graphcache.torch.core.doors import Doors
from graphcache.torch.core.plan import Plan

K = TypeVar("K")
V = TypeVar("V")

# The most recent missed specs ``stats()["missed_specs"]`` names (older ones counted in missed_specs_dropped).
MISSED_LIMIT = 1024
# The most recent graphs built here ``stats()["built_graphs"]`` names (older: built_graphs_dropped).
BUILT_LIMIT = 1024


class Recent(OrderedDict[K, V]):
    """A per-process record of calls that keeps the most recent ``limit``
    entries (an entry set again is the most recent) and counts those it
    dropped (``dropped``): a long-running process whose calls keep making
    new shapes keeps a bounded record of them, and says how much it left out.
    ``add`` uses it as a set. Not locked: its owner's lock guards it."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.dropped = 0

    def __setitem__(self, key: K, value: V) -> None:
        if key in self:
            self.move_to_end(key)
        super().__setitem__(key, value)
        if len(self) > self.limit:
            self.popitem(last=False)
            self.dropped += 1

    def add(self, key: K) -> None:
        self[key] = True  # type: ignore[assignment]

    def forget(self) -> None:
        """Empty it and its count of dropped entries."""
        self.clear()
        self.dropped = 0


class Counts:
    """The counters of one runtime; thread-safe. ``built`` holds the specs of
    the graphs this process built: the plans made for them say ``built``.
    ``doors`` counts the same calls by door, under the same lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Calls a graph served, by door, and their totals (hits, built_here, served_by_larger, the work
        # declared): logged without the lock, counted when read (Doors.hit, Doors.fold).
        self.doors = Doors(self._lock)
        self.misses = 0  # calls whose graph the store did not hold that no graph built here served
        self.raised = 0  # calls that raised NotFound (on_miss=error)
        self.fallbacks: Counter[str] = Counter()
        self.missed: Recent[GraphSpec, int] = Recent(MISSED_LIMIT)  # the most recent missed specs, calls each
        # The graphs this process built (the most recent; a plan made for an older one counts its calls as hits).
        self.built: Recent[GraphSpec, bool] = Recent(BUILT_LIMIT)

    def count(self, plan: Plan, door: str = "sdpa") -> None:
        """One call that ran ``plan``, through ``door``; one a graph served takes no lock."""
        if plan.graph is not None:
            self.doors.hit(door, plan)  # a hit or built here, told apart by plan.built when counted
            return
        with self._lock:
            self.doors.count(door, False, plan.reason)
            self.fallbacks[plan.reason] += 1
            if plan.reason == "miss":
                assert plan.spec is not None
                self.misses += 1
                self.missed[plan.spec] = self.missed.get(plan.spec, 0) + 1

    def raised_miss(self) -> None:
        """A call that raised NotFound on a miss (on_miss=error)."""
        with self._lock:
            self.misses += 1
            self.raised += 1

    def note_built(self, graph: GraphSpec) -> None:
        """The graph of spec ``graph`` was built by this process: its calls are ``built_here``."""
        with self._lock:
            self.built.add(graph)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            doors = self.doors
            doors.fold()  # the calls logged since (Doors.hit)
            fallbacks = dict(self.fallbacks)
            return {
                "calls": doors.hits + doors.built_here + sum(fallbacks.values()) + self.raised,
                "hits": doors.hits,
                "served_from_store": doors.hits,
                "built_here": doors.built_here,
                "served_by_larger": doors.larger,
                "declared_to_real": round(doors.declared / doors.real, 3) if doors.real else 0.0,
                "misses": self.misses + doors.built_here,
                "fallbacks": fallbacks,
                "built_graphs": sorted(spec.summary() for spec in self.built),
                "built_graphs_dropped": self.built.dropped,
                "missed_specs": [{"spec": s.to_dict(), "calls": n} for s, n in self.missed.items()],
                "missed_specs_dropped": self.missed.dropped,
                "doors": doors.as_dict(),
            }


def summary(stats: dict[str, Any]) -> str:
    """One line saying what ``stats`` (``graphcache.torch.stats()``) counted:
    ``16 calls: 0 served from the store, 16 by graphs built here (2 built:
    b1 h4/2 s64 d64 bf16 bshd causal class, ...), 0 fell back to torch``."""
    fell = sum(stats["fallbacks"].values())
    text = f"{stats['calls']} calls: {stats['served_from_store']} served from the store"
    text += f", {stats['built_here']} by graphs built here"
    if stats["built_graphs"]:
        text += f" ({len(stats['built_graphs'])} built: {', '.join(stats['built_graphs'])})"
    text += f", {fell} fell back to torch"
    if fell:
        text += " (" + ", ".join(f"{reason} {n}" for reason, n in sorted(stats["fallbacks"].items())) + ")"
    return text
