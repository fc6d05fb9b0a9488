"""The float32 reference of a backward graph (``kind="backward"``): dQ, dK
and dV by autograd of the float32 reference, the entries a comparison looks
at, the seeded inputs every check of a backward plan draws, and the input
checks of a backward graph's ``execute``.

The gradients are autograd's through SDPA computed in float32 by plain
matrix products, with the one definition of every mask (``dense.allowed_mask``),
a batch element and a group of heads at a time, as ``dense.reference`` is.
The backward graph itself reads o and the stats the forward left; the
reference recomputes them, so a plan that misreads either shows.

torch is imported inside each function; this module imports no compiler.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import ExecutionError
from graphcache.reference.checks import check_inputs, check_tensor
from graphcache.reference.dense import (
    REFERENCE_BUDGET,
    allowed_mask,
    from_bhsd,
    random_inputs,
    reference,
    to_bhsd,
    torch_dtype,
    valid_rows,
)
from graphcache.reference.measure import relative_error
from graphcache.spec import GraphSpec

GRADIENTS = ("dq", "dk", "dv")


def gradients(
    spec: GraphSpec,
    q: Any,
    k: Any,
    v: Any,
    d_o: Any,
    seq_len_q: Any = None,
    seq_len_kv: Any = None,
    bias: Any = None,
    *,
    budget: int = REFERENCE_BUDGET,
) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` in float32, each in the spec's storage layout of q, k
    and v: autograd of the float32 SDPA of ``q``, ``k``, ``v`` (the spec's
    mask, scale, padding and additive ``bias``) against the output gradient
    ``d_o`` (o's layout). Padded query rows, and rows that see no key, give
    nothing (their output is zero, as the forward's reference writes it);
    dK and dV of a GQA / MQA spec sum over the query heads of each group."""
    import torch

    assert spec.attn_scale is not None and spec.seq_kv is not None
    qb, kb, vb, gb = (to_bhsd(spec, t) for t in (q, k, v, d_o))
    group = spec.heads_q // (spec.heads_kv or spec.heads_q)
    chunk = max(1, budget // (6 * 4 * spec.seq_q * spec.seq_kv))  # scores, masks, probs and their gradients
    dq = torch.zeros(qb.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(kb.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(vb.shape, dtype=torch.float32, device=q.device)
    rows = torch.arange(spec.seq_q, device=q.device).view(-1, 1)
    with torch.enable_grad():
        for b in range(spec.batch):
            lq = None if seq_len_q is None else int(seq_len_q.reshape(-1)[b])
            lkv = None if seq_len_kv is None else int(seq_len_kv.reshape(-1)[b])
            allowed = allowed_mask(spec, lq, lkv, device=q.device)
            live = rows < (spec.seq_q if lq is None else lq)  # padded query rows give nothing
            for h0 in range(0, spec.heads_q, chunk):
                heads = torch.arange(h0, min(spec.heads_q, h0 + chunk), device=q.device)
                kv = heads // group
                qf = qb[b].index_select(0, heads).float().requires_grad_()
                kf = kb[b].index_select(0, kv).float().requires_grad_()
                vf = vb[b].index_select(0, kv).float().requires_grad_()
                scores = torch.matmul(qf, kf.transpose(-1, -2)) * spec.attn_scale
                if bias is not None:
                    one = bias[b if bias.shape[0] > 1 else 0]
                    scores = scores + (one.index_select(0, heads.to(one.device)) if one.shape[0] > 1 else one).float()
                scores = scores.masked_fill(~allowed, float("-inf"))
                seen = torch.isfinite(scores).any(dim=-1, keepdim=True) & live  # rows with a key
                # Rows without a key get finite scores and then weight 0: no NaN reaches a gradient.
                probs = torch.softmax(torch.where(seen, scores, torch.zeros_like(scores)), dim=-1) * seen
                out = torch.matmul(probs, vf)
                grad = gb[b].index_select(0, heads).float()
                gq, gk, gv = torch.autograd.grad(out, (qf, kf, vf), grad)
                dq[b, heads] = gq
                dk[b].index_add_(0, kv, gk)
                dv[b].index_add_(0, kv, gv)
    return from_bhsd(spec, dq), from_bhsd(spec, dk), from_bhsd(spec, dv)


def backward_inputs(spec: GraphSpec, device: str, seed: int = 0) -> dict[str, Any]:
    """A backward graph's seeded inputs: ``dense.random_inputs`` (q, k, v,
    padding lengths, a bias), a random output gradient ``d_o``, and the
    forward's ``o`` (the float32 reference's, in the io dtype) and ``stats``
    ((b, h_q, s_q, 1) float32). A bias row that hides every key is given
    zeros instead, and a row with no key stats 0: what cuDNN's forward writes
    there is not what a backward check is about."""
    import torch

    inputs = random_inputs(spec, device, seed)
    if "bias" in inputs:
        bias = inputs["bias"]
        dead = torch.isinf(bias).all(dim=-1, keepdim=True)
        inputs["bias"] = torch.where(dead, torch.zeros((), dtype=bias.dtype, device=bias.device), bias)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    shape = spec.storage_shape("dO")
    inputs["d_o"] = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(torch_dtype(spec))
    extra = (inputs.get("seq_len_q"), inputs.get("seq_len_kv"), inputs.get("bias"))
    out, stats = reference(spec, inputs["q"], inputs["k"], inputs["v"], *extra)
    inputs["o"] = out.to(torch_dtype(spec))
    inputs["stats"] = torch.nan_to_num(stats, neginf=0.0)
    return inputs


def defined(spec: GraphSpec, grads: tuple[Any, Any, Any], inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The gradients with what no plan promises set to zero (NaN included):
    dQ of padded query rows and of rows that see no key (``dense.valid_rows``),
    dK and dV of padded keys."""
    import torch

    dq, dk, dv = grads
    lengths, bias = (inputs.get("seq_len_q"), inputs.get("seq_len_kv")), inputs.get("bias")
    dq = valid_rows(spec, dq, *lengths, bias=bias)
    if lengths[1] is not None:
        assert spec.seq_kv is not None
        keys = torch.arange(spec.seq_kv, device=dk.device).view(1, -1) < lengths[1].reshape(-1, 1).to(dk.device)
        keys = keys.view(spec.batch, 1, spec.seq_kv, 1) if spec.layout == "bhsd" else keys.view(spec.batch, -1, 1, 1)
        zero = torch.zeros((), dtype=dk.dtype, device=dk.device)
        dk, dv = torch.where(keys, dk, zero), torch.where(keys, dv, zero)
    return dq, dk, dv


def gradient_errors(spec: GraphSpec, grads: tuple[Any, Any, Any], inputs: dict[str, Any]) -> dict[str, float]:
    """Relative error of each gradient (``dq``, ``dk``, ``dv``) against the
    float32 reference on ``inputs`` (from ``backward_inputs``), over the
    entries ``defined`` keeps, on both sides (inf for NaN or inf)."""
    extra = (inputs.get("seq_len_q"), inputs.get("seq_len_kv"), inputs.get("bias"))
    ref = gradients(spec, inputs["q"], inputs["k"], inputs["v"], inputs["d_o"], *extra)
    ours, theirs = defined(spec, grads, inputs), defined(spec, ref, inputs)
    return {name: relative_error(a, b) for name, a, b in zip(GRADIENTS, ours, theirs, strict=True)}


def check_backward(spec: GraphSpec, tensors: dict[str, Any], device_type: str | None = None) -> None:
    """Raise ExecutionError unless the tensors are what the backward graph of
    ``spec`` takes: q, k, v, o, the padding lengths and the bias as a forward
    graph takes them (``checks.check_inputs``), ``d_o`` as o, ``stats`` a
    float32 (b, h_q, s_q, 1) tensor, and the gradient buffers ``dq``, ``dk``,
    ``dv`` where given as q, k and v (the plan writes through their strides)."""
    import torch

    if spec.kind != "backward":
        raise ExecutionError(f"{spec.summary()} is a forward graph: execute(q, k, v) runs it")
    if tensors.get("o") is None:
        raise ExecutionError("o is missing: a backward graph takes q, k, v, o (the forward's output), d_o and stats")
    check_inputs(spec, tensors, device_type)
    wanted = [
        ("d_o", spec.storage_shape("dO"), torch_dtype(spec), True),
        ("stats", spec.dims("stats"), torch.float32, True),
    ]
    wanted += [(role, spec.storage_shape(primal), torch_dtype(spec), False) for role, primal in _BUFFERS]
    for role, shape, dtype, needed in wanted:
        t = tensors.get(role)
        if t is None:
            if not needed:
                continue
            raise ExecutionError(f"{role} is missing: a backward graph takes q, k, v, o, d_o and stats")
        check_tensor(spec, role, t, shape, dtype)
        if t.device != tensors["q"].device:
            raise ExecutionError(f"{role} is on {t.device} but q is on {tensors['q'].device}")


# The gradient buffers a caller may pass, and the tensor each has the shape of.
_BUFFERS = (("dq", "q"), ("dk", "k"), ("dv", "v"))
