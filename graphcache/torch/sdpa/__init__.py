"""The SDPA drop-in door: ``scaled_dot_product_attention``, the
``graphcache::sdpa`` custom op torch.compile traces, and ``patch()``,
which routes torch's SDPA through graphcache.

What enters: direct calls of ``graphcache.torch.scaled_dot_product_attention``
and, under ``patch()``, every call of
``torch.nn.functional.scaled_dot_product_attention`` (nn.MultiheadAttention,
HF "sdpa" models, ...); a compiled program's ``graphcache::sdpa`` op.
``patch()`` also puts the varlen door's ``varlen_attn`` in
``torch.nn.attention.varlen``. The shared core it goes through
(graphcache.torch.core): ``runtime`` (``Runtime.call``: the memo key, the
plan made once per call shape through ``derive``, ``plan`` and ``guard``,
the miss policy, the counts under the ``sdpa`` door) and ``doors`` (torch's
own SDPA, captured at import; a call relayed to the aten door is counted
there)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from graphcache.torch.core.doors import TORCH_SDPA
from graphcache.torch.core.runtime import RUNTIME
from graphcache.torch.varlen import varlen_attn
from graphcache.torch.varlen.torch_op import MODULE as torch_varlen  # None: a torch without varlen_attn

__all__ = ["RUNTIME", "disable", "enable", "enabled", "patch", "scaled_dot_product_attention"]

_SCHEMA = (
    "sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, bool is_causal, "
    "float? scale, bool enable_gqa) -> Tensor"
)


def implementation(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """What a compiled program's ``graphcache::sdpa`` op runs: the runtime's
    call, contiguous (the strides the fake promised)."""
    # The output must not alias an input: the graph's and torch's outputs are fresh.
    out = RUNTIME.call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return out.contiguous()


def _sdpa_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


# torch.library's low-level registration: a call costs about 3 us of dispatch,
# where a @torch.library.custom_op wrapper costs 15-25 us (benchmarks.md).
# The Library object must live as long as the op.
_LIBRARY = torch.library.Library("graphcache", "DEF")
_LIBRARY.define(_SCHEMA)
_LIBRARY.impl("sdpa", implementation, "CompositeExplicitAutograd")
torch.library.register_fake("graphcache::sdpa", _sdpa_fake, lib=_LIBRARY)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``, served by a cached
    cuDNN graph where one fits and by torch's own SDPA otherwise (same
    signature, semantics and result; see graphcache.torch.stats())."""
    if torch.compiler.is_compiling():
        # Traced as one opaque op (graphcache::sdpa); what autograd needs, and
        # shapes the fake cannot describe, stay torch's own op.
        needs_grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
        if query.dim() == 4 and not needs_grad:
            return torch.ops.graphcache.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        return TORCH_SDPA(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    return RUNTIME.call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


# -- patch ------------------------------------------------------------------------

_patch_lock = threading.Lock()
_depth = 0
_saved: tuple[Any, bool, Any] | None = None


def enable() -> None:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` through
    graphcache, and turn off nn.MultiheadAttention's / TransformerEncoderLayer's
    fused inference fast path (which never calls it); route
    ``torch.nn.attention.varlen.varlen_attn`` (where this torch has it) through
    ``graphcache.torch.varlen_attn``. Counted: each enable() needs one disable()."""
    global _depth, _saved
    RUNTIME.on_miss()  # a bad GRAPHCACHE_SDPA_ON_MISS fails here, not silently at the first miss
    with _patch_lock:
        if _depth == 0:
            _saved = (
                F.scaled_dot_product_attention,
                torch.backends.mha.get_fastpath_enabled(),
                getattr(torch_varlen, "varlen_attn", None),
            )
            F.scaled_dot_product_attention = scaled_dot_product_attention
            torch.backends.mha.set_fastpath_enabled(False)
            if torch_varlen is not None:
                torch_varlen.varlen_attn = varlen_attn
        _depth += 1


def disable() -> None:
    """Undo one enable(); the last one puts back exactly what was there
    (the function objects and the fast-path setting). A no-op when not enabled."""
    global _depth, _saved
    with _patch_lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0:
            assert _saved is not None
            original, fastpath, varlen = _saved
            F.scaled_dot_product_attention = original
            torch.backends.mha.set_fastpath_enabled(fastpath)
            if torch_varlen is not None:
                torch_varlen.varlen_attn = varlen
            _saved = None


def enabled() -> bool:
    return _depth > 0


@contextmanager
def patch() -> Iterator[None]:
    """``with graphcache.torch.patch():`` routes torch SDPA calls (direct, through
    nn.MultiheadAttention / nn.TransformerEncoderLayer, or a model library's
    "sdpa" attention) through graphcache; nests; restores on exit.

    The patch is process-wide (torch's module attribute), so while any thread
    holds it every thread's SDPA calls go through graphcache.
    """
    enable()
    try:
        yield
    finally:
        disable()
