"""What a spec's values may be before any other rule reads them: single
values (no lists or mappings), sizes cuDNN and the key can hold, and error
messages that quote a bounded prefix of a value, never the value whole.

Read first by ``GraphSpec.__post_init__``, so that the field rules after it
(``spec/core.py``, which print the value they refuse) only ever see values
whose text is short: a manifest's nested aliases once put a 191 MB value
into one error message, and ``batch: 10**30`` was keyed.

The bounds are cuDNN's. Its attention mask computes row and column indices,
the sequence lengths and the diagonal band's bounds as int32
(cudnn_frontend ``utils/attn_score_modifiers.h``: ``static_cast<int32_t>``
of s_q, s_kv and the bounds; ``node/scaled_dot_product_flash_attention.h``:
INT32 row and column indices and padding lengths), so lengths and window
bounds are at most 2**31 - 1 (the left bound cuDNN gets is window_left + 1);
every other size is held to the same bound. Tensor dims and strides are
int64 (``graph_properties.h``: ``std::vector<int64_t> dim, stride``), so
no tensor the graph declares or computes (q, k, v, o, the scores) may hold
more than 2**63 - 1 elements.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

from graphcache.errors import SpecError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
SIZES = (
    "batch",
    "heads_q",
    "heads_kv",
    "seq_q",
    "seq_kv",
    "head_dim",
    "head_dim_v",
    "window_left",
    "window_right",
    "page_size",
    "num_pages",
    "pages_per_seq",
)
# The most any size may be, where it differs from INT32_MAX.
LIMITS = {"window_left": INT32_MAX - 1}
LONGEST_TEXT = 64  # no field's allowed text (a dtype, layout, mask, shapes, bias form) is longer
SHOWN = 60  # characters of a value an error message quotes

_REPR = reprlib.Repr()
_REPR.maxlevel = 2
_REPR.maxstring = SHOWN
_REPR.maxother = SHOWN
_REPR.maxlong = SHOWN
for _name in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_REPR, _name, 4)


def is_int(value: Any) -> bool:
    """An integer, not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: Any) -> str:
    """A bounded text of ``value`` for an error message: at most about
    ``SHOWN`` characters, however large or deeply shared the value is (its
    whole repr is never made)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # repr() of an int past 4,300 digits raises; its size says enough.
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}<an integer of about {digits} digits>"
    text = _REPR.repr(value)
    return text if len(text) <= 2 * SHOWN else text[: 2 * SHOWN] + "..."


def check(spec: Any) -> None:
    """Raise SpecError, naming the field and its bound, for a value no rule
    should print whole: anything but a single value (None, true/false, a
    number, a short text), an integer past every bound, or a size cuDNN
    cannot hold; then for tensors of more elements than int64 counts."""
    for name, value in _fields(spec):
        if value is None or isinstance(value, (bool, float)):
            continue
        if isinstance(value, str):
            if len(value) > LONGEST_TEXT:
                raise SpecError(
                    f"{name}={shown(value)} is {len(value)} characters: no value of {name} is longer "
                    f"than {LONGEST_TEXT}",
                    name,
                )
            continue
        if not isinstance(value, int):
            raise SpecError(
                f"{name}={shown(value)} is not a single value ({type(value).__name__}): give one number or name"
                f"{_allowed(spec, name)}; a manifest lists values to expand only at a family's top level",
                name,
            )
        limit = LIMITS.get(name, INT32_MAX) if name in SIZES else INT64_MAX
        if abs(value) > limit:
            raise SpecError(
                f"{name}={shown(value)} is more than cuDNN can hold: at most {limit} ({_why(name)})",
                name,
            )
    _check_elements(spec)


def _allowed(spec: Any, name: str) -> str:
    """The values ``name`` takes, where the spec's schema lists them, for the
    message of a value that is not a single one."""
    schema = getattr(type(spec), "json_schema", None)
    enum = (schema()["properties"].get(name) or {}).get("enum") if schema else None
    return f" (one of: {', '.join(str(v) for v in enum if v is not None)})" if enum else ""


def _fields(spec: Any) -> list[tuple[str, Any]]:
    import dataclasses

    return [(f.name, getattr(spec, f.name)) for f in dataclasses.fields(spec)]


def _why(name: str) -> str:
    if name in ("seq_q", "seq_kv", "window_left", "window_right"):
        return "cuDNN's mask computes lengths and window bounds as int32"
    if name in SIZES:
        return "sizes are held to cuDNN's int32 lengths"
    return "an integer beyond int64 is no setting"


def _check_elements(spec: Any) -> None:
    """The largest tensor the graph declares or computes within int64."""

    def size(name: str, default: Any = 1) -> int:
        value = getattr(spec, name)
        value = default if value is None else value
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1

    b, sq = size("batch"), size("seq_q")
    hq, d = size("heads_q"), size("head_dim")
    hkv, skv, dv = size("heads_kv", hq), size("seq_kv", sq), size("head_dim_v", d)
    tensors = {
        "q": b * hq * sq * d,
        "k": b * hkv * skv * d,
        "v": b * hkv * skv * dv,
        "o": b * hq * sq * dv,
        "the scores (batch x heads_q x seq_q x seq_kv)": b * hq * sq * skv,
    }
    if getattr(spec, "page_size", None) is not None:
        tensors["the page pool (num_pages x page_size x heads_kv x head_dim)"] = (
            size("num_pages") * size("page_size") * hkv * max(d, dv)
        )
    role, elements = max(tensors.items(), key=lambda item: item[1])
    if elements > INT64_MAX:
        # Named by its largest size, the likeliest typo.
        field = max((("batch", b), ("heads_q", hq), ("seq_q", sq), ("seq_kv", skv)), key=lambda item: item[1])[0]
        raise SpecError(
            f"{field}={getattr(spec, field)}: {role} would hold {elements} elements, more than cuDNN's int64 "
            f"dims and strides can count (at most {INT64_MAX}); lower batch, heads or lengths",
            field,
        )
