"""From a ``torch.nn.attention.varlen.varlen_attn`` call to the thd
GraphSpec it maps to, or why it cannot be one (``UnsupportedCall``).

Sizes come from shapes and the call's ints, never from tensor values (no
host synchronisation): ``batch`` is ``cu_seq_q.shape[0] - 1``, ``seq_q`` /
``seq_kv`` are ``max_q`` / ``max_k``; with a block table, the pool and the
table's shape give ``page_size``, ``num_pages`` and ``pages_per_seq``, and
``seq_kv`` is the table's reach (the engine's configuration, not the
batch's longest sequence, so decode steps share a graph as sequences grow).

The window is flash-attention's (``window_size`` in varlen_attn):
negative bounds are unbounded, and a bound at or past ``max_k`` is
unbounded too (flash-attention's mha_varlen_fwd resets it to -1).
"""

from __future__ import annotations

from typing import Any

import torch

from graphcache.errors import SpecError, UnsupportedCall
from graphcache.spec import MAX_HEAD_DIM, GraphSpec
from graphcache.torch.core.derive import _DTYPE_NAMES, _scale

_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
_INDEX = (torch.int32, torch.int64)


def effective_window(window_size: Any, max_k: int) -> tuple[int, int]:
    """``(left, right)`` as flash-attention applies it: -1 for unbounded."""
    left, right = (int(x) for x in window_size)
    left = -1 if left < 0 or left >= max_k else left
    right = -1 if right < 0 or right >= max_k else right
    return left, right


def varlen_spec(
    query: Any,
    key: Any,
    value: Any,
    cu_seq_q: Any,
    cu_seq_k: Any,
    max_q: int,
    max_k: int,
    *,
    want_lse: bool = False,
    scale: float | None = None,
    window_size: Any = (-1, -1),
    enable_gqa: bool = False,
    seqused_k: Any = None,
    block_table: Any = None,
    num_splits: int | None = None,
    dtype: str | None = None,
) -> GraphSpec:
    """The exact thd spec of one varlen_attn call. ``dtype`` overrides the
    tensors' dtype (to record, on a float32 CPU run, what a GPU will run).

    Raises UnsupportedCall with the reason: ``empty`` (no token, head,
    head dim or sequence: torch answers it), ``num_splits`` (no cuDNN
    equivalent), ``dtype``, ``head_dim``, ``window`` (a left bound with no
    right bound), ``page_size`` (not a power of two), ``layout`` (not
    token-major with packed heads), ``tensor_subclass`` or ``invalid``.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if type(t) not in _PLAIN:
            reason = "tensor_subclass" if isinstance(t, torch.Tensor) else "invalid"
            raise UnsupportedCall(f"{name} is a {type(t).__name__}; cuDNN graphs take plain tensors", reason)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.numel() == 0:  # no token, no head or a head dim of 0: torch answers it, nothing is built
            raise UnsupportedCall(
                f"{name} {tuple(t.shape)} has no elements: torch's varlen_attn answers an empty call; "
                "no graph is built for it",
                "empty",
            )
    if isinstance(cu_seq_q, torch.Tensor) and cu_seq_q.dim() == 1 and cu_seq_q.shape[0] < 2:
        raise UnsupportedCall(f"cu_seq_q {tuple(cu_seq_q.shape)} names no sequence: an empty batch", "empty")
    if num_splits not in (None, 1):
        raise UnsupportedCall(f"num_splits={num_splits}: cuDNN has no split-KV setting (None or 1 only)", "num_splits")
    paged = block_table is not None
    if query.dim() != 3 or key.dim() != (4 if paged else 3) or value.dim() != key.dim():
        raise UnsupportedCall(
            f"query {tuple(query.shape)}, key {tuple(key.shape)}: varlen_attn takes (T, H, D) and, with a "
            "block_table, (pages, page_size, H, D) pools",
            "invalid",
        )
    for name, t in (("cu_seq_q", cu_seq_q), ("cu_seq_k", cu_seq_k), ("seqused_k", seqused_k)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INDEX):
            raise UnsupportedCall(f"{name} must be a 1-D int32/int64 tensor", "invalid")
    if paged and (seqused_k is None or block_table.dim() != 2 or block_table.dtype != torch.int32):
        raise UnsupportedCall("a block_table must be (N, pages) int32 and needs seqused_k", "invalid")
    if not paged and cu_seq_k is None:
        raise UnsupportedCall("cu_seq_k is None without a block_table", "invalid")
    dtype_name = dtype or _DTYPE_NAMES.get(query.dtype)
    if dtype_name is None or key.dtype != query.dtype or value.dtype != query.dtype:
        raise UnsupportedCall(f"dtype {query.dtype}: cuDNN graphs here take float16 or bfloat16", "dtype")
    d, dv = int(query.shape[-1]), int(value.shape[-1])
    if key.shape[-1] != d or any(x % 8 or x > MAX_HEAD_DIM for x in (d, dv)):
        raise UnsupportedCall(f"head_dim {d}/{dv}: cuDNN takes multiples of 8 up to {MAX_HEAD_DIM}", "head_dim")
    for tname, t in (("query", query), ("key", key), ("value", value)):
        h = t.shape[-2]
        if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1] or t.stride(-3) != h * t.shape[-1]:
            raise UnsupportedCall(f"{tname} strides {tuple(t.stride())}: not token-major with packed heads", "layout")
        if paged and tname != "query" and t.stride(0) != t.shape[1] * h * t.shape[-1]:
            raise UnsupportedCall(f"{tname} strides {tuple(t.stride())}: the page pool is not contiguous", "layout")
    left, right = effective_window(window_size, max_k)
    if left >= 0 and right < 0:
        raise UnsupportedCall(f"window_size {tuple(window_size)}: a left bound with no right bound", "window")
    mask: dict[str, Any] = {"mask": "none"}
    if (left, right) == (-1, 0):
        mask = {"mask": "causal_bottom_right"}
    elif (left, right) != (-1, -1):
        mask = {"mask": "sliding_window_bottom_right", "window_left": None if left < 0 else left, "window_right": right}
    heads_kv = int(key.shape[2] if paged else key.shape[1])
    fields: dict[str, Any] = dict(
        batch=int(cu_seq_q.shape[0]) - 1,
        heads_q=int(query.shape[1]),
        heads_kv=heads_kv,
        seq_q=int(max_q),
        seq_kv=max(1, int(max_k)),
        head_dim=d,
        head_dim_v=dv,
        dtype=dtype_name,
        layout="thd",
        # head_dim**-0.5 (what models pass) and 1/sqrt(d) are one scale, one key, as for dense calls.
        attn_scale=_scale(None if scale is None else float(scale), d),
        generate_stats=bool(want_lse),
        **mask,
    )
    if paged:
        width = int(block_table.shape[1])
        fields.update(page_size=int(key.shape[1]), num_pages=int(key.shape[0]), pages_per_seq=width)
        fields["seq_kv"] = width * int(key.shape[1])
    try:
        return GraphSpec(**fields)
    except SpecError as exc:
        reason = "page_size" if exc.field == "page_size" else "invalid"
        raise UnsupportedCall(f"no cuDNN graph: {exc}", reason) from None
