"""From a torch SDPA call to the GraphSpec it maps to, or why it cannot be one.

Layout comes from strides, never from a copy: a (b, h, s, d) view of a
contiguous (b, s, h, d) tensor is ``bshd``, a contiguous (b, h, s, d) one
``bhsd``; strides of size-1 dims do not count (torch ignores them too).
``key`` and ``value`` decide the layout. Where ``query`` alone is in another
layout (Hugging Face models at prefill: q is a transposed projection, the KV
cache a contiguous tensor) the spec takes k/v's layout and the drop-in copies
q into it: q is the smallest of the three and the copy is one elementwise pass.

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
from graphcache.spec import DTYPES, GraphSpec
from graphcache.torch.bias import BiasFrom, bias_from, rows_are_heads

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclass(frozen=True)
class Derived:
    """A call's spec, whether q (and k and v) must be copied into the spec's
    layout, and how its attn_mask becomes the graph's bias (None: no mask)."""

    spec: GraphSpec
    copy_q: bool
    bias: BiasFrom | None = None
    copy_kv: bool = False  # k and v are not one packed layout (views of a fused qkv projection)


def packed(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` as a (b, h, s, d) view of a tensor packed in ``layout`` (itself
    where it is one already: no copy)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2) if layout == "bshd" else t.contiguous()


def layouts_of(t: torch.Tensor) -> tuple[str, ...]:
    """The layouts a 4-D (b, h, s, d) tensor is packed in: ('bshd',), ('bhsd',),
    both (when size-1 dims make them the same), or neither."""
    found = []
    if t.transpose(1, 2).is_contiguous():
        found.append("bshd")
    if t.is_contiguous():
        found.append("bhsd")
    return tuple(found)


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
) -> Derived:
    """The spec of one call. ``dtype`` overrides the tensors' dtype (to record,
    on a float32 CPU run, the specs a bfloat16 GPU run will make).

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
    kv = set(layouts_of(key)) & set(layouts_of(value))
    copy_kv = not kv and bool(layouts_of(key) or layouts_of(value))
    if copy_kv:
        # One of k and v is a view of a fused projection (ModernBERT's qkv), the
        # other packed: the graph takes both in the packed one's layout (a copy of the view).
        kv = set(layouts_of(key) or layouts_of(value))
    if not kv:
        raise UnsupportedCall(
            reason="layout",
            message=f"key strides {tuple(key.stride())} and value strides {tuple(value.stride())} are not one packed "
            "layout: a graph takes (b, h, s, d) views of contiguous (b, s, h, d) tensors (bshd) or contiguous "
            "(b, h, s, d) ones (bhsd); .contiguous() gives bhsd",
        )
    q_layouts = layouts_of(query)
    common = [lay for lay in ("bshd", "bhsd") if lay in kv and lay in q_layouts]
    layout = common[0] if common else ("bshd" if "bshd" in kv else "bhsd")
    try:
        spec = GraphSpec(
            batch=b,
            heads_q=hq,
            heads_kv=hk,
            seq_q=sq,
            seq_kv=skv,
            head_dim=d,
            head_dim_v=dv,
            dtype=name,
            layout=layout,
            mask="causal" if is_causal else "none",
            attn_scale=_scale(scale, d),
            dropout=dropout_p,
            bias=None if bias is None else bias.kind,
            bias_dtype=None if bias is None else bias.bias_dtype,
        )
    except SpecError as exc:
        raise UnsupportedCall(str(exc), exc.field or "spec") from exc
    return Derived(spec, copy_q=not common, bias=bias, copy_kv=copy_kv)


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
    strides no layout expresses, ...).
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
    ).spec
