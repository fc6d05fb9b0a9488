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
  num_splits`` (14); ``cu_seq_k`` may be None there; the op itself picks
  cuDNN or flash-attention;
- torch 2.15: those and a last ``backend`` (15; an int, SDPBackend's value:
  1 flash-attention, 3 cuDNN; default flash). The op no longer picks:
  ``varlen_attn`` does, with ``torch.nn.attention.varlen._select_backend``
  (cuDNN first where the call qualifies for it, in the order and with the
  backends ``sdpa_kernel`` allows; a RuntimeError naming cuDNN's unmet
  constraints where only cuDNN is allowed);
- a torch without ``torch.nn.attention.varlen`` has no op at all.

``TorchVarlen`` reads the installed op's argument names once and passes
every argument by name. ``enable_gqa`` and ``num_splits`` are left out where
the op has no such argument: neither changes the answer (GQA by head counts;
a split-KV tuning knob). Where the op takes ``backend``, each call passes
the one torch's own ``varlen_attn`` would choose for it, by calling torch's
own selector (``select``); a torch whose selector graphcache cannot call as
2.15's is (renamed, other arguments) gets no ``backend``, so the op's
default, flash-attention, runs: the same answer. What a
call needs that this torch lacks (the op itself, ``seqused_k``, a
``block_table``) ``lacks`` names: the drop-in then runs graphcache's float32
reference instead (graphcache.torch.varlen) and the GPU tests skip, each
saying which.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
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
        "enable_gqa", "seqused_k", "block_table", "num_splits", "backend",
    }
)  # fmt: skip
# Left out where the op has no such argument: the answer is the same without them.
_OPTIONAL = frozenset({"enable_gqa", "num_splits"})
# What torch 2.15's varlen_attn gives its backend selector, by name (torch/nn/attention/varlen.py).
SELECT_ARGS = (
    "query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "window_size", "seqused_k", "block_table", "num_splits",
)  # fmt: skip


class TorchVarlen:
    """torch's ``torch_attn::_varlen_attn`` (``op``; None where this torch
    has none, ``why_none`` saying so) with its argument names read from its
    schema, and, where it takes a ``backend``, ``select``: torch's own choice
    of one for a call (None: the op's default)."""

    def __init__(self, op: Any, why_none: str = "", select: Callable[..., int] | None = None) -> None:
        self.op = op
        self.why_none = why_none
        arguments = op.default._schema.arguments if op is not None else ()
        self.names = frozenset(a.name for a in arguments)
        self.select = select if "backend" in self.names and takes_select_args(select) else None
        # A required argument graphcache cannot fill (a future torch): no call can be made.
        self.unknown = tuple(
            a.name
            for a in arguments
            if (a.name not in KNOWN or (a.name == "backend" and self.select is None)) and not a.has_default_value()
        )

    @classmethod
    def installed(cls) -> TorchVarlen:
        """The installed torch's op, or none with the reason."""
        where = f"torch {torch.__version__}"
        if MODULE is None:
            return cls(None, f"{where} has no torch.nn.attention.varlen (no varlen kernel of torch's to run)")
        op = getattr(torch.ops.torch_attn, "_varlen_attn", None)
        if op is None:
            return cls(None, f"{where} registers no torch_attn::_varlen_attn")
        return cls(op, select=getattr(MODULE, "_select_backend", None))

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
        if self.select is not None:
            # As torch's varlen_attn: its selector's choice for these arguments, under the
            # sdpa_kernel() in force (its RuntimeError where none of the allowed backends fits).
            given["backend"] = self.select(**{name: given[name] for name in SELECT_ARGS})
        kwargs = {k: v for k, v in given.items() if k in self.names or (k not in _OPTIONAL and v is not None)}
        out, lse, _ = self.op(**kwargs)
        return out, lse


def takes_select_args(select: Callable[..., int] | None) -> bool:
    """Whether ``select`` can be called as torch 2.15's varlen_attn calls
    its ``_select_backend``: every argument of SELECT_ARGS by name, nothing
    else required."""
    if select is None:
        return False
    try:
        parameters = inspect.signature(select).parameters
    except (TypeError, ValueError):  # no signature to read: not called blind
        return False
    if any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in parameters.values()):
        return False
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    required = {n for n, p in parameters.items() if p.default is p.empty and p.kind is not p.VAR_KEYWORD}
    return required <= set(SELECT_ARGS) and (takes_any or set(SELECT_ARGS) <= set(parameters))
