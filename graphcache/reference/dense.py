"""The float32 reference of a dense (bshd / bhsd) spec: SDPA by plain
matrix products, with one definition of every mask, which the torch fallback
graph (``compilers/torch_sdpa.py``) shares, so a causal spec can never come
back unmasked from either; the query rows a comparison looks at; the seeded
random inputs checks and benchmarks draw.

torch is imported inside each function: importing this module needs neither
torch nor cudnn, and it imports no compiler.
"""

from __future__ import annotations

from typing import Any

from graphcache.reference.measure import lse_difference, relative_error
from graphcache.spec import GraphSpec
from graphcache.spec import layouts as spec_layouts


def torch_dtype(spec: GraphSpec) -> Any:
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[spec.dtype]


def bias_dtype(spec: GraphSpec) -> Any:
    """The torch dtype of a bias spec's bias tensor: float32 where its
    ``bias_dtype`` says so, else the io dtype (graphcache.spec.bias)."""
    import torch

    return torch.float32 if spec.bias_dtype == "float32" else torch_dtype(spec)


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


def to_bhsd(spec: GraphSpec, tensor: Any, role: str = "k") -> Any:
    """A (b, h, s, d) view of a q/k/v/o tensor stored in its layout (``role``'s;
    k's, the spec's ``layout``, by default)."""
    return tensor.permute(spec_layouts.layout(spec, role).to_bhsd)


def from_bhsd(spec: GraphSpec, tensor: Any, role: str = "o") -> Any:
    """A (b, h, s, d) tensor stored (copied) in the packed order of ``role``'s layout (o's by default)."""
    return tensor.permute(spec_layouts.layout(spec, role).to_storage).contiguous()


def in_layout(spec: GraphSpec, role: str, values: Any, poisoned: bool = False) -> Any:
    """``values`` (a tensor of the role's ``storage_shape``) placed in a
    buffer with the strides of the role's layout (a fused projection's view
    where it is grouped, at the role's own slot); ``values`` itself where the
    layout is packed. ``poisoned``: in a NaN-filled buffer laid out for one
    more batch element and 64 more query and key rows (a longer call's
    strides), so a plan that reads or writes past the real extent shows as
    non-finite output (the class graphs' build-time check)."""
    import torch

    big = spec
    if poisoned:
        big = spec.replace(batch=spec.batch + 1, seq_q=spec.seq_q + 64, seq_kv=(spec.seq_kv or spec.seq_q) + 64)
    elif spec_layouts.layout(spec, role).gap is None:
        return values
    size, fill = spec_layouts.extent(big, role), float("nan") if poisoned else 0.0
    buffer = torch.full((size,), fill, dtype=values.dtype, device=values.device)
    view = buffer.as_strided(
        spec.storage_shape(role), spec_layouts.storage_strides(big, role), spec_layouts.slot(big, role)
    )
    return view.copy_(values)


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
    bias: Any = None,
    *,
    sink: Any = None,
    budget: int = REFERENCE_BUDGET,
) -> tuple[Any, Any]:
    """SDPA computed in float32 by plain matrix products (torch's math path),
    a batch element and a group of heads at a time (at most ``budget``
    bytes of scores, and at least one head, at once).

    Returns ``(out, stats)``: out in the spec's storage layout (float32), and
    the log-sum-exp per query row (b, h, s, 1). ``bias`` (a bias spec's
    additive (b|1, h|1, s_q, s_kv) tensor) is added to the scaled scores.
    Rows with no allowed key (the mask's, or -inf bias on every key) and
    padded query rows are zero, as torch's SDPA answers them; a NaN or inf
    in the inputs is not hidden (a row it reaches is what the arithmetic
    makes of it: NaN, as torch's SDPA gives). ``sink`` (a
    sink spec's (1, h_q, 1, 1) logits) joins each row's softmax as one more
    column and is then dropped, as transformers' gpt-oss eager attention
    does; the stats then include it.
    """
    import torch

    assert spec.attn_scale is not None and spec.seq_kv is not None
    qb, kb, vb = (to_bhsd(spec, t, r) for r, t in (("q", q), ("k", k), ("v", v)))
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
            if bias is not None:
                scores += _bias_of(bias, b, heads).float()
            scores.masked_fill_(~allowed, float("-inf"))
            if sink is not None:  # one more column per row: the head's sink logit
                column = sink.reshape(-1)[heads.to(sink.device)].float().to(q.device).view(-1, 1, 1)
                scores = torch.cat([scores, column.expand(-1, spec.seq_q, 1)], dim=-1)
            row_lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # -inf where a row sees no key
            stats[b, heads] = row_lse
            # 0 where a row sees no key (torch's answer); a NaN or inf of the inputs stays what it makes
            probs = torch.softmax(scores, dim=-1).masked_fill_(torch.isneginf(row_lse), 0.0)
            if sink is not None:
                probs = probs[..., :-1]
            del scores
            out[b, heads] = torch.matmul(probs, vf)
            del probs
        if lq is not None:
            out[b, :, lq:] = 0.0
            stats[b, :, lq:] = 0.0
    return from_bhsd(spec, out), stats


def _bias_of(bias: Any, b: int, heads: Any) -> Any:
    """The (heads or 1, s_q, s_kv) part of a bias tensor for batch element ``b``."""
    one = bias[b if bias.shape[0] > 1 else 0]
    return one.index_select(0, heads.to(one.device)) if one.shape[0] > 1 else one


def compared_rows(
    spec: GraphSpec, seq_len_q: Any = None, seq_len_kv: Any = None, device: Any = None, bias: Any = None
) -> Any:
    """Boolean (batch, seq_q): the query rows whose output is defined.

    A row is left out when it is padding (at or past its sequence's valid
    length) or when the mask leaves it no key at all (bottom-right alignment
    with more queries than keys, a window past the valid keys, a ``bias``
    of -inf on every key the mask allows, in any head): cuDNN promises
    nothing there (NaN included), the reference writes zeros (and the
    drop-in, torch's answer, zeros too).
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
        allowed = allowed_mask(spec, lq, lkv, device=device)
        if bias is None:
            keep = allowed.any(dim=1)
        else:  # every head must see a key: (h|1, s_q, s_kv) -> (s_q,)
            seen = (bias[b if bias.shape[0] > 1 else 0].to(device) != float("-inf")) & allowed
            keep = seen.any(dim=-1).all(dim=0)
        if lq is not None:
            keep = keep & (torch.arange(spec.seq_q, device=device) < lq)
        if lq is None and lkv is None and bias is None:
            shared = keep
        rows.append(keep)
    return torch.stack(rows)


def valid_rows(spec: GraphSpec, tensor: Any, seq_len_q: Any = None, seq_len_kv: Any = None, bias: Any = None) -> Any:
    """``tensor`` (an output in the spec's layout) with the rows
    ``compared_rows`` leaves out set to zero, whatever they held (NaN
    included), so that a comparison looks only at defined rows, on both sides.
    """
    import torch

    keep = compared_rows(spec, seq_len_q, seq_len_kv, device=tensor.device, bias=bias)  # (b, s)
    if bool(keep.all()):
        return tensor
    keep = keep.view(spec.batch, 1, spec.seq_q, 1).permute(spec_layouts.layout(spec, "o").to_storage)
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
    (``measure.lse_difference``, the ragged check's measure; inf for NaN)."""
    ref, ref_stats = reference(spec, **inputs)
    lengths, bias = (inputs.get("seq_len_q"), inputs.get("seq_len_kv")), inputs.get("bias")
    error = relative_error(valid_rows(spec, out, *lengths, bias=bias), valid_rows(spec, ref, *lengths, bias=bias))
    if stats is None:
        return error, None
    keep = compared_rows(spec, *lengths, device=stats.device, bias=bias).view(spec.batch, 1, spec.seq_q, 1)
    keep = keep.expand(spec.batch, spec.heads_q, spec.seq_q, 1)  # rows with no key hold -inf on both sides
    return error, lse_difference(stats[keep], ref_stats.to(stats.device)[keep])


def random_inputs(spec: GraphSpec, device: str, seed: int = 0) -> dict[str, Any]:
    """Fresh random q, k, v (never zeros), with padding valid lengths,
    with a bias spec a random bias (``random_bias``), with a sink spec
    random sink logits."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch_dtype(spec)
    inputs = {
        role: in_layout(
            spec,
            role,
            torch.randn(spec.storage_shape(role), generator=gen, device=device, dtype=torch.float32)
            .mul_(0.5)
            .to(dtype),
        )
        for role in ("q", "k", "v")
    }
    if spec.padding:
        assert spec.seq_kv is not None
        for role, full in (("seq_len_q", spec.seq_q), ("seq_len_kv", spec.seq_kv)):
            # valid lengths between half and all of the padded length
            inputs[role] = torch.randint(
                max(1, full // 2), full + 1, (spec.batch, 1, 1, 1), generator=gen, device=device, dtype=torch.int32
            )
    if spec.bias is not None:
        inputs["bias"] = random_bias(spec, gen, device)
    if spec.sinks:  # float32 logits of either sign, some above the scores
        inputs["sink"] = torch.randn(spec.dims("sink"), generator=gen, device=device, dtype=torch.float32).mul_(2.0)
    return inputs


def random_bias(spec: GraphSpec, gen: Any, device: str) -> Any:
    """A bias spec's (b|1, h|1, s_q, s_kv) input in its dtype (``bias_dtype``): random values,
    about a fifth of the keys hidden (-inf), a query row that sees no key at
    all, and in the last batch element the leading keys hidden from every row
    (left padding: the whole first 64-key tile -inf where s_kv allows)."""
    import torch

    assert spec.seq_kv is not None
    dims = spec.dims("bias")
    bias = torch.randn(dims, generator=gen, device=device, dtype=torch.float32)
    bias.masked_fill_(torch.rand(dims, generator=gen, device=device) < 0.2, float("-inf"))
    bias[0, 0, min(3, spec.seq_q - 1)] = float("-inf")
    bias[-1, :, :, : min(80, spec.seq_kv // 2)] = float("-inf")
    return bias.to(bias_dtype(spec))


def score_matrix_bytes(spec: GraphSpec) -> int:
    """Bytes of the float32 score matrix torch's math path must hold."""
    assert spec.seq_kv is not None
    return spec.batch * spec.heads_q * spec.seq_q * spec.seq_kv * 4
