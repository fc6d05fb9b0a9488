"""torch's side of SDPA: the float32 reference, input checks, and the fallback.

The reference and the fallback share one definition of every mask, so a
causal spec can never come back unmasked from either.
"""

from __future__ import annotations

import logging
from typing import Any

from graphcache.compilers.classgraph import real_spec
from graphcache.errors import ExecutionError, NoGpu
from graphcache.spec import GraphSpec

log = logging.getLogger(__name__)

# Relative error ||out - ref|| / ||ref|| allowed against the float32 reference.
# Starting points from the issue; tighten to what GPUs show (docs/gpu-results.md).
TOLERANCE = {"float16": 5e-3, "bfloat16": 2e-2}


def torch_dtype(spec: GraphSpec) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[spec.dtype]


def allowed_mask(
    spec: GraphSpec, seq_len_q: int | None = None, seq_len_kv: int | None = None, device: Any = None
) -> Any:
    """Boolean (seq_q, seq_kv) matrix, True where query i may attend key j.

    ``seq_len_q``/``seq_len_kv`` are the valid lengths of one padded sequence;
    keys at or past ``seq_len_kv`` are never attended, and bottom-right
    alignment follows the valid lengths.
    """
    import torch

    assert spec.seq_kv is not None
    len_q = spec.seq_q if seq_len_q is None else int(seq_len_q)
    len_kv = spec.seq_kv if seq_len_kv is None else int(seq_len_kv)
    i = torch.arange(spec.seq_q, device=device).unsqueeze(1)
    j = torch.arange(spec.seq_kv, device=device).unsqueeze(0)
    allowed = j < len_kv
    if spec.mask == "causal":
        allowed = allowed & (j <= i)
    elif spec.mask == "causal_bottom_right":
        allowed = allowed & (j <= i + (len_kv - len_q))
    elif spec.mask == "sliding_window":
        assert spec.window_left is not None and spec.window_right is not None
        allowed = allowed & (j >= i - spec.window_left) & (j <= i + spec.window_right)
    return allowed


def to_bhsd(spec: GraphSpec, tensor: Any) -> Any:
    """A (b, h, s, d) view of a q/k/v/o tensor stored in the spec's layout."""
    return tensor.transpose(1, 2) if spec.layout == "bshd" else tensor


def from_bhsd(spec: GraphSpec, tensor: Any) -> Any:
    return tensor.transpose(1, 2).contiguous() if spec.layout == "bshd" else tensor.contiguous()


# Bytes of float32 score matrices the reference holds at once. A prefill
# spec's whole score tensor (batch x heads x seq_q x seq_kv) would not fit in
# any GPU (8 x 32 x 8192 x 8192 x 4 B = 68 GB), so it is computed per batch
# element and per group of heads.
REFERENCE_BUDGET = 1 << 30


def reference(
    spec: GraphSpec,
    q: Any,
    k: Any,
    v: Any,
    seq_len_q: Any = None,
    seq_len_kv: Any = None,
    *,
    budget: int = REFERENCE_BUDGET,
) -> tuple[Any, Any]:
    """SDPA computed in float32 by plain matrix products (torch's math path),
    a batch element and a group of heads at a time (at most ``budget``
    bytes of scores, and at least one head, at once).

    Returns ``(out, stats)``: out in the spec's storage layout (float32), and
    the log-sum-exp per query row (b, h, s, 1). Rows with no allowed key and
    padded query rows are zero.
    """
    import torch

    assert spec.attn_scale is not None and spec.seq_kv is not None
    qb, kb, vb = (to_bhsd(spec, t) for t in (q, k, v))
    group = spec.heads_q // (spec.heads_kv or spec.heads_q)
    # scores, probabilities and the softmax's temporaries: about three matrices per head
    per_head = 3 * 4 * spec.seq_q * spec.seq_kv
    chunk = max(1, budget // per_head)
    out = torch.zeros((spec.batch, spec.heads_q, spec.seq_q, vb.shape[-1]), dtype=torch.float32, device=q.device)
    stats = torch.zeros((spec.batch, spec.heads_q, spec.seq_q, 1), dtype=torch.float32, device=q.device)
    for b in range(spec.batch):
        lq = None if seq_len_q is None else int(seq_len_q.reshape(-1)[b])
        lkv = None if seq_len_kv is None else int(seq_len_kv.reshape(-1)[b])
        allowed = allowed_mask(spec, lq, lkv, device=q.device)  # (sq, skv)
        for h0 in range(0, spec.heads_q, chunk):
            heads = torch.arange(h0, min(spec.heads_q, h0 + chunk), device=q.device)
            kv = heads // group  # the key/value head each query head reads (GQA)
            qf = qb[b].index_select(0, heads).float()
            kf = kb[b].index_select(0, kv).float()
            vf = vb[b].index_select(0, kv).float()
            scores = torch.matmul(qf, kf.transpose(-1, -2)) * spec.attn_scale
            scores.masked_fill_(~allowed, float("-inf"))
            stats[b, heads] = torch.logsumexp(scores, dim=-1, keepdim=True)
            probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
            del scores
            out[b, heads] = torch.matmul(probs, vf)
            del probs
        if lq is not None:
            out[b, :, lq:] = 0.0
            stats[b, :, lq:] = 0.0
    return from_bhsd(spec, out), stats


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float32 (0 when both are zero).

    ``inf`` when either side holds a NaN or an infinity: a comparison with
    NaN is false, so a check written ``error > tolerance`` would pass it.
    Check with ``within_tolerance`` (``error <= tolerance``).
    """
    import torch

    a, b = out.float(), ref.float()
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return float("inf")
    diff = torch.linalg.vector_norm((a - b).reshape(-1)).item()
    norm = torch.linalg.vector_norm(b.reshape(-1)).item()
    return diff / norm if norm else diff


def within_tolerance(spec: GraphSpec, error: float) -> bool:
    """True when ``error`` is a number no larger than the dtype's tolerance
    (False for NaN and inf)."""
    return error <= TOLERANCE[spec.dtype]


def compared_rows(spec: GraphSpec, seq_len_q: Any = None, seq_len_kv: Any = None, device: Any = None) -> Any:
    """Boolean (batch, seq_q): the query rows whose output is defined.

    A row is left out when it is padding (at or past its sequence's valid
    length) or when the mask leaves it no key at all (bottom-right alignment
    with more queries than keys, a window past the valid keys): cuDNN
    promises nothing there (NaN included), the reference writes zeros.
    """
    import torch

    rows = []
    shared = None
    for b in range(spec.batch):
        lq = None if seq_len_q is None else int(seq_len_q.reshape(-1)[b])
        lkv = None if seq_len_kv is None else int(seq_len_kv.reshape(-1)[b])
        if lq is None and lkv is None and shared is not None:
            rows.append(shared)
            continue
        keep = allowed_mask(spec, lq, lkv, device=device).any(dim=1)
        if lq is not None:
            keep = keep & (torch.arange(spec.seq_q, device=device) < lq)
        if lq is None and lkv is None:
            shared = keep
        rows.append(keep)
    return torch.stack(rows)


def valid_rows(spec: GraphSpec, tensor: Any, seq_len_q: Any = None, seq_len_kv: Any = None) -> Any:
    """``tensor`` (an output in the spec's layout) with the rows
    ``compared_rows`` leaves out set to zero, whatever they held (NaN
    included), so that a comparison looks only at defined rows, on both sides.
    """
    import torch

    keep = compared_rows(spec, seq_len_q, seq_len_kv, device=tensor.device)  # (b, s)
    if bool(keep.all()):
        return tensor
    keep = keep.view(spec.batch, 1, spec.seq_q, 1) if spec.layout == "bhsd" else keep.view(spec.batch, spec.seq_q, 1, 1)
    return torch.where(keep, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device))


def reference_error(spec: GraphSpec, out: Any, inputs: dict[str, Any]) -> float:
    """Relative error of ``out`` against the float32 reference on ``inputs``
    (from ``random_inputs``), over the defined query rows only (``compared_rows``)."""
    return reference_errors(spec, out, inputs)[0]


def reference_errors(
    spec: GraphSpec, out: Any, inputs: dict[str, Any], stats: Any = None
) -> tuple[float, float | None]:
    """``(output error, stats error or None)`` against one reference run:
    ``reference_error``, and with ``stats`` (b, h, s, 1) the largest
    per-element log-sum-exp difference over the same rows
    (``varlen_check.lse_difference``, the ragged check's measure; inf for NaN)."""
    from graphcache.compilers.varlen_check import lse_difference

    ref, ref_stats = reference(spec, **inputs)
    lengths = inputs.get("seq_len_q"), inputs.get("seq_len_kv")
    error = relative_error(valid_rows(spec, out, *lengths), valid_rows(spec, ref, *lengths))
    if stats is None:
        return error, None
    keep = compared_rows(spec, *lengths, device=stats.device).view(spec.batch, 1, spec.seq_q, 1)
    keep = keep.expand(spec.batch, spec.heads_q, spec.seq_q, 1)  # rows with no key hold -inf on both sides
    return error, lse_difference(stats[keep], ref_stats.to(stats.device)[keep])


def random_inputs(spec: GraphSpec, device: str, seed: int = 0) -> dict[str, Any]:
    """Fresh random q, k, v (never zeros) and, with padding, valid lengths."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch_dtype(spec)
    inputs = {
        role: torch.randn(spec.storage_shape(role), generator=gen, device=device, dtype=torch.float32)
        .mul_(0.5)
        .to(dtype)
        for role in ("q", "k", "v")
    }
    if spec.padding:
        assert spec.seq_kv is not None
        for role, full in (("seq_len_q", spec.seq_q), ("seq_len_kv", spec.seq_kv)):
            # valid lengths between half and all of the padded length
            inputs[role] = torch.randint(
                max(1, full // 2), full + 1, (spec.batch, 1, 1, 1), generator=gen, device=device, dtype=torch.int32
            )
    return inputs


def check_inputs(
    spec: GraphSpec,
    tensors: dict[str, Any],
    device_type: str | None = None,
) -> None:
    """Raise ExecutionError unless every tensor has the spec's shape, dtype,
    device and a packed layout. ``tensors`` maps roles to tensors (None = absent)."""
    import torch

    if spec.layout == "thd":
        raise ExecutionError(
            f"{spec.summary()} is a ragged/paged graph: run it with run_varlen(q, k, v, cu_seq_q, cu_seq_k, "
            "seqused_k, block_table), as graphcache.torch.varlen_attn does, not execute()"
        )
    want_dtype = torch_dtype(spec)
    device = None
    for role in ("q", "k", "v", "o"):
        t = tensors.get(role)
        if t is None:
            if role == "o":
                continue
            raise ExecutionError(f"{role} is missing")
        _check_tensor(spec, role, t, spec.storage_shape(role), want_dtype)
        if device is None:
            device = t.device
        elif t.device != device:
            raise ExecutionError(f"{role} is on {t.device} but q is on {device}: put all on one device")
    assert device is not None
    if device_type is not None and device.type != device_type:
        raise ExecutionError(f"q is on {device}; this graph runs on {device_type}: move the tensors")
    for role in ("seq_len_q", "seq_len_kv"):
        t = tensors.get(role)
        if spec.padding and t is None:
            raise ExecutionError(
                f"{role} is missing: the spec has padding=true, pass {role} (int32, ({spec.batch}, 1, 1, 1))"
            )
        if not spec.padding and t is not None:
            raise ExecutionError(f"{role} was given but the spec has padding=false")
        if t is not None:
            _check_tensor(spec, role, t, (spec.batch, 1, 1, 1), torch.int32)
            if t.device != device:
                raise ExecutionError(f"{role} is on {t.device} but q is on {device}")


def _check_tensor(spec: GraphSpec, role: str, t: Any, shape: tuple[int, ...], dtype: Any) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ExecutionError(f"{role} has shape {tuple(t.shape)}; the spec ({spec.summary()}) needs {tuple(shape)}")
    if t.dtype != dtype:
        raise ExecutionError(f"{role} is {t.dtype}; the spec needs {dtype}")
    if not t.is_contiguous():
        raise ExecutionError(
            f"{role} has strides {tuple(t.stride())}; pass a contiguous tensor in the "
            f"spec's layout {spec.layout} (call .contiguous())"
        )


class TorchSdpaGraph:
    """The fallback: torch's scaled_dot_product_attention with the spec's
    exact semantics, for machines where cuDNN cannot serve a spec.

    Causal top-left goes through ``is_causal``; every other mask, and padding,
    through an explicit boolean mask. Stats come from the float32 reference.
    For a class spec, ``execute`` takes real tensors of any shape the class
    covers (ExecutionError for one outside it), as a cuDNN class graph does.
    """

    backend = "torch"

    def __init__(self, spec: GraphSpec, reason: str = "") -> None:
        try:
            import torch  # noqa: F401 - here, so that a host without torch fails at load, not at execute
        except ImportError:
            why = f" ({reason})" if reason else ""
            raise NoGpu(
                f"cuDNN cannot serve {spec.summary()} here{why}, and the torch fallback needs torch, "
                "which is not installed: pip install 'graphcache[gpu]'"
            ) from None
        self.spec = spec
        self.reason = reason
        self.workspace_size = 0
        if reason:
            log.warning("serving %s with torch SDPA instead of cuDNN: %s", spec.summary(), reason)

    def execute(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
    ) -> Any:
        import torch

        # A class graph runs at the real tensors' shape (any its class covers).
        spec = real_spec(self.spec, q, k) if self.spec.is_class else self.spec
        check_inputs(spec, {"q": q, "k": k, "v": v, "o": out, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv})
        qb, kb, vb = (to_bhsd(spec, t) for t in (q, k, v))
        group = spec.heads_q // (spec.heads_kv or spec.heads_q)
        if group > 1:
            kb = kb.repeat_interleave(group, dim=1)
            vb = vb.repeat_interleave(group, dim=1)
        kwargs: dict[str, Any] = {"scale": spec.attn_scale, "dropout_p": spec.dropout}
        if spec.mask == "causal" and not spec.padding:
            kwargs["is_causal"] = True
        elif spec.mask != "none" or spec.padding:
            masks = [
                allowed_mask(
                    spec,
                    None if seq_len_q is None else int(seq_len_q.reshape(-1)[b]),
                    None if seq_len_kv is None else int(seq_len_kv.reshape(-1)[b]),
                    device=q.device,
                )
                for b in range(spec.batch)
            ]
            kwargs["attn_mask"] = torch.stack(masks).unsqueeze(1)
        # torch's own op, not the module attribute: graphcache.torch.patch()
        # routes F.scaled_dot_product_attention back through graphcache.
        result = torch._C._nn.scaled_dot_product_attention(qb, kb, vb, **kwargs).nan_to_num(0.0)
        if seq_len_q is not None:
            rows = torch.arange(spec.seq_q, device=q.device).view(1, 1, -1, 1)
            result = result * (rows < seq_len_q.reshape(-1, 1, 1, 1))
        o = from_bhsd(spec, result)
        if out is not None:
            out.copy_(o)
            o = out
        if spec.generate_stats:
            _, stats = reference(spec, q, k, v, seq_len_q, seq_len_kv)
            return o, stats
        return o

    def run_varlen(
        self, q: Any, k: Any, v: Any, cu_seq_q: Any, cu_seq_k: Any, seqused_k: Any = None, block_table: Any = None
    ) -> tuple[Any, Any]:
        """A thd (ragged / paged) spec's call with ``varlen_attn``'s tensors:
        ``(out, lse or None)`` from the float32 reference
        (``graphcache.compilers.varlen_ref.run_spec``, which says what it raises)."""
        from graphcache.compilers.varlen_ref import run_spec

        return run_spec(self.spec, q, k, v, cu_seq_q, cu_seq_k, seqused_k, block_table)

    def run_views(self, q: Any, k: Any, v: Any) -> Any:
        """(b, h, s, d) views of tensors in the spec's layout, as torch's SDPA
        takes them; returns the output the same way. For specs without
        padding, stats or dropout; inputs are checked as ``execute`` checks them."""
        return _run_views(self, q, k, v)


def _run_views(graph: Any, q: Any, k: Any, v: Any) -> Any:
    """``run_views`` for a graph whose ``execute`` takes tensors in the spec's
    storage layout: the (b, h, s, d) views torch's SDPA takes, in and out."""
    spec = graph.spec
    if spec.layout == "bshd":
        return graph.execute(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    return graph.execute(q, k, v)


def score_matrix_bytes(spec: GraphSpec) -> int:
    """Bytes of the float32 score matrix torch's math path must hold."""
    assert spec.seq_kv is not None
    return spec.batch * spec.heads_q * spec.seq_q * spec.seq_kv * 4
