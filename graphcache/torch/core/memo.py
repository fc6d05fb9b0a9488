"""The runtime's memo and its bounds: what graphcache.torch keeps per call
shape, and how much of it a long-running process holds.

The memo maps a call shape (its door's memo key) to its ``Plan``, made once.
Every door's entries live in the one memo of ``Runtime`` (varlen_attn's and
graphcache.hf's keys tagged); ``Memo.memoize`` is the one insert, bounded by
``MEMO_LIMIT`` entries and ``FALLBACK_LIMIT`` graph-less ones. The other
limits bound what the runtime keeps beside it: the loaded graphs, the call
shapes ``stats()["shapes_served"]`` tells apart, the classes that did not
serve here. sdpa_backward's memo (``plan.BackwardCalls``) is bounded by
``MEMO_LIMIT`` too.
"""

from __future__ import annotations

from typing import Any

from graphcache.torch.core.plan import Plan

# Memo entries past which the class-bound ones and the fallbacks are dropped, then the oldest
# (Runtime.memoize): each is one derive (and a bind, or a store lookup) to make again.
MEMO_LIMIT = 65536
# Memo entries of call shapes torch runs (a miss, a mask no graph takes, ...) made since the memo last
# dropped them, past which they are dropped: each holds its spec, and a server whose calls keep
# missing would hold 65,536 of them (about 200 MiB); a dropped one costs a derive and a store lookup.
FALLBACK_LIMIT = 8192
# Loaded graphs kept by spec past which the oldest are dropped (a memo entry that holds one keeps it;
# a call shape planned afresh loads it from the store again).
GRAPHS_LIMIT = 4096
# The exact call shapes shapes_served tells apart, and the classes that did not serve here.
SERVED_LIMIT = 65536
CLASSLESS_LIMIT = 4096


class Memo:
    """The memo from call shapes to plans and its bounded insert (the
    ``Runtime`` is one; its ``reset`` and ``configure`` empty it)."""

    _memo: dict[tuple[Any, ...], Plan]
    _fallbacks: int  # graph-less memo entries made since the last drop (FALLBACK_LIMIT)

    def memoize(self, memo_key: tuple[Any, ...], plan: Plan) -> None:
        """Keep ``plan`` for ``memo_key``'s call shape (the lock held); one made under capture is this call's only."""
        if plan.reason != "capture":
            if plan.graph is None:
                self._fallbacks += 1
            if len(self._memo) >= MEMO_LIMIT or self._fallbacks > FALLBACK_LIMIT:
                self._drop_bound()
            self._memo[memo_key] = plan

    def _drop_bound(self) -> None:
        """Forget the memo's class-bound entries and its fallbacks, and where
        that leaves it over half full, its oldest entries down to half (the
        lock held), when it holds ``MEMO_LIMIT`` entries or ``FALLBACK_LIMIT``
        fallbacks were made since the last drop: under length classes every
        decode length of every batch size is a call shape, and so it is for a
        class never warmed (a miss), a call torch must run (a tensor mask)
        or, under exact shapes, a graph per shape, so a long-running server
        would grow the memo without end. Each is one derive (and a bind, or a store lookup for a
        miss) to make again; the loaded graphs stay loaded (``GRAPHS_LIMIT``)."""
        drop_bound(self._memo)
        self._fallbacks = 0


def drop_bound(memo: dict[tuple[Any, ...], Any]) -> None:
    """Forget ``memo``'s plans without a graph or with a class-bound one,
    then, where that leaves it over half of ``MEMO_LIMIT``, its oldest
    entries down to half (the lock held): the runtime's memo and
    sdpa_backward's alike (each plan has a ``graph``)."""
    for stale in [k for k, p in memo.items() if p.graph is None or getattr(p.graph, "class_spec", None) is not None]:
        del memo[stale]
    if len(memo) > MEMO_LIMIT // 2:
        for stale in list(memo)[: len(memo) - MEMO_LIMIT // 2]:  # oldest first (insertion order)
            del memo[stale]
