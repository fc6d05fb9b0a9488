"""torch's own varlen kernel, ``torch_attn::_varlen_attn``, called the way
the installed torch takes it.

The op is private to torch and its arguments changed between releases
(read from each release's ``torch/nn/attention/varlen.py`` and the op's
schema, ``torch.ops.torch_attn._varlen_attn.default._schema``):

- torch 2.11: ``query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
  is_causal, scale, window_size`` (10). No ``enable_gqa`` (flash-attention
  takes fewer KV heads than query heads as they are), no ``seqused_k``, no
  paged KV; an H200 with torch 2.11 refused the 14 arguments 2.13 takes;
- torch 2.13 and 2.14: those and ``enable_gqa, seqused_k, block_table,
  num_splits`` (14); ``cu_seq_k`` may be None there;
- a torch without ``torch.nn.attention.varlen`` has no op at all.

``TorchVarlen`` reads the installed op's argument names once and passes
every argument by name. ``enable_gqa`` and ``num_splits`` are left out where
the op has no such argument: neither changes the answer (GQA by head counts;
a split-KV tuning knob). What a call needs that this torch lacks (the op
itself, ``seqused_k``, a ``block_table``) ``lacks`` names: the drop-in then
runs graphcache's float32 reference instead (graphcache.torch.varlen) and
the GPU tests skip, each saying which.
"""

from __future__ import annotations

from typing import Any

import torch

from graphcache.errors import UnsupportedCall

try:  # registers torch_attn::_varlen_attn
    import torch.nn.attention.varlen as MODULE
except ImportError:  # a torch before varlen_attn
    MODULE = None  # type: ignore[assignment]

# The arguments graphcache knows how to give, by the op's own names.
KNOWN = frozenset(
    {
        "query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "is_causal", "scale", "window_size",
        "enable_gqa", "seqused_k", "block_table", "num_splits",
    }
)  # fmt: skip
# Left out where the op has no such argument: the answer is the same without them.
_OPTIONAL = frozenset({"enable_gqa", "num_splits"})


class TorchVarlen:
    """torch's ``torch_attn::_varlen_attn`` (``op``; None where this torch
    has none, ``why_none`` saying so) with its argument names read from its
    schema."""

    def __init__(self, op: Any, why_none: str = "") -> None:
        self.op = op
        self.why_none = why_none
        arguments = op.default._schema.arguments if op is not None else ()
        self.names = frozenset(a.name for a in arguments)
        # A required argument graphcache cannot fill (a future torch): no call can be made.
        self.unknown = tuple(a.name for a in arguments if a.name not in KNOWN and not a.has_default_value())

    @classmethod
    def installed(cls) -> TorchVarlen:
        """The installed torch's op, or none with the reason."""
        where = f"torch {torch.__version__}"
        if MODULE is None:
            return cls(None, f"{where} has no torch.nn.attention.varlen (no varlen kernel of torch's to run)")
        op = getattr(torch.ops.torch_attn, "_varlen_attn", None)
        if op is None:
            return cls(None, f"{where} registers no torch_attn::_varlen_attn")
        return cls(op)

    def lacks(self, seqused_k: Any = None, block_table: Any = None) -> str | None:
        """Why this torch's op cannot take a call with these arguments (None
        where it can)."""
        if self.op is None:
            return self.why_none
        where = f"torch {torch.__version__}'s torch_attn::_varlen_attn"
        if self.unknown:
            return f"{where} requires {', '.join(self.unknown)}, which graphcache does not know how to give"
        if block_table is not None and "block_table" not in self.names:
            return f"{where} takes no block_table: no paged KV (torch 2.13 has it)"
        if seqused_k is not None and "seqused_k" not in self.names:
            return f"{where} takes no seqused_k (torch 2.13 has it)"
        return None

    def __call__(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cu_seq_q: torch.Tensor,
        cu_seq_k: torch.Tensor | None,
        max_q: int,
        max_k: int,
        *,
        scale: float | None = None,
        window_size: Any = (-1, -1),
        enable_gqa: bool = False,
        seqused_k: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
        num_splits: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, lse)`` from torch's kernel, as ``varlen_attn`` calls it
        (``is_causal`` where the window is (-1, 0)). Raises UnsupportedCall
        (reason ``torch_varlen``) with ``lacks``'s reason, and what the op
        raises."""
        why = self.lacks(seqused_k, block_table)
        if why is not None:
            raise UnsupportedCall(why, "torch_varlen")
        given: dict[str, Any] = dict(
            query=query, key=key, value=value, cu_seq_q=cu_seq_q, cu_seq_k=cu_seq_k, max_q=max_q, max_k=max_k,
            is_causal=tuple(window_size) == (-1, 0), scale=scale, window_size=list(window_size),
            enable_gqa=enable_gqa, seqused_k=seqused_k, block_table=block_table, num_splits=num_splits,
        )  # fmt: skip
        kwargs = {k: v for k, v in given.items() if k in self.names or (k not in _OPTIONAL and v is not None)}
        out, lse, _ = self.op(**kwargs)
        return out, lse
