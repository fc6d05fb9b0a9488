"""What the calls of one shape do (``Plan``): run a loaded graph on the
call's tensors, or fall back to torch for a named reason. graphcache.torch's
runtime makes one per call shape, once, and memoizes it; varlen_attn and
graphcache.hf's dense path make theirs the same way.

A call shape's memo key holds what decides its plan; one part of it is read
per call instead, before the memo: whether the call needs gradients
(``needs_grad`` under grad mode). Graphs are forward-only (cuDNN writes a
fresh tensor), so a call that needs them always runs torch (``autograd``),
whichever call of its shapes came first: a plan made under ``no_grad`` never
serves a call whose learned mask, or sink, requires grad.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from graphcache.compilers.base import LoadedGraph
from graphcache.compilers.classgraph import run_views
from graphcache.spec import GraphSpec
from graphcache.torch.core.bias import BiasFrom
from graphcache.torch.core.derive import packed, widen

# Tensors copied for a graph to read, by (tensor, reason): counted where the
# copy is made, so a hit that copies nothing pays nothing for the count
# (the runtime's stats()["copies"]; Runtime.reset clears it).
COPIED: Counter[tuple[str, str]] = Counter()
COPIED_BYTES: Counter[tuple[str, str]] = Counter()  # the same, in bytes
_COPIED_LOCK = threading.Lock()


@dataclass(frozen=True)
class Plan:
    """What calls of one shape do: run ``graph`` or fall back for ``reason``."""

    spec: GraphSpec | None
    graph: LoadedGraph | None
    reason: str  # "" when graph is set
    message: str = ""
    copies: tuple[tuple[str, str, str], ...] = ()  # (role, layout, reason): copied per call (derive)
    views: bool = False  # the graph takes torch's (b, h, s, d) views as they are (run_views)
    declared: int = 0  # batch x seq_q x seq_kv the serving graph declares ...
    real: int = 0  # ... and this call shape's
    larger: bool = False  # served by a stored class larger than the call's own (GraphCache.serving_class)
    bias: BiasFrom | None = None  # how a call's attn_mask becomes the graph's bias (graphcache.torch.bias)
    expanded: bool = False  # k and v expanded over heads (stride 0): the graph reads their first head
    built: bool = False  # the graph was built by this process, not found in the store (graphcache.torch.counts)
    rows: int = 0  # k and v read over the allocation of this many rows they are the first rows of (derive.Derived)

    def reads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tensors the graph reads: the call's, with k and v's first head
        where they are expanded, and a packed copy of each tensor ``copies`` names."""
        if self.expanded:
            k, v = k[:, :1], v[:, :1]
        if self.copies:
            given = {"q": q, "k": k, "v": v}
            for role, layout, _ in self.copies:
                given[role] = packed(given[role], layout)
            with _COPIED_LOCK:
                for role, _, reason in self.copies:
                    COPIED[(role, reason)] += 1
                    COPIED_BYTES[(role, reason)] += given[role].numel() * given[role].element_size()
            q, k, v = given["q"], given["k"], given["v"]
        return q, k, v

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any = None) -> torch.Tensor:
        """Execute the graph on (b, h, s, d) tensors; returns (b, h, s, d).
        With a bias, rows that see no key are 0, torch's answer, whatever
        the graph wrote there (all on the device: no host sync). Raises what
        the graph's execute raises (the runtime's callers catch it: guard.py)."""
        assert self.graph is not None and self.spec is not None
        # No view is made per call on the views path: the memo key (shapes,
        # strides, dtypes, devices) has already matched these tensors to the spec.
        if self.bias is None:
            if self.copies or self.expanded:  # two flag reads on every other call's hit path, as before
                q, k, v = self.reads(q, k, v)
            if self.views:  # never with rows: a prefix's spec has padding, which views leave out
                return self.graph.run_views(q, k, v)  # type: ignore[attr-defined]
            if self.rows:
                return self.run_prefix(q, k, v)
            return run_views(self.graph, q, k, v)
        bias, hidden = self.bias(mask)
        q = self.bias.fold(q)  # derive read q's layout off the folded query
        if self.copies or self.expanded:
            q, k, v = self.reads(q, k, v)
        if self.views:
            out = self.graph.run_views(q, k, v, bias)  # type: ignore[attr-defined]
        else:
            out = run_views(self.graph, q, k, v, bias)
        return self.bias.unfold(out.masked_fill_(hidden, 0.0))

    def run_prefix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """A call whose k and v are the first rows of a longer allocation (a
        static cache sliced to the prompt): the graph reads the allocation's
        ``rows`` in place, the call's own lengths its padding (one (b,) fill
        each on the device, no host read). Raises RuntimeError where the
        storage does not hold the rows (as_strided checks: the guard then
        serves the call another way)."""
        assert self.graph is not None
        b = q.shape[0]
        lengths = {
            "seq_len_q": torch.full((b, 1, 1, 1), q.shape[2], dtype=torch.int32, device=q.device),
            "seq_len_kv": torch.full((b, 1, 1, 1), k.shape[2], dtype=torch.int32, device=q.device),
        }
        return run_views(self.graph, q, widen(k, self.rows), widen(v, self.rows), **lengths)


def needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: Any = None) -> bool:
    """True when q, k, v or ``extra`` (a mask or sink tensor, or None)
    requires grad: with grad mode on, the call must then run torch, whose ops
    record the autograd graph. (An ``or`` chain: about one attribute read
    per tensor, where a generator over them cost 0.2 us more on the hit.)"""
    return q.requires_grad or k.requires_grad or v.requires_grad or (extra is not None and extra.requires_grad)


class BackwardCalls:
    """What ``graphcache.torch.backward.sdpa_backward`` keeps in the runtime:
    its memo (a call shape's plan) and its counters, apart from the forward's
    and in its words (graphcache.torch.counts): ``calls``,
    ``served_from_store`` (= ``hits``), ``built_here`` (a graph this process
    built on a miss: no hit), ``misses`` (calls whose graph the store did not
    hold: built here, refused as ``miss``, or raised) and ``fallbacks`` by
    reason (calls it answered with UnsupportedCall, which the caller ran
    another way; a miss among them as ``miss``)."""

    def __init__(self) -> None:
        self.memo: dict[tuple[Any, ...], Any] = {}
        self.hits = 0
        self.built_here = 0
        self.misses = 0
        self.raised = 0  # calls that raised NotFound (on_miss=error)
        self.fallbacks: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, reason: str = "", *, built: bool = False) -> None:
        """One call: served by a graph where ``reason`` is empty (``built``:
        one this process built), else a fallback for ``reason`` (``miss``
        counts a miss too; ``raised``, a miss that raised NotFound under
        on_miss=error, is a miss and no fallback)."""
        with self._lock:
            if not reason:
                self.built_here += built
                self.misses += built
                self.hits += not built
            elif reason == "raised":
                self.raised += 1
                self.misses += 1
            else:
                self.fallbacks[reason] += 1
                self.misses += reason == "miss"

    def stats(self) -> dict[str, Any]:
        with self._lock:
            fallbacks = dict(self.fallbacks)
            calls = self.hits + self.built_here + sum(fallbacks.values()) + self.raised
            return {
                "calls": calls,
                "hits": self.hits,
                "served_from_store": self.hits,
                "built_here": self.built_here,
                "misses": self.misses,
                "fallbacks": fallbacks,
            }
