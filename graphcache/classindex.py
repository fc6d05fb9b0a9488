"""The class index: which stored class serves a call whose own class is not
stored.

Under a class policy a call's own class (``class_of``) may never have been
warmed while a larger stored class covers it: a recording of prompts of
37, 200 and 513 tokens stores the 128, 256 and 1024 classes, and a prompt
of 300 falls in 512. ``ClassIndex`` holds the class specs the local store
holds, by target and by everything a class fixes but its sizes, so the
choice costs no store round trip: it is made once per new call shape (the
drop-in's memo keeps it), never per call.

The smallest stored class that ``covers`` the call serves it (never across
``seq_q == 1``), as long as the work it declares (batch x seq_q x seq_kv)
is at most ``GRAPHCACHE_CLASS_SLACK`` (default 4) times that of the call's
own class: a graph declared far longer than the call runs it slower (short
rows under a long declaration, up to 2.3x on B200, cudnn-frontend#1087) and
with a larger workspace, so a much larger class is not worth the hit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from graphcache.errors import CorruptArtifact, SpecError, StoreError, TargetError
from graphcache.settings import DEFAULT_SLACK, SLACK_VAR, check_slack, slack_from_env
from graphcache.spec import GraphSpec
from graphcache.spec.layouts import shown
from graphcache.stores import stored_header
from graphcache.stores.disk import DiskStore
from graphcache.target import Target

log = logging.getLogger(__name__)

# The slack is read at start with the other settings; re-exported here.
__all__ = [
    "DEFAULT_SLACK",
    "SLACK_VAR",
    "ClassIndex",
    "check_slack",
    "differences",
    "family",
    "local_headers",
    "slack_from_env",
    "work",
]

_CLASS_SIZES = ("batch", "seq_q", "seq_kv")
# A class's mechanism (override or padded) is the target's choice, not part of
# what it covers: the index holds classes as a manifest lists them.
_SIZES = frozenset({*_CLASS_SIZES, "shapes", "mechanism"})
_FIXED = tuple(name for name in GraphSpec.field_names() if name not in _SIZES)


def work(spec: GraphSpec) -> int:
    """The work a (class) spec declares: batch x seq_q x seq_kv."""
    assert spec.seq_kv is not None
    return spec.batch * spec.seq_q * spec.seq_kv


def family(spec: GraphSpec) -> tuple[Any, ...]:
    """What a class fixes but its sizes, and its side of ``seq_q == 1``: the
    classes of one family differ only in the sizes they declare."""
    return (*(getattr(spec, name) for name in _FIXED), spec.seq_q == 1)


def _sizes(spec: GraphSpec) -> str:
    return f"b{spec.batch} q{spec.seq_q} kv{spec.seq_kv}"


def _short(klass: GraphSpec, spec: GraphSpec) -> list[str]:
    """The sizes of the call ``spec`` that the class ``klass`` declares less of."""
    return [
        f"{name} {getattr(klass, name)} < {getattr(spec, name)}"
        for name in _CLASS_SIZES
        if getattr(klass, name) < getattr(spec, name)
    ]


def _over_slack(klass: GraphSpec, own: GraphSpec, slack: float) -> str:
    """Why ``klass`` declares too much work to serve a call of class ``own`` ('' when it does not)."""
    if work(klass) <= slack * work(own):
        return ""
    ratio = work(klass) / work(own)
    return f"declares {ratio:g}x the work of the call's own class, over the slack {slack:g} ({SLACK_VAR})"


def differences(stored: GraphSpec, spec: GraphSpec, own: GraphSpec, slack: float) -> list[str]:
    """What keeps the stored class ``stored`` from serving the exact call
    ``spec`` (whose own class is ``own``), as ``explain`` lists it: each field
    a class fixes that differs, then the sizes the class is short of (said in
    the call's numbers and its own class's), or the work it declares over the
    ``slack``. Empty when ``stored`` covers ``spec`` within the slack. A call
    never differs from a class by ``shapes``: the call does not choose it."""
    diffs = [
        f"spec.{name}: stored {shown(stored, name)}, asked {shown(spec, name)}"
        for name in _FIXED
        if getattr(stored, name) != getattr(spec, name)
    ]
    sizes: tuple[str, ...] = _CLASS_SIZES
    if (stored.seq_q == 1) != (spec.seq_q == 1):
        kind = ("decode", "prefill") if stored.seq_q == 1 else ("prefill", "decode")
        diffs.append(
            f"spec.seq_q: stored {stored.seq_q}, asked {spec.seq_q} (a {kind[0]} class never serves a {kind[1]} call)"
        )
        sizes = ("batch", "seq_kv")
    diffs += [
        f"spec.{name}: stored up to {getattr(stored, name)}, asked {getattr(spec, name)} (class {getattr(own, name)})"
        for name in sizes
        if getattr(stored, name) < getattr(spec, name)
    ]
    if not diffs and (over := _over_slack(stored, own, slack)):
        diffs.append(f"work: {_sizes(stored)} {over}")
    return diffs


class ClassIndex:
    """The class specs stored (as graphs, not negative entries), by target
    and family. Thread-safe; ``add`` and ``discard`` keep it current."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._classes: dict[tuple[Target, tuple[Any, ...]], list[GraphSpec]] = {}

    def add(self, spec: GraphSpec, target: Target) -> None:
        if not spec.is_class:
            return
        spec = spec.as_listed()
        # Copy on write: ``choose`` reads the lists without the lock (a list
        # being sorted in place looks empty to another thread).
        with self._lock:
            members = self._classes.get((target, family(spec)), [])
            if spec not in members:
                grown = sorted([*members, spec], key=lambda s: (work(s), s.seq_kv, s.seq_q, s.batch))
                self._classes[(target, family(spec))] = grown

    def discard(self, spec: GraphSpec, target: Target) -> None:
        spec = spec.as_listed()
        with self._lock:
            members = self._classes.get((target, family(spec)), [])
            if spec in members:
                self._classes[(target, family(spec))] = [m for m in members if m != spec]

    def __contains__(self, item: tuple[GraphSpec, Target]) -> bool:
        spec, target = item
        spec = spec.as_listed()
        return spec in self._classes.get((target, family(spec)), ())

    def __len__(self) -> int:
        return sum(len(v) for v in self._classes.values())

    def stored(self, spec: GraphSpec, target: Target) -> list[GraphSpec]:
        """The stored classes of ``spec``'s family on ``target``, smallest first."""
        with self._lock:
            return list(self._classes.get((target, family(spec)), ()))

    def choose(
        self, spec: GraphSpec, own: GraphSpec, target: Target, slack: float, skip: Iterable[GraphSpec] = ()
    ) -> GraphSpec:
        """The class that serves the exact ``spec``: ``own`` (its class under
        the policy) when stored or when no stored class may serve, else the
        smallest stored class covering ``spec`` within ``slack`` x ``own``'s
        work (those in ``skip``, which did not serve here, left out)."""
        if not own.is_class:
            return own
        members = self._classes.get((target, family(spec)))
        if not members or own in members:
            return own
        bound = slack * work(own)
        for klass in members:  # smallest first
            if work(klass) > bound:
                break
            if klass.covers(spec) and klass not in skip:
                return klass
        return own

    def why(self, spec: GraphSpec, own: GraphSpec, target: Target, slack: float) -> tuple[GraphSpec, list[str]]:
        """``choose``'s answer and, for ``explain``, why each other stored
        class of the family does not serve (smaller ones first)."""
        chosen = self.choose(spec, own, target, slack)
        reasons = []
        if own not in self.stored(spec, target) and own.is_class:
            reasons.append(f"{_sizes(own)} (the call's own class): not stored")
        for klass in self.stored(spec, target):
            if klass == chosen:
                continue
            if short := _short(klass, spec):
                reasons.append(f"{_sizes(klass)}: does not cover the call ({', '.join(short)})")
            elif over := _over_slack(klass, own, slack):
                reasons.append(f"{_sizes(klass)}: {over}")
            else:
                reasons.append(f"{_sizes(klass)}: covers the call, but {_sizes(chosen)} declares less work")
        return chosen, reasons

    @classmethod
    def listed(cls, headers: Iterable[dict[str, Any]], target: Target) -> ClassIndex:
        """An index of the class graphs among stored ``headers`` built for
        ``target`` (a store's listing: prefetch, warm --check, explain)."""
        index, wanted = cls(), target.to_dict()
        index.fill(h for h in headers if h.get("target") == wanted)
        return index

    def fill(self, headers: Iterable[dict[str, Any]]) -> int:
        """Add every class graph among stored ``headers``; returns how many."""
        added = 0
        for header in headers:
            if header.get("unsupported"):
                continue
            try:
                spec = GraphSpec.from_dict(header["spec"])
                target = Target.from_dict(header["target"])
            except (SpecError, TargetError, KeyError, TypeError):
                continue
            if spec.is_class:
                self.add(spec, target)
                added += 1
        return added


def local_headers(store: Any) -> Iterable[dict[str, Any]]:
    """The headers of what the store holds on this machine, read without a
    network round trip: a DiskStore's (a TieredStore's local tier's) entries,
    each header read from the entry's first bytes (``stored_header``). A remote store alone
    (HttpStore, RedisStore) lists nothing here: its classes join the index as
    prefetch, warm and loads bring them."""
    local = getattr(store, "local", store)
    if not isinstance(local, DiskStore):
        return
    try:
        keys = list(local.keys())
    except StoreError as exc:
        log.warning("class index: cannot list %r: %s", local, exc)
        return
    for key in keys:
        try:
            header = stored_header(local, key)
            if header is not None:
                yield header
        except (StoreError, CorruptArtifact):
            continue  # a read quarantines it; the index only lists
