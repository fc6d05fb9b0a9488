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

from dataclasses import dataclass
from typing import Any

import torch

from graphcache.compilers.base import LoadedGraph
from graphcache.compilers.classgraph import run_views
from graphcache.spec import GraphSpec
from graphcache.torch.bias import BiasFrom
from graphcache.torch.derive import packed


@dataclass(frozen=True)
class Plan:
    """What calls of one shape do: run ``graph`` or fall back for ``reason``."""

    spec: GraphSpec | None
    graph: LoadedGraph | None
    reason: str  # "" when graph is set
    message: str = ""
    copy_q: bool = False
    views: bool = False  # the graph takes torch's (b, h, s, d) views as they are (run_views)
    declared: int = 0  # batch x seq_q x seq_kv the serving graph declares ...
    real: int = 0  # ... and this call shape's
    larger: bool = False  # served by a stored class larger than the call's own (GraphCache.serving_class)
    bias: BiasFrom | None = None  # how a call's attn_mask becomes the graph's bias (graphcache.torch.bias)
    copy_kv: bool = False  # k and v are copied into the spec's layout too (graphcache.torch.derive)
    built: bool = False  # the graph was built by this process, not found in the store (graphcache.torch.counts)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any = None) -> torch.Tensor:
        """Execute the graph on (b, h, s, d) tensors; returns (b, h, s, d).
        With a bias, rows that see no key are 0, torch's answer, whatever
        the graph wrote there (all on the device: no host sync). Raises what
        the graph's execute raises (the runtime's callers catch it: guard.py)."""
        assert self.graph is not None and self.spec is not None
        # No view is made per call on the views path: the memo key (shapes,
        # strides, dtypes, devices) has already matched these tensors to the spec.
        if self.copy_q:
            q = packed(q, self.spec.layout)
        if self.copy_kv:
            k, v = packed(k, self.spec.layout), packed(v, self.spec.layout)
        if self.bias is None:
            if self.views:
                return self.graph.run_views(q, k, v)  # type: ignore[attr-defined]
            return run_views(self.graph, q, k, v)
        bias, hidden = self.bias(mask)
        q = self.bias.fold(q)
        if self.views:
            out = self.graph.run_views(q, k, v, bias)  # type: ignore[attr-defined]
        else:
            out = run_views(self.graph, q, k, v, bias)
        return self.bias.unfold(out.masked_fill_(hidden, 0.0))


def needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: Any = None) -> bool:
    """True when q, k, v or ``extra`` (a mask or sink tensor, or None)
    requires grad: with grad mode on, the call must then run torch, whose ops
    record the autograd graph. (An ``or`` chain: about one attribute read
    per tensor, where a generator over them cost 0.2 us more on the hit.)"""
    return q.requires_grad or k.requires_grad or v.requires_grad or (extra is not None and extra.requires_grad)
