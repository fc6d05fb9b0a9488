"""From a torch SDPA call to the GraphSpec it maps to, or why it cannot be one.

Layouts come from strides, never from a copy (``graphcache.spec.layouts``):
each of q, k and v gets the layout its strides say
(``graphcache.spec.layout_fits.read``), so a view of a fused projection
(timm's ViT, ModernBERT's v), a sequence-first tensor
(``nn.MultiheadAttention``) or a transposed projection beside a contiguous
KV cache (Hugging Face's prefill) is read where it lies. Only the strides
of dims larger than 1 decide (any stride is valid for a dim of size 1, and
cuDNN runs two calls that differ only there identically, so they share one
spec and one graph): where a tensor fits several layouts (dims of size 1),
k takes one q and v fit too (a call whose three tensors share a layout
keeps the spec it always had), q and v take k's, else one in k's order,
then bshd, bhsd, the rest (``graphcache.spec.layout_fits.choose``). What the size-1 batch and sequence
strides say is kept beside the spec (``Derived.wide``): the layout the same
producer's batch-4 call has, which ``record --max-batch`` widens a batch-1
call to. k and v expanded over heads with stride 0 (Falcon's and
gpt_bigcode's multi-query attention) are one real head: the spec has
``heads_kv=1`` and the graph reads the first head. A tensor no layout
expresses, or cuDNN does not take (a head dim that is not contiguous, a
broadcast dim, strides that alias), is copied once per call into a packed
layout, counted in ``stats()["copies"]`` by tensor and reason: never a fallback.

k and v that are views of the first rows of a longer allocation along the
sequence (a ``[+N]`` or ``[N]`` group before ``s``: Hugging Face's
``StaticCache`` prefill, which slices the cache to the prompt) are read in
place over the whole allocation (``Derived.rows``): the spec's ``seq_kv``
is the allocation's, with ``padding``, and the call's real lengths are the
padding mask's seq-len tensors, so the prefill and every decode step of a
static cache share its shape.

An ``attn_mask`` makes a bias spec (``graphcache.torch.bias``): the spec's
``bias`` says which dims the mask has, and the call's mask becomes the
graph's additive bias on the device. A masked GQA decode step whose query
heads transformers packed into rows is the decode spec it came from
(``graphcache.torch.bias.rows_are_heads``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from graphcache.errors import SpecError, UnsupportedCall
from graphcache.spec import DTYPES, GraphSpec, layout_fits
from graphcache.spec import layouts as spec_layouts
from graphcache.torch.core.bias import BiasFrom, bias_from, rows_are_heads

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class Derived:
    """A call's spec, the tensors copied per call into the layout the spec
    gives them (``(role, layout, reason)``), how its attn_mask becomes the
    graph's bias (None: no mask), whether k and v are expanded over heads
    (stride 0: the graph reads their first head), the layouts a larger
    call of its producer has (``wide``), and ``rows``: where k and v are
    views of the first rows of a longer allocation, its rows (the spec's
    ``seq_kv``; the graph reads the whole allocation, the call's lengths
    given as its padding), else 0."""

    spec: GraphSpec
    copies: tuple[tuple[str, str, str], ...] = ()
    bias: BiasFrom | None = None
    expanded: bool = False
    # The layouts a larger call of the same producer has, where the size-1 dims' strides say other
    # than the spec's (None: the same): what record --max-batch / --max-seq widen the call to.
    wide: dict[str, str] | None = None
    rows: int = 0


def packed(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` as a (b, h, s, d) view of a copy packed in ``layout``'s order
    (one copy; ``layout`` may carry a group, which the copy leaves out)."""
    found = spec_layouts.parse(layout)
    return t.permute(found.to_storage).contiguous().permute(found.to_bhsd)


def layouts_of(t: torch.Tensor) -> tuple[str, ...]:
    """The named layouts (bshd, bhsd) a 4-D (b, h, s, d) tensor is packed in:
    one, both (when size-1 dims make them the same), or neither."""
    try:
        fits = {f.text for f in layout_fits.read(tuple(t.shape), tuple(t.stride()))}
    except layout_fits.NoLayout:
        return ()
    return tuple(name for name in spec_layouts.NAMED if name in fits)


# Where a copied tensor goes: the packed order of the first of these that is read where it lies.
_COPY_INTO = {"k": ("v", "q"), "v": ("k", "q"), "q": ("k", "v")}


def choose(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[dict[str, str], tuple[tuple[str, str, str], ...], dict[str, str]]:
    """Each tensor's layout (``graphcache.spec.layout_fits.choose``: from its
    dims of size > 1 alone), the copies (``(role, layout, reason)`` for each
    tensor no layout of a graph reads), and the layouts the size-1 batch and
    sequence strides say, which a larger call of the same producer has (the
    hint ``record`` widens from; the same dict where they agree)."""
    fits: dict[str, tuple[layout_fits.Fit, ...]] = {}
    reasons: dict[str, str] = {}
    for role, t in (("q", q), ("k", k), ("v", v)):
        try:
            fits[role] = layout_fits.read(tuple(t.shape), tuple(t.stride()))
        except layout_fits.NoLayout as exc:
            reasons[role] = exc.reason
    chosen = layout_fits.choose(fits)
    hinted = layout_fits.choose(fits, hint=True)
    copies = []
    for role in ("k", "v", "q"):
        if role in reasons:
            for found in (chosen, hinted):
                into = next((spec_layouts.parse(found[r]).packed for r in _COPY_INTO[role] if r in found), "bhsd")
                found[role] = into
            copies.append((role, chosen[role], reasons[role]))
    return chosen, tuple(copies), hinted


def derive(
    query: Any,
    key: Any,
    value: Any,
    *,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    dtype: str | None = None,
    prefix: bool = False,
) -> Derived:
    """The spec of one call. ``dtype`` overrides the tensors' dtype (to record,
    on a float32 CPU run, the specs a bfloat16 GPU run will make). With
    ``prefix``, k and v that are the first rows of a longer allocation are
    read over all of it (``Derived.rows``; the caller's plan must widen them:
    the drop-in's does).

    Raises UnsupportedCall (an UnsupportedSpec) with the reason.
    """
    tensors = (("query", query), ("key", key), ("value", value))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise UnsupportedCall(reason="invalid", message=f"{name} is a {type(t).__name__}, not a torch.Tensor")
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            raise UnsupportedCall(
                reason="tensor_subclass", message=f"{name} is a {type(t).__name__}; cuDNN graphs take plain tensors"
            )
        if t.is_nested:
            raise UnsupportedCall(
                reason="nested", message=f"{name} is a nested tensor; cuDNN graphs take dense 4-D tensors"
            )
        if t.dim() != 4:
            raise UnsupportedCall(
                reason="not_4d",
                message=f"{name} is {t.dim()}-D {tuple(t.shape)}; a cuDNN graph takes 4-D (batch, heads, seq, head_dim) tensors",
            )
    for name, t in tensors:
        if t.numel() == 0:  # torch answers it (an empty tensor, or zeros over no keys): nothing to build
            raise UnsupportedCall(
                reason="empty",
                message=f"{name} {tuple(t.shape)} has no elements: torch's SDPA answers an empty call; "
                "no graph is built for it",
            )
    if not (query.dtype == key.dtype == value.dtype):
        raise UnsupportedCall(
            reason="invalid",
            message=f"query, key and value differ in dtype ({query.dtype}, {key.dtype}, {value.dtype})",
        )
    if not (query.device == key.device == value.device):
        raise UnsupportedCall(
            reason="invalid",
            message=f"query, key and value are on different devices ({query.device}, {key.device}, {value.device})",
        )
    b, hq, sq, d = query.shape
    bk, hk, skv, dk = key.shape
    bv, hv, sv, dv = value.shape
    if not (b == bk == bv) or hk != hv or skv != sv or dk != d:
        raise UnsupportedCall(
            reason="invalid",
            message=f"shapes do not fit together: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)} "
            "(batch must match; key and value must agree in heads and seq; key's head_dim must be query's)",
        )
    expanded = hk > 1 and key.stride(1) == 0 and value.stride(1) == 0
    if expanded:  # k/v expanded over heads with stride 0 (Falcon, gpt_bigcode): one real head, MQA
        key, value, hk = key[:, :1], value[:, :1], 1
    # One key/value head broadcasts over the query heads without enable_gqa
    # (torch broadcasts the head dim; Falcon's multi-query attention): MQA.
    if hk != hq and not (enable_gqa and hq % hk == 0) and hk != 1:
        raise UnsupportedCall(
            reason="invalid",
            message=f"query has {hq} heads and key/value {hk}: pass enable_gqa=True with key/value heads dividing query heads",
        )
    bias = None
    if attn_mask is not None:
        if is_causal:
            raise UnsupportedCall(
                reason="mask", message="attn_mask with is_causal=True, which torch refuses: pass one of the two"
            )
        bias = bias_from(attn_mask, b, hq, sq, skv, query)  # UnsupportedCall for a mask no bias spec expresses
        if rows_are_heads(attn_mask, bias, query, hk):  # a GQA decode step, its heads packed into rows
            hq, sq = hq * sq, 1
            query = query.reshape(b, hq, 1, d)
            bias = bias_from(attn_mask, b, hq, sq, skv, query, rows=bias.dims[2])
    if dtype is None:
        found = _DTYPE_NAMES.get(query.dtype)
        if found is None:
            raise UnsupportedCall(
                reason="dtype",
                message=f"dtype {query.dtype} is not a cuDNN fused-attention dtype: use float16 or bfloat16 "
                "(model.to(torch.bfloat16)), or record with dtype='bfloat16' (graphcache record --dtype bfloat16)",
            )
        name = found
    elif dtype in DTYPES:
        name = dtype
    else:
        raise SpecError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPES)}", "dtype")
    chosen, copies, hinted = choose(query, key, value)
    mask = "causal" if is_causal else "none"
    rows = prefix_rows(chosen, skv) if prefix and bias is None and not expanded and not dropout_p else 0
    if rows:  # read over the whole allocation; the call's lengths are the padding's
        chosen = {**chosen, "k": spec_layouts.parse(chosen["k"]).packed, "v": spec_layouts.parse(chosen["v"]).packed}
        # Bottom-right where queries and keys are as many: the same mask as top-left, and the one a static
        # cache's later calls (graphcache.hf's lengths) need, so the prefill's graph is theirs too.
        mask = "causal_bottom_right" if is_causal and sq == skv else mask
    try:
        spec = GraphSpec(
            batch=b,
            heads_q=hq,
            heads_kv=hk,
            seq_q=sq,
            seq_kv=rows or skv,
            head_dim=d,
            head_dim_v=dv,
            dtype=name,
            layout=chosen["k"],
            layout_q=chosen["q"],
            layout_v=chosen["v"],
            mask=mask,
            attn_scale=_scale(scale, d),
            dropout=dropout_p,
            bias=None if bias is None else bias.kind,
            bias_dtype=None if bias is None else bias.bias_dtype,
            padding=bool(rows),
        )
    except SpecError as exc:
        raise UnsupportedCall(str(exc), exc.field or "spec") from exc
    wide = None
    if hinted != chosen and not rows:
        wide = {"layout": hinted["k"], "layout_q": hinted["q"], "layout_v": hinted["v"]}
    return Derived(spec, copies, bias, expanded, wide, rows)


def prefix_rows(chosen: dict[str, str], seq_kv: int) -> int:
    """The rows of the allocation k and v are the first ``seq_kv`` rows of,
    where both layouts say so alike (a group ``[+N]`` or ``[N]`` just before
    ``s``: a static cache sliced to the prompt), else 0."""
    if chosen["k"] != chosen["v"]:
        return 0
    found = spec_layouts.parse(chosen["k"])
    if found.gap is None or found.order[found.gap] != "s":
        return 0
    return seq_kv + found.n if found.kind == "+" else seq_kv * found.n


def widen(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` (b, h, s, d), a view of the first s rows of an allocation of
    ``rows`` along s, as the view of all of them (no copy). Raises
    RuntimeError where the storage does not hold them (as_strided checks)."""
    b, h, _, d = t.shape
    return t.as_strided((b, h, rows, d), t.stride(), t.storage_offset())


def derive_args(args: tuple[Any, ...], dtype: str | None = None) -> Derived:
    """``derive`` of a call's arguments as the runtime holds them:
    (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)."""
    query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa = args
    return derive(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
        dtype=dtype,
        prefix=True,
    )


def _scale(scale: float | None, head_dim: int) -> float | None:
    """None (the spec default, 1/sqrt(head_dim)) for torch's default scale and
    for an explicit one equal to it up to rounding: models pass head_dim**-0.5,
    which must map to the same key as no scale at all."""
    if scale is None:
        return None
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        default = 1.0 / math.sqrt(head_dim)
        if math.isclose(scale, default, rel_tol=1e-12, abs_tol=0.0):
            return None
    return scale


def spec_for(
    query: Any,
    key: Any,
    value: Any,
    *,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> GraphSpec:
    """The GraphSpec a ``scaled_dot_product_attention`` call maps to.

    Raises UnsupportedSpec naming why the call cannot be a cuDNN graph (an
    attn_mask no bias spec expresses, float32, a head dim cuDNN does not take, not 4-D,
    ...). Strides no layout expresses are copied, not refused (``derive``'s copies).
    """
    return derive(
        query,
        key,
        value,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
        prefix=True,
    ).spec
