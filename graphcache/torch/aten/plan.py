"""What a hit at the aten door needs, made once per call shape
(``AtenPlan``): ``aten::_scaled_dot_product_cudnn_attention`` returns nine
outputs with the shapes, dtypes and strides its meta kernel gives, and the
work of deriving them (running the meta kernel, choosing the graph's run,
the logsumexp's template) is done when the call shape is planned, so a hit
pays the graph's run and the three empty tensors the op's contract asks for.

The op's contract, read off torch 2.13 (``torch/_meta_registrations.py``):
the output in the query's dim order; a (b, h, s_q, 1) float32 logsumexp
whether or not ``compute_log_sumexp`` asked for one; ``None`` for cum_seq_q,
cum_seq_k and the debug mask; s_q and s_kv; two 0-d int64 philox tensors
(on the meta device in the meta kernel: their values mean something only
with dropout, which graphcache never serves). Every tensor output is made
afresh on each call and none shares storage with another, as torch's own
kernel's do, and not a tensor shared between calls (which would be cheaper):

- autograd saves philox_seed, philox_offset and the logsumexp in the op's
  backward node, and a compiled training graph returns them from its
  forward graph;
- CUDA graph trees (``torch.compile(mode="reduce-overhead")``) treat each
  output of a recorded graph as memory of their private pool: they rebuild
  it on replay and free it when it dies
  (``torch/_inductor/cudagraph_trees.py``), so a tensor shared from outside
  the pool would be freed under its owner;
- torch's fake-tensor cross-check (``CrossRefFakeMode``) counts outputs
  that alias one another as a mismatch with the meta kernel's.

``torch.empty_like`` of a template makes each: no fill (no kernel launch on
a GPU; the values of an unasked logsumexp and of the philox tensors are
never read) and half the cost of ``torch.empty(shape, dtype=, device=)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from graphcache.spec import layouts
from graphcache.torch.core.plan import Plan

_empty_like = torch.empty_like
_TEMPLATES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # a 0-d tensor per (device, dtype), never written


@dataclasses.dataclass(frozen=True)
class AtenPlan(Plan):
    """A call shape's plan at the aten door (a Plan with a graph), with what
    its calls' nine outputs need: the output's shape and the strides the
    op's meta kernel gives it (torch.compile's fake tensors have them), s_q
    and s_kv, the template of the logsumexp a call that does not ask for one
    gets all the same, the philox tensors' template, the graph's own run
    where it takes the call's (b, h, s, d) views as they are, and the stats
    graph's storage orders."""

    strides: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()
    s_q: int = 0
    s_kv: int = 0
    unasked: Any = dataclasses.field(default=None, compare=False)  # the logsumexp's template (no generate_stats)
    philox: Any = dataclasses.field(default=None, compare=False)  # 0-d int64 on the device: philox_seed's and _offset's
    direct: Any = dataclasses.field(default=None, compare=False)  # graph.run_views: views as they are, nothing copied
    perms: tuple[Any, ...] = (None,) * 4  # the stats graph's q, k, v storage orders, o's back (None: as it is)
    # out's strides as the graph gave them -> True where the meta kernel's differ only on size-1 dims (a view)
    restride: dict[tuple[int, ...], bool] = dataclasses.field(default_factory=dict, compare=False)

    def serve(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[Any, ...]:
        """The op's nine outputs for one call of this shape, from the graph.
        Raises what the graph's execute raises (the door catches it: guard.py)."""
        if self.unasked is not None:
            direct = self.direct
            out = direct(q, k, v) if direct is not None else self.run(q, k, v)
            lse = _empty_like(self.unasked)
        else:
            out, lse = self._run_stats(q, k, v)
        strides = out.stride()
        if strides != self.strides:
            view = self.restride.get(strides)
            if view is None:  # once per plan and graph layout (a decode step's bshd output: a view)
                view = self.restride.setdefault(strides, _size1_only(strides, self.strides, self.shape))
            if view:
                out = out.as_strided(self.shape, self.strides)  # the storage offset stays out's
            else:
                out = torch.empty_strided(self.shape, self.strides, dtype=out.dtype, device=out.device).copy_(out)
        philox = self.philox
        return (out, lse, None, None, self.s_q, self.s_kv, _empty_like(philox), _empty_like(philox), None)

    def _run_stats(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(out as a (b, h, s, d) view, logsumexp)`` from the stats graph,
        whose execute takes each tensor in its storage order."""
        assert self.graph is not None
        if self.copies or self.expanded:
            q, k, v = self.reads(q, k, v)  # the copies and expanded heads derive named
        pq, pk, pv, po = self.perms
        out, lse = self.graph.execute(
            q if pq is None else q.permute(pq), k if pk is None else k.permute(pk), v if pv is None else v.permute(pv)
        )
        return (out if po is None else out.permute(po)), lse


def aten_plan(
    plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stats: bool, causal: bool, scale: Any
) -> Plan:
    """``plan`` (the runtime's, for this call shape) as an AtenPlan where it
    has a graph, else as it is. Reads the op's meta kernel once."""
    if plan.graph is None:
        return plan
    spec = plan.spec
    assert spec is not None
    out, lse = meta_outputs(q, k, v, stats, causal, scale)
    unasked = None
    if not spec.generate_stats:
        unasked = template(q.device, torch.float32).expand(lse.shape)  # no memory per call shape
        if _empty_like(unasked).stride() != lse.stride():  # empty_like makes an expanded one contiguous: checked
            unasked = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    direct = None
    if plan.views and not (plan.copies or plan.expanded):
        direct = plan.graph.run_views  # type: ignore[attr-defined]  # Plan.views says it has one
    perms = tuple(_moved(layouts.layout(spec, role).to_storage) for role in ("q", "k", "v"))
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
    return AtenPlan(
        **fields,
        strides=tuple(out.stride()),
        shape=tuple(out.shape),
        s_q=q.shape[2],
        s_kv=k.shape[2],
        unasked=unasked,
        philox=template(q.device, torch.int64),
        direct=direct,
        perms=(*perms, _moved(layouts.layout(spec, "o").to_bhsd)),
    )


def meta_outputs(q: Any, k: Any, v: Any, stats: bool, causal: bool, scale: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The output and logsumexp the op's meta kernel gives for these inputs
    (run on meta tensors of the same shapes and strides: exact, whatever
    torch's layout rule is in this release)."""
    metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (q, k, v)]
    result = torch.ops.aten._scaled_dot_product_cudnn_attention(*metas, None, stats, 0.0, causal, False, scale=scale)
    return result[0], result[1]


def restrided(out: torch.Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    """``out`` with ``strides``: a view where they differ only on size-1 dims
    (a decode step's s_q: the meta kernel's strides there are its own), else a copy."""
    if _size1_only(out.stride(), strides, shape):
        return out.as_strided(shape, strides)
    return torch.empty_strided(shape, strides, dtype=out.dtype, device=out.device).copy_(out)


def template(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A 0-d tensor on ``device``, never written: what ``torch.empty_like``
    takes the device and dtype of (a logsumexp's template expands it). Two
    threads may each make one at first: either serves."""
    found = _TEMPLATES.get((device, dtype))
    if found is None:
        found = _TEMPLATES[(device, dtype)] = torch.empty((), dtype=dtype, device=device)
    return found


def _size1_only(have: tuple[int, ...], want: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return all(h == w or n == 1 for h, w, n in zip(have, want, shape, strict=True))


def _moved(perm: tuple[int, ...]) -> tuple[int, ...] | None:
    return None if perm == (0, 1, 2, 3) else perm
