"""The trace's forwards as ``torch.compile`` runs them: what compiled code
hands attention, which is not always what eager code hands it.

Two things differ, and ``compiled_code()`` reproduces both while a forward
runs on the meta device:

- **The branches code takes.** While dynamo traces a forward,
  ``torch.compiler.is_compiling()`` is true, and the code reads it:
  transformers' masks are never skipped for SDPA's ``is_causal`` where a
  padding mask is given (``masking_utils._ignore_causal_mask_sdpa``), and
  its sdpa repeats a masked GQA call's key and value heads
  (``sdpa_attention.repeat_kv``) where eager code packs a decode step's
  query heads (``pack_gqa``); graphcache.hf reads no value on the host and
  gives every masked call to the SDPA drop-in (graphcache.hf.masks). Within
  ``compiled_code()`` it answers true to the model's code.
- **The layouts tensors have.** The ``graphcache::sdpa`` op takes its inputs
  with the exact strides of the compiled graph's fake tensors (custom ops'
  default layout constraint, ``needs_exact_strides``:
  ``torch._functorch.config.custom_op_default_layout_constraint``), and that
  graph is the one after inductor's decompositions, whose ``cat`` drops
  empty inputs and makes a ``cat`` of one tensor its ``clone``, which keeps
  that tensor's layout (``torch/_inductor/decomposition.py``, ``cat``). So a
  prompt on an empty ``DynamicCache`` hands SDPA its key and value in the
  projection's layout (bshd), where eager code's ``cat`` writes the cache
  contiguous (bhsd). Within ``compiled_code()`` a ``cat`` does the same.

graphcache's own drop-in, called while ``is_compiling()`` answers true,
goes through the ``graphcache::sdpa`` op as compiled code does; on the meta
device the op would run its fake, so within ``compiled_code()`` it runs its
implementation, as the compiled program runs it (the runtime's call, which
the recorder notes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten


@contextmanager
def compiled_code() -> Iterator[None]:
    """Within: ``torch.compiler.is_compiling()`` is true and a ``cat`` is
    decomposed as inductor decomposes it (see the module's text). The first
    is process-wide while it lasts: the tracer runs one forward at a time,
    on the meta device, and nothing else of the process should run meanwhile."""
    original = torch.compiler.is_compiling
    torch.compiler.is_compiling = _compiling
    try:
        with _Decomposed():
            yield
    finally:
        torch.compiler.is_compiling = original


def _compiling() -> bool:
    return True


class _Decomposed(TorchDispatchMode):
    """``aten.cat`` as inductor's decomposition table has it: empty inputs
    dropped (a 1-D tensor of 0 elements, or one empty along ``dim``), and a
    cat of the one tensor left its clone (its layout kept)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "name", lambda: "")() == "graphcache::sdpa":
            from graphcache.torch.sdpa import implementation

            return implementation(*args, **kwargs)
        if func is _aten.cat.default:
            tensors, dim = args[0], (args[1] if len(args) > 1 else kwargs.get("dim", 0))
            kept = [t for t in tensors if not _empty(t, dim)]
            if len(kept) == 1 and len(tensors) > 1:
                return kept[0].clone()
        return func(*args, **kwargs)


def _empty(t: torch.Tensor, dim: int) -> bool:
    if t.dim() == 1 and t.shape[0] == 0:
        return True
    return dim < t.dim() and t.shape[dim] == 0
