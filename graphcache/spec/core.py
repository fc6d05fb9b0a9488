"""GraphSpec: everything that decides which SDPA graph (forward or backward) is built."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass
from typing import Any

from graphcache.errors import SpecError
from graphcache.spec import backward as spec_backward
from graphcache.spec import bias as spec_bias
from graphcache.spec import bounds as spec_bounds
from graphcache.spec import layouts as spec_layouts
from graphcache.spec import mechanism as spec_mechanism
from graphcache.spec import ragged as spec_ragged
from graphcache.spec import sinks as spec_sinks
from graphcache.spec import text as spec_text

DTYPES = ("float16", "bfloat16")
LAYOUTS = ("bshd", "bhsd", "thd")
MASKS = ("none", "causal", "causal_bottom_right", "sliding_window", "sliding_window_bottom_right")
SHAPES = ("exact", "class")
MAX_HEAD_DIM = 256

_is_int = spec_bounds.is_int


@dataclass(frozen=True)
class GraphSpec:
    """An SDPA graph, validated on construction: a forward one, or with
    ``kind="backward"`` its backward (``graphcache.spec.backward``).

    Sizes: ``batch``, ``heads_q``, ``heads_kv`` (defaults to heads_q; fewer
    for GQA/MQA), ``seq_q``, ``seq_kv`` (defaults to seq_q), ``head_dim``,
    ``head_dim_v`` (defaults to head_dim).

    Masks: ``none``, ``causal`` (top-left aligned), ``causal_bottom_right``
    and ``sliding_window``: query i sees key j when
    ``i - window_left <= j <= i + window_right`` (top-left aligned;
    ``window_right`` defaults to 0, a causal window).

    Ragged and paged (``layout="thd"``; ``page_size``, ``num_pages``,
    ``pages_per_seq``; mask ``sliding_window_bottom_right``): see
    ``graphcache.spec.ragged``, which holds their rules and descriptors.

    Bias: ``bias`` (None, ``bhss``, ``b1ss``, ``1hss``, ``11ss``) is an
    additive score bias tensor, an input of the graph (an attn_mask), in the
    io dtype or ``bias_dtype`` (``float32``): see ``graphcache.spec.bias``. ``sinks`` (per-head sink logits, gpt-oss): see
    ``graphcache.spec.sinks``. Layouts: ``layout`` (k's, and every tensor's
    that names none), ``layout_q``, ``layout_v``, ``layout_o``: see ``graphcache.spec.layouts``.

    Shapes: ``shapes="exact"`` (the default) is a graph of exactly these
    sizes. ``shapes="class"`` is a length class: ``batch``, ``seq_q`` and
    ``seq_kv`` are the declared maxima, and the graph serves every real
    (b, s_q, s_kv) up to them with all other fields equal and on the same side
    of ``s_q == 1`` (``covers``); ``graphcache.spec.classes`` picks the class.

    Raises:
        SpecError: naming the field, the value and what is allowed.
    """

    batch: int
    heads_q: int
    seq_q: int
    head_dim: int
    heads_kv: int | None = None
    seq_kv: int | None = None
    head_dim_v: int | None = None
    dtype: str = "float16"
    layout: str = "bshd"
    mask: str = "none"
    window_left: int | None = None
    window_right: int | None = None
    attn_scale: float | None = None
    generate_stats: bool = False
    padding: bool = False
    dropout: float = 0.0
    shapes: str = "exact"
    page_size: int | None = None
    num_pages: int | None = None
    pages_per_seq: int | None = None
    bias: str | None = None
    bias_dtype: str | None = None
    sinks: bool = False
    kind: str = "forward"
    layout_q: str | None = None
    layout_v: str | None = None
    layout_o: str | None = None
    mechanism: str | None = None

    def __post_init__(self) -> None:
        spec_bounds.check(self)  # single values, within cuDNN's sizes: every message below quotes them whole
        for name in ("batch", "heads_q", "seq_q", "head_dim"):
            _positive_int(name, getattr(self, name))
        spec_ragged.prepare(self)  # paged: seq_kv defaults to the block table's reach
        for name, default in (
            ("heads_kv", self.heads_q),
            ("seq_kv", self.seq_q),
            ("head_dim_v", self.head_dim),
        ):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, default)
            else:
                _positive_int(name, value)
        assert self.heads_kv is not None and self.head_dim_v is not None
        if self.heads_q % self.heads_kv:
            raise SpecError(
                f"heads_q={self.heads_q} is not divisible by heads_kv={self.heads_kv}: "
                "heads_kv must divide heads_q (equal for MHA, fewer for GQA, 1 for MQA)",
                "heads_q",
            )
        for name in ("head_dim", "head_dim_v"):
            value = getattr(self, name)
            if value % 8 or value > MAX_HEAD_DIM:
                raise SpecError(
                    f"{name}={value} is not supported: head dims must be a multiple of 8 and at most {MAX_HEAD_DIM}",
                    name,
                )
        _choice("dtype", self.dtype, DTYPES)
        spec_layouts.check(self)  # any order of b, h, s, d (d last), or thd; q, v, o may differ
        _choice("mask", self.mask, MASKS)
        if self.shapes not in SHAPES:
            raise SpecError(
                f"shapes={self.shapes!r} is not supported; allowed: exact (a graph of exactly these sizes), "
                "class (batch, seq_q and seq_kv are the maxima the graph serves)",
                "shapes",
            )
        self._check_window()
        self._check_scale()
        for name in ("generate_stats", "padding"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{name}={getattr(self, name)!r} must be true or false", name)
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not (0.0 <= dropout < 1.0):
            raise SpecError(
                f"dropout={dropout!r} is out of range: it must be a number in [0, 1)",
                "dropout",
            )
        object.__setattr__(self, "dropout", float(dropout))
        if self.shapes == "class" and (self.dropout or self.layout == "thd" or self.page_size is not None):
            # graphcache.spec.classes.has_class says why
            what = "dropout" if self.dropout else "ragged or paged (thd) specs, which serve many lengths already"
            raise SpecError(f"shapes='class' is not supported with {what}: use shapes='exact'", "shapes")
        spec_mechanism.check(self)
        spec_ragged.check(self)
        spec_bias.check(self)
        spec_sinks.check(self)
        spec_backward.check(self)

    def _check_window(self) -> None:
        if spec_ragged.check_window(self):
            return
        if self.mask == "sliding_window":
            if self.window_left is None:
                raise SpecError(
                    "window_left is missing: mask 'sliding_window' needs window_left "
                    "(keys a query sees to its left) and optionally window_right (default 0)",
                    "window_left",
                )
            if self.window_right is None:
                object.__setattr__(self, "window_right", 0)
            for name in ("window_left", "window_right"):
                value = getattr(self, name)
                if not _is_int(value) or value < 0:
                    raise SpecError(
                        f"{name}={value!r} is invalid: window bounds are integers >= 0",
                        name,
                    )
        else:
            for name in ("window_left", "window_right"):
                if getattr(self, name) is not None:
                    raise SpecError(
                        f"{name}={getattr(self, name)!r} is given for mask '{self.mask}': "
                        "window bounds apply only to mask 'sliding_window'; remove it "
                        "or set mask to 'sliding_window'",
                        name,
                    )

    def _check_scale(self) -> None:
        scale = self.attn_scale
        if scale is None:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))
            return
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise SpecError(
                f"attn_scale={scale!r} is invalid: it must be a finite number > 0 "
                f"(default 1/sqrt(head_dim) = {1.0 / math.sqrt(self.head_dim)!r})",
                "attn_scale",
            )
        object.__setattr__(self, "attn_scale", float(scale))

    # -- forms -----------------------------------------------------------

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return _FIELDS

    @classmethod
    def from_dict(cls, data: Any) -> GraphSpec:
        """Build a spec from a mapping (JSON/YAML). Unknown fields are errors.

        Raises:
            SpecError: for a non-mapping, a missing or unknown field, or an invalid value.
        """
        if not isinstance(data, dict):
            raise SpecError(f"a spec must be a mapping of field names to values, got {type(data).__name__}")
        names = cls.field_names()
        for name in data:
            if name not in names:
                close = difflib.get_close_matches(str(name), names, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise SpecError(
                    f"unknown field '{name}'{hint} (fields: {', '.join(sorted(names))})",
                    str(name),
                )
        for name in ("batch", "heads_q", "seq_q", "head_dim"):
            if name not in data:
                raise SpecError(f"{name} is missing: a spec needs {name}", name)
        return cls(**data)

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """A JSON Schema of the fields (for API docs). Rules that tie fields
        together (heads_q divisible by heads_kv, window bounds only for
        sliding_window) are checked on construction, not expressible here."""
        size = {"type": "integer", "minimum": 1}
        dim = {"type": "integer", "minimum": 8, "maximum": MAX_HEAD_DIM, "multipleOf": 8}
        optional = {"type": ["integer", "null"], "minimum": 0}
        props: dict[str, Any] = {
            "batch": size,
            "heads_q": size,
            "seq_q": size,
            "head_dim": dim,
            "heads_kv": {**size, "type": ["integer", "null"]},
            "seq_kv": {**size, "type": ["integer", "null"]},
            "head_dim_v": {**dim, "type": ["integer", "null"]},
            "dtype": {"enum": list(DTYPES)},
            "layout": {},  # its place among the fields; spec_layouts.json_schema_props says what it is
            "mask": {"enum": list(MASKS)},
            "window_left": optional,
            "window_right": optional,
            "attn_scale": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "generate_stats": {"type": "boolean"},
            "padding": {"type": "boolean"},
            "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            "shapes": {"enum": list(SHAPES)},
            **spec_ragged.json_schema_props(),
            **spec_bias.json_schema_props(),
            **spec_sinks.json_schema_props(),
            **spec_backward.json_schema_props(),
            **spec_layouts.json_schema_props(),
            **spec_mechanism.json_schema_props(),
        }
        return {
            "type": "object",
            "properties": props,
            "required": ["batch", "heads_q", "seq_q", "head_dim"],
            "additionalProperties": False,
            "example": {"batch": 1, "heads_q": 32, "heads_kv": 8, "seq_q": 4096, "head_dim": 128}
            | {"dtype": "bfloat16", "mask": "causal"},
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field, defaults resolved and written out; ``shapes`` only
        for a class spec, so an exact spec's canonical form (and so its key
        and its artifacts' headers) is the one it had before classes existed."""
        data = {name: getattr(self, name) for name in _FIELDS}
        if self.shapes == "exact":
            del data["shapes"]
        for name in (*spec_ragged.PAGED_FIELDS, "bias", "bias_dtype", *spec_layouts.FIELDS, "mechanism"):  # where set
            if data[name] is None:
                del data[name]
        for name, default in (("sinks", False), ("kind", "forward")):  # likewise: only a sink / backward spec
            if data[name] == default:
                del data[name]
        return data

    def canonical_json(self) -> str:
        """One stable text per spec: sorted keys, no spaces, shortest round-trip floats."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def replace(self, **changes: Any) -> GraphSpec:
        """A copy with some fields changed (validated like any spec)."""
        data = self.to_dict()
        if "head_dim" in changes and "attn_scale" not in changes:
            data["attn_scale"] = None
        data.update(changes)
        return GraphSpec.from_dict(data)

    # -- classes ---------------------------------------------------------

    @property
    def is_class(self) -> bool:
        return self.shapes == "class"

    def covers(self, spec: GraphSpec) -> bool:
        """True when this class spec serves the exact spec ``spec``: every
        field but the sizes (and the class's ``mechanism``) equal, batch, seq_q and seq_kv no larger than
        this class's, and both on the same side of ``seq_q == 1`` (cuDNN
        cannot override a graph across it). An exact spec covers only itself."""
        if not self.is_class:
            return spec == self
        if spec.is_class:
            return False
        assert spec.seq_kv is not None and self.seq_kv is not None
        if (spec.seq_q == 1) != (self.seq_q == 1):
            return False
        if spec.batch > self.batch or spec.seq_q > self.seq_q or spec.seq_kv > self.seq_kv:
            return False
        # Field by field, no spec built: the drop-in asks this once per new call shape.
        return all(getattr(spec, name) == getattr(self, name) for name in _FIELDS if name not in _CLASS_SIZES)

    def at(self, batch: int, seq_q: int, seq_kv: int) -> GraphSpec:
        """The exact spec of a real shape in this class (not checked against it: see ``covers``)."""
        return self.replace(batch=batch, seq_q=seq_q, seq_kv=seq_kv, shapes="exact", mechanism=None)

    def as_listed(self) -> GraphSpec:
        """This spec without a ``mechanism``: the class as a manifest lists it,
        whose mechanism the target decides (an exact spec: itself)."""
        return self if self.mechanism is None else self.replace(mechanism=None)

    # -- derived ---------------------------------------------------------

    def dims(self, role: str) -> tuple[int, ...]:
        """Logical dims (b, h, s, d) of a tensor role, as cuDNN wants them
        (thd and paged roles: ``spec_ragged.dims``; a gradient's: its tensor's)."""
        role = spec_backward.role_of(role)
        if self.layout == "thd":
            return spec_ragged.dims(self, role)
        return self.dense_dims(role)

    def dense_dims(self, role: str) -> tuple[int, ...]:
        b = self.batch
        assert self.heads_kv is not None and self.seq_kv is not None
        assert self.head_dim_v is not None
        shapes = {
            "q": (b, self.heads_q, self.seq_q, self.head_dim),
            "k": (b, self.heads_kv, self.seq_kv, self.head_dim),
            "v": (b, self.heads_kv, self.seq_kv, self.head_dim_v),
            "o": (b, self.heads_q, self.seq_q, self.head_dim_v),
            "stats": (b, self.heads_q, self.seq_q, 1),
            "seq_len_q": (b, 1, 1, 1),
            "seq_len_kv": (b, 1, 1, 1),
        }
        if role == "bias":
            return spec_bias.dims(self)
        if role == "sink":
            return spec_sinks.dims(self)
        return shapes[role]

    def strides(self, role: str) -> tuple[int, ...]:
        """Strides of a role's (b, h, s, d) dims in memory: q, k, v and o by
        their layouts; stats, seq_len and bias tensors (b|1, h|1, s_q, s_kv) packed."""
        role = spec_backward.role_of(role)  # dQ, dK, dV and dO: as q, k, v and o
        if self.layout == "thd":
            return spec_ragged.strides(self, role)
        if role in spec_layouts.ROLES:
            return spec_layouts.strides(self, role)
        b, h, s, d = self.dims(role)
        return (h * s * d, s * d, d, 1)

    def storage_shape(self, role: str) -> tuple[int, ...]:
        """A role's dims in memory order (of a fused buffer's view, for a grouped layout)."""
        role = spec_backward.role_of(role)  # dQ, dK, dV and dO: as q, k, v and o
        if role in spec_layouts.ROLES and self.layout != "thd":
            return spec_layouts.storage_shape(self, role)
        return self.dims(role)

    def summary(self) -> str:
        """A short human form, e.g. ``b1 h32/8 s4096 d128 bf16 bshd causal`` (``graphcache.spec.text``)."""
        return spec_text.summary(self)


_FIELDS = tuple(f.name for f in dataclasses.fields(GraphSpec))
# What a class declares as maxima (and says it is, and how it serves below them).
_CLASS_SIZES = frozenset({"batch", "seq_q", "seq_kv", "shapes", "mechanism"})


def _positive_int(name: str, value: Any) -> None:
    if not _is_int(value) or value <= 0:
        raise SpecError(f"{name}={value!r} is invalid: it must be an integer > 0", name)


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"{name}={value!r} is not supported; allowed: {', '.join(allowed)}", name)
