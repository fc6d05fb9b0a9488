"""A call's ``attn_mask`` as a bias graph's input (the spec field ``bias``).

torch's SDPA takes a boolean mask (True: the query may see the key) or a
float one added to the scaled scores, of 2 to 4 dims that broadcast to
(batch, heads_q, s_q, s_kv); it raises for a 0-D or 1-D mask, and so does
the drop-in (such a call runs torch). A cuDNN graph takes an additive bias tensor of
(batch or 1, heads or 1, s_q, s_kv) in the io dtype, or in float32
(``graphcache.spec.bias``, ``bias_dtype``). ``bias_from`` says, once per
call shape, whether a mask fits such a graph and how to turn it into one;
``BiasFrom`` does it per call, on the mask's device: a boolean mask becomes
0 / -inf in the io dtype (one ``torch.where``, exact), a float mask in the
io dtype or in float32 (with 16-bit q, a ``bias_dtype: float32`` spec: the
mask keeps its precision, as torch's SDPA adds it) with packed strides is
passed as it is, anything else is expanded into a packed tensor. Nothing
reads a tensor's value on the host.

Rows that see no key at all: torch's SDPA (2.5+, every backend's contract,
seen on CPU with 2.13) returns 0 for a query row whose mask hides every key,
boolean or all -inf, where a softmax over nothing would be NaN. ``BiasFrom``
also gives those rows (``hidden``, computed on the device) so that the
drop-in writes 0 there whatever the graph wrote.

Query rows as heads: transformers' sdpa hands a GQA model's masked decode
step over as (b, h_kv, n_rep, d) queries against (b, h_kv, s_kv, d) keys
(``pack_gqa``), the query heads of one token packed into rows. Where the
mask is shared by those rows and heads, the call is the decode step it came
from: ``rows`` says so, and ``fold`` / ``unfold`` turn the query into
(b, h_kv * n_rep, 1, d) and the output back, views only. Its spec is the
GQA decode spec (seq_q 1, decode's own classes) instead of a 4-query call
that rounds to a prefill class of 128 queries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from graphcache.errors import UnsupportedCall
from graphcache.spec import bias as spec_bias

_NEG_INF = float("-inf")


@dataclass(frozen=True)
class BiasFrom:
    """How one call shape's mask becomes the graph's bias: ``boolean`` masks
    become 0 / -inf; a float mask is ``copy``-ed (expanded, cast, packed) where
    it is not already the packed tensor the graph reads. ``lead`` is the
    number of leading size-1 dims that make the mask 4-D; ``dims`` the bias's,
    ``dtype`` its torch dtype (the io dtype, or float32 where the spec's
    ``bias_dtype`` is ``float32``)."""

    kind: str  # the spec's bias field: bhss, b1ss, 1hss, 11ss
    dims: tuple[int, int, int, int]
    dtype: torch.dtype
    boolean: bool
    copy: bool
    lead: int
    zero: torch.Tensor = field(compare=False)  # 0 in the io dtype on the call's device, made once
    rows: int = 1  # query rows folded into heads (transformers' pack_gqa), 1: none
    # -inf in the io dtype on the call's device, made once (a Python float is
    # wrapped into a new tensor on every call); None: torch.where's own.
    neg_inf: torch.Tensor | None = field(default=None, compare=False)
    expand: bool = True  # the 4-D mask is not already ``dims`` (an expand view per call otherwise)
    bias_dtype: str | None = None  # the spec's field: "float32" for a float32 mask with 16-bit q, else None

    def fold(self, q: torch.Tensor) -> torch.Tensor:
        """The graph's query: ``q`` itself, or its rows as heads (a view)."""
        return q if self.rows == 1 else q.reshape(q.shape[0], -1, 1, q.shape[-1])

    def unfold(self, out: torch.Tensor) -> torch.Tensor:
        """The call's output from the graph's (the inverse of ``fold``)."""
        return out if self.rows == 1 else out.reshape(out.shape[0], -1, self.rows, out.shape[-1])

    def __call__(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(bias, hidden)``: the packed (``dims``) bias in the io dtype, and
        a boolean tensor broadcastable to the output's (b, h, s_q, 1), True
        on query rows that see no key. Both computed on the mask's device."""
        m = mask[(None,) * self.lead] if self.lead else mask
        if self.boolean:
            hidden = m.any(-1, keepdim=True).logical_not_()
            bias = torch.where(
                m.expand(self.dims) if self.expand else m,
                self.zero,
                _NEG_INF if self.neg_inf is None else self.neg_inf,
            )
            if not bias.is_contiguous():  # strides, not values: no host sync
                bias = bias.contiguous()
            return bias, hidden
        hidden = m.amax(-1, keepdim=True) == _NEG_INF
        if self.copy:
            m = m.expand(self.dims).to(self.dtype, memory_format=torch.contiguous_format, copy=True)
        return m, hidden


def _packed(mask: torch.Tensor, dims: tuple[int, ...]) -> bool:
    """True when ``mask`` (4-D) is a packed tensor of ``dims``: the strides
    of a contiguous one, size-1 dims' strides not counting (as torch's own
    ``is_contiguous``)."""
    return tuple(mask.shape) == tuple(dims) and mask.is_contiguous()


def bias_from(
    mask: Any, batch: int, heads_q: int, seq_q: int, seq_kv: int, query: torch.Tensor, rows: int = 1
) -> BiasFrom:
    """How ``mask`` of a (batch, heads_q, seq_q, seq_kv) call with ``query``'s
    dtype and device becomes a bias graph's input.

    Raises UnsupportedCall with reason ``mask`` (a mask no bias spec
    expresses: not a plain tensor, more than 4 dims, a dim neither the
    call's nor 1, an integer dtype, a float dtype other than float32 or
    query's; ``rows``: see ``BiasFrom.rows``), ``invalid`` (a 0-D or 1-D
    mask, which torch's SDPA refuses; another device: the fallback raises
    torch's own error) or ``autograd`` (a mask that requires grad)."""
    if not isinstance(mask, torch.Tensor) or type(mask) not in (torch.Tensor, torch.nn.Parameter) or mask.is_nested:
        raise UnsupportedCall(
            reason="mask", message=f"attn_mask is a {type(mask).__name__}; a bias graph takes a plain tensor"
        )
    if mask.dim() < 2:  # torch 2.13 raises IndexError for these, every dtype: the fallback gives its error
        raise UnsupportedCall(
            reason="invalid", message=f"attn_mask is {mask.dim()}-D: torch's SDPA takes masks of 2 dims or more"
        )
    if mask.device != query.device:
        raise UnsupportedCall(reason="invalid", message=f"attn_mask is on {mask.device} and query on {query.device}")
    if mask.requires_grad and torch.is_grad_enabled():
        raise UnsupportedCall(reason="autograd", message="attn_mask requires grad: cuDNN graphs here are forward-only")
    boolean = mask.dtype == torch.bool
    if not boolean and mask.dtype not in (query.dtype, torch.float32):
        raise UnsupportedCall(
            reason="mask",
            message=f"attn_mask is {mask.dtype} with {query.dtype} query: a bias graph takes a boolean mask "
            "or a float one in query's dtype (or float32)",
        )
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape) if mask.dim() <= 4 else ()
    kind = None
    if shape and shape[2] in (1, seq_q) and shape[3] in (1, seq_kv):
        kind = spec_bias.of_shape(shape[0], shape[1], batch, heads_q)
    if kind is None:
        raise UnsupportedCall(
            reason="mask",
            message=f"attn_mask of shape {tuple(mask.shape)} does not broadcast to the call's "
            f"({batch}, {heads_q}, {seq_q}, {seq_kv}) with batch and heads each full or 1",
        )
    dims = (batch if kind[0] == "b" else 1, heads_q if kind[1] == "h" else 1, seq_q, seq_kv)
    lead = 4 - mask.dim()
    wide = mask.dtype == torch.float32 and query.dtype != torch.float32  # kept in float32, never rounded to q's
    dtype = torch.float32 if wide else query.dtype
    copy = not boolean and (mask.dtype != dtype or not _packed(mask[(None,) * lead], dims))
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    neg_inf = torch.full((), _NEG_INF, dtype=query.dtype, device=query.device)
    return BiasFrom(
        kind, dims, dtype, boolean, copy, lead, zero, rows, neg_inf, shape != dims, "float32" if wide else None
    )


# The most query rows taken for one decode step's heads (a GQA group: query heads per KV head).
FOLD_ROWS = 128


def rows_are_heads(mask: torch.Tensor, bias: BiasFrom, query: torch.Tensor, heads_kv: int) -> bool:
    """True for a call ``fold`` turns into the decode step it came from:
    as many query as KV heads, 2 to FOLD_ROWS query rows packed (b, h, s, d),
    and a mask shared by every head and every query row, so that each row
    sees the same keys and bias (pack_gqa passes the decode step's mask as it is)."""
    _, heads, rows, _ = query.shape
    shared = mask.shape[-2] == 1  # (bias_from refused masks of fewer than 2 dims)
    return shared and bias.dims[1] == 1 and heads == heads_kv and 1 < rows <= FOLD_ROWS and query.is_contiguous()
