"""torch's side of SDPA's backward: the fallback graph of a backward spec
(``kind="backward"``), ``TorchSdpaBackwardGraph``, and the reference
compiler's backward graph, which is the same with another name.

Its ``execute`` runs torch's own backward: autograd through torch's
scaled_dot_product_attention (its math kernel on a CPU) on the io-dtype
q, k and v, with the spec's exact mask (``reference.dense.allowed_mask``,
shared with the forward), scale, padding and additive bias. Query rows that
are padding, or that see no key, are left out of the loss (their output is
zero, as the forward writes it), so no NaN of an empty softmax reaches a
gradient. The forward's o and stats are checked and not read: torch
recomputes them. ``fallback_graph`` picks the forward or the backward
fallback by the spec's kind.
"""

from __future__ import annotations

from typing import Any

from graphcache.compilers.classgraph import real_spec
from graphcache.compilers.torch_sdpa import TorchSdpaGraph, not_cudnn
from graphcache.reference.backward import check_backward
from graphcache.reference.dense import allowed_mask, from_bhsd, to_bhsd
from graphcache.spec import GraphSpec


class TorchSdpaBackwardGraph(TorchSdpaGraph):
    """The fallback of a backward spec: dQ, dK and dV from torch's SDPA
    backward. For a class spec, ``execute`` takes real tensors of any shape
    the class covers (ExecutionError for one outside it), as a cuDNN class
    graph does."""

    def execute(  # type: ignore[override]
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        o: Any = None,
        d_o: Any = None,
        stats: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        bias: Any = None,
        dq: Any = None,
        dk: Any = None,
        dv: Any = None,
    ) -> tuple[Any, Any, Any]:
        """``(dq, dk, dv)`` in the spec's storage layout and q's dtype, from
        q, k, v, the forward's ``o`` and ``stats``, and the output gradient
        ``d_o`` (o's layout); written into ``dq``/``dk``/``dv`` where given.
        Raises ExecutionError for tensors the spec does not take
        (``reference.backward.check_backward``)."""
        spec = real_spec(self.spec, q, k) if self.spec.is_class else self.spec
        given = {"q": q, "k": k, "v": v, "o": o, "d_o": d_o, "stats": stats}
        extra = {"seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "bias": bias, "dq": dq, "dk": dk, "dv": dv}
        check_backward(spec, {**given, **extra})
        grads = torch_gradients(spec, q, k, v, d_o, seq_len_q, seq_len_kv, bias)
        a, b, c = (g if out is None else out.copy_(g) for g, out in zip(grads, (dq, dk, dv), strict=True))
        return a, b, c

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        raise NotImplementedError("a backward graph runs through execute(q, k, v, o=, d_o=, stats=)")


def torch_gradients(
    spec: GraphSpec, q: Any, k: Any, v: Any, d_o: Any, len_q: Any = None, len_kv: Any = None, bias: Any = None
) -> tuple[Any, Any, Any]:
    """dQ, dK and dV of torch's SDPA (autograd, in the io dtype) against
    ``d_o``, in the spec's storage layout."""
    import torch

    qb, kb, vb = (to_bhsd(spec, t).detach().requires_grad_() for t in (q, k, v))
    keep = None
    kwargs: dict[str, Any] = {"scale": spec.attn_scale, "enable_gqa": spec.heads_q != spec.heads_kv}
    if spec.mask != "none" or spec.padding or bias is not None:
        masks = [
            allowed_mask(
                spec,
                None if len_q is None else int(len_q.reshape(-1)[b]),
                None if len_kv is None else int(len_kv.reshape(-1)[b]),
                device=q.device,
            )
            for b in range(spec.batch)
        ]
        allowed = torch.stack(masks).unsqueeze(1)  # (b, 1, s_q, s_kv)
        if bias is not None:
            allowed = allowed & (bias != float("-inf"))
        seen = allowed.any(dim=-1, keepdim=True)  # rows with a key: the others see every key, then weigh 0
        if len_q is not None:
            rows = torch.arange(spec.seq_q, device=q.device).view(1, 1, -1, 1)
            seen = seen & (rows < len_q.reshape(-1, 1, 1, 1))
        allowed = allowed | ~seen
        keep = seen.to(qb.dtype)
        if bias is None:
            kwargs["attn_mask"] = allowed
        else:  # additive, as the forward's fallback passes it; a row with no key: zeros, weighed 0 below
            kwargs["attn_mask"] = torch.where(seen, bias, 0.0).masked_fill(~allowed, float("-inf")).to(bias.dtype)
    with torch.enable_grad(), not_cudnn(q):
        # torch's own op, not the module attribute: graphcache.torch.patch() may have replaced that
        # (and not its cuDNN kernel on a GPU: install() serves that one).
        out = torch._C._nn.scaled_dot_product_attention(qb, kb, vb, **kwargs)
        if keep is not None:
            out = out * keep
        dq, dk, dv = torch.autograd.grad(out, (qb, kb, vb), to_bhsd(spec, d_o))
    return from_bhsd(spec, dq), from_bhsd(spec, dk), from_bhsd(spec, dv)


def fallback_graph(spec: GraphSpec, reason: str = "") -> TorchSdpaGraph:
    """The torch fallback graph of ``spec``: its backward for a backward spec."""
    return TorchSdpaBackwardGraph(spec, reason) if spec.kind == "backward" else TorchSdpaGraph(spec, reason)
