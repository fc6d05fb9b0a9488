"""The ``bias`` field of a GraphSpec: an additive score bias, a graph input.

cuDNN's SDPA adds a bias tensor to the scaled scores before the softmax
(``sdpa(..., bias=...)``), broadcast over batch and/or heads. A spec's
``bias`` says which dims that tensor has, as four letters in the graph's
(batch, heads, s_q, s_kv) order, the spelling Transformer Engine uses:

- ``"bhss"``: one bias per batch element and per head (b, h_q, s_q, s_kv);
- ``"b1ss"``: per batch element, shared by the heads (b, 1, s_q, s_kv),
  a padding or band mask of a padded batch, as Hugging Face passes it;
- ``"1hss"``: per head, shared by the batch (1, h_q, s_q, s_kv), a relative
  position bias (T5);
- ``"11ss"``: one (s_q, s_kv) matrix for the whole call (a band mask at batch 1).

``s_q`` and ``s_kv`` are always full. ``None`` (the default) is no bias, and a
spec without one keeps its canonical form and key. The tensor is packed
(contiguous) in the dtype of q/k/v, or in float32 where ``bias_dtype`` is
``"float32"`` (a float32 mask with 16-bit q/k/v, kept at its precision: bf16
holds a bias of 32 to within 0.125); -inf hides a key. cuDNN's SDPA takes a
bias tensor of any data type but boolean (cudnn-frontend's
``sdpa_support_surface.h``); of 1.32's Python engines the SM80 one compiles a
float32 bias load, the SM100 / SM107 ones decline it ("cast an fp32 bias
first"), so where a target's engines refuse the float32 bias the build says
unsupported and the drop-in runs torch. ``bias_dtype`` ``None`` (the default)
keeps a bias spec's canonical form and key as they were. A class spec's bias
takes the real shape like q/k/v do (execute-time shape override).

May import: graphcache.errors.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import SpecError

BIASES = ("bhss", "b1ss", "1hss", "11ss")
BIAS_DTYPES = ("float32",)  # besides None: the io dtype

_MEANING = (
    "bhss (per batch element and head), b1ss (per batch element), 1hss (per head), "
    "11ss (one matrix for the call); s_q and s_kv are always full"
)


def check(spec: Any) -> None:
    """Raise SpecError naming ``bias`` for a value not in ``BIASES``, or for a
    ragged/paged (thd) spec, which takes no bias here."""
    bias = spec.bias
    if spec.bias_dtype is not None and (spec.bias_dtype not in BIAS_DTYPES or bias is None):
        raise SpecError(
            f"bias_dtype={spec.bias_dtype!r} is not supported: null (the bias in the io dtype) or float32, "
            "and only with a bias",
            "bias_dtype",
        )
    if bias is None:
        return
    if bias not in BIASES:
        raise SpecError(f"bias={bias!r} is not supported; allowed: null (no bias), {_MEANING}", "bias")
    if spec.layout == "thd":
        raise SpecError(
            "bias is not supported with layout 'thd' (ragged / paged graphs take no bias tensor here): "
            "remove bias, or use a bshd/bhsd spec",
            "bias",
        )


def dims(spec: Any) -> tuple[int, int, int, int]:
    """The bias tensor's (b, h, s_q, s_kv) dims (``spec.bias`` must be set)."""
    assert spec.bias in BIASES and spec.seq_kv is not None
    b = spec.batch if spec.bias[0] == "b" else 1
    h = spec.heads_q if spec.bias[1] == "h" else 1
    return (b, h, spec.seq_q, spec.seq_kv)


def of_shape(batch: int, heads: int, spec_batch: int, spec_heads: int) -> str | None:
    """The ``bias`` value of a (batch, heads, s_q, s_kv) tensor for a call of
    ``spec_batch`` x ``spec_heads``, or None where a dim is neither the call's
    nor 1. A dim of size 1 in a call of that size is the full one (``b``/``h``)."""
    if batch not in (1, spec_batch) or heads not in (1, spec_heads):
        return None
    return ("b" if batch == spec_batch else "1") + ("h" if heads == spec_heads else "1") + "ss"


def json_schema_props() -> dict[str, Any]:
    return {"bias": {"enum": [*BIASES, None]}, "bias_dtype": {"enum": [*BIAS_DTYPES, None]}}


def summary_part(spec: Any) -> list[str]:
    if spec.bias is None:
        return []
    return [f"bias({spec.bias})" if spec.bias_dtype is None else f"bias({spec.bias},fp32)"]
