"""Which door a call came through, what happened there, and the two rules
every door shares: a call PyTorch hands from one of graphcache's doors to
another is counted once, and nothing is built, canaried or fetched while a
CUDA stream captures.

The doors: ``sdpa`` (``graphcache.torch.scaled_dot_product_attention``, what
``patch()`` puts in ``torch.nn.functional``), ``aten`` and ``aten_backward``
(the kernels ``graphcache.torch.install()`` registers for
``aten::_scaled_dot_product_cudnn_attention`` and its backward), ``varlen``
(``graphcache.torch.varlen_attn``) and ``hf`` (graphcache.hf's backend).

A call the ``sdpa`` door gives to torch (a miss, an input that needs grad)
may reach the ``aten`` door: PyTorch's SDPA picks cuDNN on H100 / H200 /
B200 and calls the aten op, whose kernel is graphcache's once installed.
That door then decides (it can serve a call that needs grad: it has a
backward) and counts it; the ``sdpa`` door counts it as ``relayed`` only, so
``stats()["calls"]`` counts every call once, at the door that decided it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

# torch's own SDPA, captured at import: a fallback must never call a patched
# F.scaled_dot_product_attention (ours, or another library's).
TORCH_SDPA: Callable[..., Any] = torch._C._nn.scaled_dot_product_attention


class Relay(threading.local):
    """Per thread: whether the ``sdpa`` door is inside torch's SDPA (``depth``)
    and whether another door of graphcache took the call (``taken``)."""

    depth = 0
    taken = False


RELAY = Relay()


def relayed_sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[Any, bool]:
    """torch's own SDPA for the ``sdpa`` door's fallback, and whether another
    door of graphcache (the aten door) took the call on its way down."""
    relay = RELAY
    relay.depth += 1
    relay.taken = False
    try:
        out = TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    finally:
        relay.depth -= 1
    taken, relay.taken = relay.taken, False
    return out, taken


def capturing() -> bool:
    """True while the current CUDA stream captures a graph: no build, no
    canary, no store round trip may run then (a miss goes to torch, counted
    as ``capture``). False where CUDA was never initialized (no capture can
    have begun), which is also every CPU-only build of torch."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


class Doors:
    """Calls, hits, calls built here, relayed calls and fallbacks by reason,
    per door, guarded by the runtime's count lock (``lock``, its Counts'):
    ``count``, ``fold`` and ``as_dict`` are called with it held
    (``Counts.count``, ``Counts.stats``), ``counted`` and ``relayed`` take it.
    A call a graph served takes no lock (``hit``): the plan that served it is
    appended to its door's log (one ``list.append``, atomic), and the logs are
    counted into the totals when they are read (``fold``) or grow long, each
    plan as a hit (its graph was in the store) or as built here (``Plan.built``:
    graphcache.torch.counts). So a hit at every door takes no lock (the
    ``patch()`` hit measured 0.3 to 1 us cheaper for it, docs/benchmarks.md)."""

    FOLD_AT = 4096  # log entries past which a hit counts its door's log (keeps the logs small)

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self._rows: dict[str, list[Any]] = {}  # door -> [hits, relayed, fallbacks by reason, built here]
        self._logs: dict[str, list[Any]] = {}  # door -> the plans of its graph-served calls not yet counted
        self.hits = 0  # the logged calls served from the store, counted ...
        self.built_here = 0  # ... those served by a graph this process built ...
        self.larger = 0  # ... and of both, those a stored class larger than the call's own served
        self.declared = self.real = 0  # ... the work the serving graphs declare, and the calls'

    def _row(self, door: str) -> list[Any]:
        row = self._rows.get(door)
        if row is None:
            row = self._rows[door] = [0, 0, Counter(), 0]
        return row

    def hit(self, door: str, plan: Any) -> None:
        """One call through ``door`` that ``plan``'s graph served, logged
        without the lock (``fold`` counts it)."""
        log = self._logs.get(door)
        if log is None:
            log = self._logs.setdefault(door, [])
        log.append(plan)
        if len(log) >= self.FOLD_AT:
            with self.lock:
                self.fold()

    def fold(self) -> None:
        """Count the logged calls (the lock held). Only the folder removes
        entries, from the front; a call logged meanwhile lands behind them."""
        for door, log in list(self._logs.items()):
            n = len(log)
            if not n:
                continue
            batch = log[:n]
            del log[:n]
            plans = dict(zip(map(id, batch), batch, strict=True))
            built = 0
            for key, times in Counter(map(id, batch)).items():
                plan = plans[key]
                built += times if plan.built else 0
                self.larger += plan.larger * times
                self.declared += plan.declared * times
                self.real += plan.real * times
            row = self._row(door)
            row[0] += n - built
            row[3] += built
            self.hits += n - built
            self.built_here += built

    def count(self, door: str, hit: bool, reason: str = "") -> None:
        """One call through ``door``: a hit (counted in the door's row only:
        a backward call), or a fallback for ``reason``."""
        row = self._rows.get(door) or self._row(door)
        if hit:
            row[0] += 1
        else:
            row[2][reason] += 1

    def counted(self, door: str, hit: bool, reason: str = "") -> None:
        """``count``, taking the lock: a call counted at its door only (a backward call)."""
        with self.lock:
            self.count(door, hit, reason)

    def relayed(self, door: str) -> None:
        """One call ``door`` gave to torch that another door of graphcache decided."""
        with self.lock:
            self._row(door)[1] += 1

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{door: {"calls", "hits", "built_here", "relayed", "fallbacks":
        {reason: n}}}`` for each door a call came through (``hits``: served
        from the store; ``fold`` first)."""
        return {
            door: {
                "calls": hits + built + relayed + sum(fallbacks.values()),
                "hits": hits,
                "built_here": built,
                "relayed": relayed,
                "fallbacks": dict(fallbacks),
            }
            for door, (hits, relayed, fallbacks, built) in self._rows.items()
        }
