"""What a ragged (THD) or paged-KV spec adds to a GraphSpec: its rules, and
every tensor descriptor its graph is built with.

``layout="thd"``: q, k and v are token-major tensors ``(tokens, heads,
head_dim)`` holding many sequences one after another, as
``torch.nn.attention.varlen.varlen_attn`` takes them; ``batch`` is the number
of sequences, ``seq_q`` / ``seq_kv`` their longest lengths. cuDNN places
each sequence through ragged offsets and masks the rest with per-sequence
lengths (the padding mask), so ``padding`` is always true.

Paged K/V (``page_size``, ``num_pages``, ``pages_per_seq``, all three or
none): k and v are a pool ``(num_pages, page_size, heads_kv, head_dim)`` and
a block table ``(batch, pages_per_seq)`` names each sequence's pages; q is
thd. ``seq_kv`` is the table's reach, ``pages_per_seq * page_size`` by
default; cuDNN's composite path requires the table width to be exactly
``ceil(seq_kv / page_size)``, refused here before any GPU step.

Masks are varlen_attn's (flash-attention's): aligned to the bottom right of
each sequence. ``causal_bottom_right``, or ``sliding_window_bottom_right``
where query i of a sequence with lq queries and lk keys sees keys
``i + lk - lq - window_left <= j <= i + lk - lq + window_right``
(``window_left`` None: unbounded to the left).

Dtypes of the index tensors are part of the graph (and so of the key
through the recipe): offsets are int64 element offsets (int32 overflows
past 2**31 elements of a long pool), sequence lengths and block tables int32.
"""

from __future__ import annotations

from typing import Any, Protocol

from graphcache.errors import SpecError


class GraphSpec(Protocol):
    """What these rules read of a spec: ``graphcache.spec.GraphSpec`` is one
    (spec.py imports this module, so the type is stated here, not imported)."""

    # fmt: off
    @property
    def batch(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def heads_kv(self) -> int | None: ...
    @property
    def seq_kv(self) -> int | None: ...
    @property
    def head_dim_v(self) -> int | None: ...
    @property
    def dtype(self) -> str: ...
    @property
    def layout(self) -> str: ...
    @property
    def mask(self) -> str: ...
    @property
    def window_left(self) -> int | None: ...
    @property
    def window_right(self) -> int | None: ...
    @property
    def generate_stats(self) -> bool: ...
    @property
    def padding(self) -> bool: ...
    @property
    def dropout(self) -> float: ...
    @property
    def page_size(self) -> int | None: ...
    @property
    def num_pages(self) -> int | None: ...
    @property
    def pages_per_seq(self) -> int | None: ...
    def dims(self, role: str) -> tuple[int, ...]: ...
    def dense_dims(self, role: str) -> tuple[int, ...]: ...
    def strides(self, role: str) -> tuple[int, ...]: ...
    # fmt: on


PAGED_FIELDS = ("page_size", "num_pages", "pages_per_seq")
THD_MASKS = ("none", "causal_bottom_right", "sliding_window_bottom_right")
OFFSET_DTYPE = "int64"
INDEX_DTYPE = "int32"
# Which tensor each ragged offset places.
RAGGED_ROLES = {"q": "ragged_q", "k": "ragged_k", "v": "ragged_v", "o": "ragged_o", "stats": "ragged_stats"}


def is_ragged(spec: GraphSpec) -> bool:
    return spec.layout == "thd"


def is_paged(spec: GraphSpec) -> bool:
    return spec.page_size is not None


def prepare(spec: GraphSpec) -> None:
    """Before the dense defaults: check the paged fields and default
    ``seq_kv`` to the table's reach, and set ``padding`` for thd."""
    given = [name for name in PAGED_FIELDS if getattr(spec, name) is not None]
    if given and len(given) != len(PAGED_FIELDS):
        missing = [name for name in PAGED_FIELDS if name not in given]
        raise SpecError(
            f"{missing[0]} is missing: a paged K/V spec needs page_size, num_pages and pages_per_seq "
            f"(given: {', '.join(given)})",
            missing[0],
        )
    if not given:
        return
    for name in PAGED_FIELDS:
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SpecError(f"{name}={value!r} is invalid: it must be an integer > 0", name)
    page = spec.page_size
    assert page is not None and spec.pages_per_seq is not None
    if page & (page - 1):
        below = 1 << (page.bit_length() - 1)
        raise SpecError(
            f"page_size={page} is not a power of two: cuDNN's paged attention takes only power-of-two "
            f"pages (its validate() does not check this; the build would fail on the GPU); use {below} or {below * 2}",
            "page_size",
        )
    if spec.layout != "thd":
        raise SpecError(
            f"layout={spec.layout!r} with a paged K/V cache: q of a paged spec is token-major, set layout 'thd'",
            "layout",
        )
    if spec.seq_kv is None:
        object.__setattr__(spec, "seq_kv", spec.pages_per_seq * page)


def check(spec: GraphSpec) -> None:
    """After the dense checks: the rules of thd and paged specs."""
    if not is_ragged(spec):
        if spec.mask == "sliding_window_bottom_right":
            raise SpecError(
                "mask 'sliding_window_bottom_right' is varlen_attn's window, for layout 'thd'; "
                "a dense spec takes 'sliding_window' (top-left) or 'causal_bottom_right'",
                "mask",
            )
        return
    if spec.mask not in THD_MASKS:
        raise SpecError(
            f"mask={spec.mask!r} is top-left aligned; a thd spec aligns masks to the bottom right of each "
            f"sequence as varlen_attn does: use one of {', '.join(THD_MASKS)}",
            "mask",
        )
    if spec.dropout:
        raise SpecError(f"dropout={spec.dropout} with layout 'thd': ragged graphs are inference-only", "dropout")
    object.__setattr__(spec, "padding", True)
    if is_paged(spec):
        assert spec.seq_kv is not None and spec.page_size is not None and spec.pages_per_seq is not None
        need = -(-spec.seq_kv // spec.page_size)
        if spec.pages_per_seq != need:
            raise SpecError(
                f"pages_per_seq={spec.pages_per_seq} disagrees with seq_kv={spec.seq_kv} and "
                f"page_size={spec.page_size}: the block table must have ceil(seq_kv / page_size) = {need} "
                f"columns (cuDNN's composite path refuses any other width); set pages_per_seq={need} "
                f"or seq_kv={spec.pages_per_seq * spec.page_size}",
                "pages_per_seq",
            )


def check_window(spec: GraphSpec) -> bool:
    """The window rules of ``sliding_window_bottom_right``; False for any
    other mask (the dense rules apply)."""
    if spec.mask != "sliding_window_bottom_right":
        return False
    if spec.window_right is None:
        object.__setattr__(spec, "window_right", 0)
    if spec.window_left is None and spec.window_right == 0:
        raise SpecError(
            "window_left is missing: a bottom-right window unbounded on both the left and past the diagonal "
            "is mask 'causal_bottom_right'; give window_left, or window_right > 0",
            "window_left",
        )
    for name in ("window_left", "window_right"):
        value = getattr(spec, name)
        if value is None and name == "window_left":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise SpecError(f"{name}={value!r} is invalid: window bounds are integers >= 0", name)
    return True


def dims(spec: GraphSpec, role: str) -> tuple[int, ...]:
    """Logical dims of a thd / paged role as the graph declares them."""
    b = spec.batch
    assert spec.heads_kv is not None and spec.head_dim_v is not None
    if role in RAGGED_ROLES.values():
        return (b + 1, 1, 1, 1)
    if role in ("page_table_k", "page_table_v"):
        assert spec.pages_per_seq is not None
        return (b, 1, spec.pages_per_seq, 1)
    if role in ("k", "v") and is_paged(spec):
        assert spec.num_pages is not None and spec.page_size is not None
        d = spec.head_dim if role == "k" else spec.head_dim_v
        return (spec.num_pages, spec.heads_kv, spec.page_size, d)
    return spec.dense_dims(role)


def strides(spec: GraphSpec, role: str) -> tuple[int, ...]:
    """Strides of a thd / paged role: token-major q/k/v/o (the batch stride
    is never stepped under ragged offsets; it is declared as a whole
    sequence), token-major stats (s, h), NHD pages, packed tables."""
    n, h, s, d = dims(spec, role)
    if role in RAGGED_ROLES.values():
        return (1, 1, 1, 1)
    if role in ("page_table_k", "page_table_v"):
        return (s, s, 1, 1)
    if role in ("q", "k", "v", "o"):
        return (s * h * d, d, h * d, 1)
    if role == "stats":
        return (s * h, 1, h, 1)
    return (h * s * d, s * d, d, 1)


def roles(spec: GraphSpec) -> tuple[str, ...]:
    """Every tensor the spec's graph declares, in a stable order."""
    out = ["q", "k", "v", "o"]
    if spec.generate_stats:
        out.append("stats")
    if spec.padding:
        out += ["seq_len_q", "seq_len_kv"]
    if spec.dropout:
        out += ["dropout_seed", "dropout_offset"]
    if is_ragged(spec):
        out += ["ragged_q", "ragged_o"]
        if spec.generate_stats:
            out.append("ragged_stats")
        if is_paged(spec):
            out += ["page_table_k", "page_table_v"]
        else:
            out += ["ragged_k", "ragged_v"]
    return tuple(out)


def descriptors(spec: GraphSpec) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], str]]:
    """role -> (dims, strides, dtype) of every tensor descriptor the graph is
    built with: what the cache key must cover (tests/test_key.py checks it
    does). The cuDNN graph declares exactly these."""
    out: dict[str, tuple[tuple[int, ...], tuple[int, ...], str]] = {}
    for role in roles(spec):
        if role in ("q", "k", "v", "o"):
            dtype = spec.dtype
        elif role == "stats":
            dtype = "float32"
        elif role in RAGGED_ROLES.values() or role.startswith("dropout"):
            dtype = OFFSET_DTYPE
        else:
            dtype = INDEX_DTYPE
        out[role] = (spec.dims(role), spec.strides(role), dtype)
    return out


def window(spec: GraphSpec) -> tuple[int, int]:
    """varlen_attn's ``window_size`` for a thd spec's mask (negative: unbounded)."""
    if spec.mask == "causal_bottom_right":
        return (-1, 0)
    if spec.mask == "sliding_window_bottom_right":
        assert spec.window_right is not None
        return (-1 if spec.window_left is None else spec.window_left, spec.window_right)
    return (-1, -1)


def summary_parts(spec: GraphSpec) -> list[str]:
    """What ``summary()`` adds for a paged spec."""
    if not is_paged(spec):
        return []
    return [f"paged{spec.page_size}x{spec.num_pages}/{spec.pages_per_seq}"]


def mask_text(spec: GraphSpec) -> str:
    left = "inf" if spec.window_left is None else spec.window_left
    return f"window_br({left},{spec.window_right})"


def json_schema_props() -> dict[str, Any]:
    optional = {"type": ["integer", "null"], "minimum": 1}
    return {name: dict(optional) for name in PAGED_FIELDS}
