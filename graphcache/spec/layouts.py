"""Where q, k, v and o lie in memory: a GraphSpec's per-tensor layouts.

A layout is the order of a tensor's (b, h, s, d) dims in memory, outermost
first, written as letters: ``bshd`` (a (b, h, s, d) view of a contiguous
(b, s, h, d) tensor, what most models make), ``bhsd`` (contiguous per head),
``sbhd`` (sequence-first: ``nn.MultiheadAttention``'s ``(s, b*h, d)`` views).
The head dim is always innermost (cuDNN's SDPA takes nothing else: the
frontend refuses a last stride other than 1). One group token may sit
between two letters, for a view into a fused projection:

- ``[N]``: the block inside it is one of N side by side. timm's ViT makes q,
  k and v with ``reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)``: each is
  ``bs[3]hd``; GPT-NeoX's ``view(b, s, h, 3 * d)`` split is ``bsh[3]d``.
- ``[+N]``: the block inside it is followed by N more rows of the dim after
  the token: gpt_bigcode's fused ``c_attn`` output holds q's heads and then
  one key and one value head in each token's row, so its q is ``bs[+2]hd``.
  ``[+N]`` that is a whole multiple of the block is written ``[M]``, so each
  layout has one text at given sizes (before ``b`` or ``s``, whose sizes
  vary, a call whose rows happen to be a whole multiple gets a spec of its own).

The strides follow from the text and the sizes, so a layout does not depend
on the batch or the lengths: calls of one layout share a length class.

``GraphSpec.layout`` is k's layout (``bshd``, ``bhsd``, another order, or
``thd``, ragged / paged: ``graphcache.spec.ragged``) and every tensor's that
does not name its own: ``layout_q`` and ``layout_v`` where q or v differ
(Hugging Face's prefill: q a transposed projection ``bshd``, k/v the cache
``bhsd``), and ``layout_o`` where the output is not in q's order (o is the
graph's own tensor: its default is q's order without a group, what the
model reshapes for free). Fields equal to their default are left out of the
canonical form (normalized on construction), so every spec that exists in
``bshd`` / ``bhsd`` keeps its key.

The inverse, the layouts a tensor's shape and strides fit and the choice
among them, is ``graphcache.spec.layout_fits`` (graphcache.torch.derive
reads a call with it).

A group's N is a size like any other: at most 2**31 - 1 (``bounds``), and
the buffer a grouped tensor spans at a spec's sizes must be countable in
cuDNN's int64 strides (``check``).

May import: graphcache.errors, graphcache.spec.bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from graphcache.errors import SpecError
from graphcache.spec.bounds import INT32_MAX, INT64_MAX

FIELDS = ("layout_q", "layout_v", "layout_o")
ROLES = ("q", "k", "v", "o")
NAMED = ("bshd", "bhsd")  # today's, first where a tensor fits several
_TEXT = re.compile(r"^([bhsd]*)(?:\[(\+?)(\d+)\])?([bhsd]*)$")
_SLOT = {"q": 0, "k": 1, "v": 2}  # a tensor's place in a fused buffer (check inputs: not at offset 0)


@dataclass(frozen=True)
class Layout:
    """A parsed layout: ``order`` (four letters, d last) and the group
    token before ``order[gap]`` (``kind`` ``*`` or ``+``, ``n``), if any."""

    order: str
    gap: int | None = None
    kind: str = ""
    n: int = 0

    @property
    def text(self) -> str:
        if self.gap is None:
            return self.order
        token = f"[{'+' if self.kind == '+' else ''}{self.n}]"
        return self.order[: self.gap] + token + self.order[self.gap :]

    @property
    def packed(self) -> str:
        """The same order with no group: what a copy, or the output, is."""
        return self.order

    def strides(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """Strides of the (b, h, s, d) dims ``dims`` in this layout."""
        size = dict(zip("bhsd", dims, strict=True))
        out: dict[str, int] = {}
        running = 1
        for i in range(3, -1, -1):
            x = self.order[i]
            out[x] = running
            running *= size[x]
            if self.gap == i:
                running = running * self.n if self.kind == "*" else running + self.n * out[x]
        return tuple(out[c] for c in "bhsd")

    def storage_shape(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """The dims in memory order (group left out)."""
        size = dict(zip("bhsd", dims, strict=True))
        return tuple(size[c] for c in self.order)

    @property
    def to_storage(self) -> tuple[int, ...]:
        """``permute`` of a (b, h, s, d) view that gives the storage-order view."""
        return tuple("bhsd".index(c) for c in self.order)

    @property
    def to_bhsd(self) -> tuple[int, ...]:
        """``permute`` of a storage-order tensor that gives the (b, h, s, d) view."""
        return tuple(self.order.index(c) for c in "bhsd")


@lru_cache(maxsize=512)
def parse(text: str) -> Layout:
    """The layout a text names. Raises ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a text")
    m = _TEXT.match(text)
    if m is None:
        raise ValueError(
            f"{text!r} is not a layout: the letters b, h, s, d in memory order (outermost first, d last), "
            "with at most one group [N] or [+N] between two letters, e.g. bshd, sbhd, bs[3]hd"
        )
    head, plus, number, tail = m.groups()
    order = head + tail
    if sorted(order) != sorted("bhsd") or order[-1] != "d":
        raise ValueError(
            f"{text!r} is not a layout: it must hold each of b, h, s, d once with d (the head dim) last, "
            "which cuDNN requires to be contiguous"
        )
    if number is None:
        return Layout(order)
    if len(number) > len(str(INT32_MAX)) or int(number) > INT32_MAX:
        raise ValueError(
            f"{text!r}: the group's N ({number if len(number) <= 20 else number[:20] + '...'}) is more than cuDNN "
            f"can hold: at most {INT32_MAX}, as every size (a fused projection's group is a few heads or blocks)"
        )
    n = int(number)
    if not head:
        raise ValueError(f"{text!r}: a group outermost changes no stride (write {order})")
    if not tail:
        raise ValueError(f"{text!r}: a group after d is not a layout (the head dim must be innermost)")
    if plus:
        if n < 1:
            raise ValueError(f"{text!r}: [+N] needs N >= 1")
        return Layout(order, len(head), "+", n)
    if n < 2:
        raise ValueError(f"{text!r}: a group [N] needs N >= 2 (no group: write {order})")
    return Layout(order, len(head), "*", n)


def canonical(text: str, dims: tuple[int, ...]) -> str:
    """``text`` with ``[+N]`` written ``[M]`` where the extended block is M
    whole blocks at these (fixed) sizes."""
    layout = parse(text)
    if layout.kind != "+":
        return layout.text
    assert layout.gap is not None
    unit = dims["bhsd".index(layout.order[layout.gap])]
    if (unit + layout.n) % unit == 0:
        return Layout(layout.order, layout.gap, "*", (unit + layout.n) // unit).text
    return layout.text


# -- a spec's layouts -------------------------------------------------------------------


def of(spec: Any, role: str) -> str:
    """The layout text of q, k, v or o."""
    if role == "k":
        return str(spec.layout)
    if role == "o":
        return spec.layout_o or parse(of(spec, "q")).packed
    own = spec.layout_q if role == "q" else spec.layout_v
    return str(own or spec.layout)


def layout(spec: Any, role: str) -> Layout:
    return parse(of(spec, role))


def check(spec: Any) -> None:
    """Validate and normalize ``layout`` and ``layout_q/v/o`` (fields equal to
    their default become None). Raises SpecError naming the field."""
    if spec.layout == "thd":
        for name in FIELDS:
            if getattr(spec, name) is not None:
                raise SpecError(
                    f"{name}={getattr(spec, name)!r} is given for layout 'thd': ragged and paged graphs take "
                    "token-major tensors; remove it",
                    name,
                )
        return
    texts = {}
    for role, name in (("k", "layout"), ("q", "layout_q"), ("v", "layout_v"), ("o", "layout_o")):
        value = getattr(spec, name)
        if value is None:
            continue
        try:
            texts[role] = canonical(value, spec.dense_dims(role))
        except ValueError as exc:
            named = "" if name != "layout" else "; layout may also be thd (ragged / paged graphs)"
            raise SpecError(f"{name}={value!r} is not supported: {exc}{named}", name) from None
    for role, name in (("k", "layout"), ("q", "layout_q"), ("v", "layout_v")):
        if role in texts and parse(texts[role]).gap is not None:
            _check_span(spec, role, name, texts[role])
    if "o" in texts and parse(texts["o"]).gap is not None:
        raise SpecError(
            f"layout_o={spec.layout_o!r} has a group: o is the graph's own output, written packed; "
            f"use {parse(texts['o']).packed}",
            "layout_o",
        )
    k = texts["k"]
    q = texts.get("q", k)
    v = texts.get("v", k)
    o = texts.get("o", parse(q).packed)
    object.__setattr__(spec, "layout", k)
    object.__setattr__(spec, "layout_q", None if q == k else q)
    object.__setattr__(spec, "layout_v", None if v == k else v)
    object.__setattr__(spec, "layout_o", None if o == parse(q).packed else o)


def _check_span(spec: Any, role: str, name: str, text: str) -> None:
    """The buffer a grouped layout spans at the spec's sizes, within cuDNN's
    int64 strides (each size is bounded already: ``bounds``); SpecError
    naming ``name`` otherwise."""
    found = parse(text)
    dims = spec.dense_dims(role)
    shape, st = found.storage_shape(dims), found.strides(dims)
    span = 1 + sum((n - 1) * s for n, s in zip(dims, st, strict=True)) + max(st)
    if span > INT64_MAX:
        raise SpecError(
            f"{name}={text!r} spans {span} elements at these sizes ({role} of shape {shape} in its group), more "
            f"than cuDNN's int64 strides can count (at most {INT64_MAX}); lower the group's N or the sizes",
            name,
        )


def strides(spec: Any, role: str) -> tuple[int, ...]:
    return layout(spec, role).strides(spec.dense_dims(role))


def storage_shape(spec: Any, role: str) -> tuple[int, ...]:
    return layout(spec, role).storage_shape(spec.dense_dims(role))


def storage_strides(spec: Any, role: str) -> tuple[int, ...]:
    """The strides a tensor of ``storage_shape`` has in this layout."""
    found = layout(spec, role)
    st = found.strides(spec.dense_dims(role))
    return tuple(st[i] for i in found.to_storage)


def slot(spec: Any, role: str) -> int:
    """Element offset of a role's tensor in a buffer laid out as the spec
    says (0, or for a grouped layout the role's own place: q first, then k,
    then v), so checks feed what a fused projection's views are."""
    found = layout(spec, role)
    if found.gap is None:
        return 0
    index = _SLOT.get(role, 0)
    dims = spec.dense_dims(role)
    inner = found.strides(dims)["bhsd".index(found.order[found.gap])]
    unit = inner * dims["bhsd".index(found.order[found.gap])]
    if found.kind == "*":
        return (index % found.n) * unit
    return min(index, found.n) * inner


def extent(spec: Any, role: str) -> int:
    """Elements a buffer must hold for the role's tensor at its slot."""
    shape, st = storage_shape(spec, role), storage_strides(spec, role)
    return slot(spec, role) + 1 + sum((n - 1) * s for n, s in zip(shape, st, strict=True))


def shown(spec: Any, name: str) -> str:
    """A field's value as ``explain`` says it: a layout field left at its
    default names the layout it stands for."""
    value = getattr(spec, name)
    if name in FIELDS and value is None and spec.layout != "thd":
        return f"{of(spec, name[-1])!r} (the default)"
    return repr(value)


def summary_part(spec: Any) -> list[str]:
    """``bshd``, or k's layout and the tensors that differ: ``bhsd q:bshd``."""
    if spec.layout == "thd":
        return [spec.layout]
    parts = [spec.layout]
    for role, name in (("q", "layout_q"), ("v", "layout_v"), ("o", "layout_o")):
        if getattr(spec, name) is not None:
            parts.append(f"{role}:{getattr(spec, name)}")
    return [" ".join(parts)]


def json_schema_props() -> dict[str, Any]:
    text = {
        "type": ["string", "null"],
        "pattern": r"^[bhs]+(\[\+?\d+\])?[bhs]*d$",
        "description": "memory order of the (b, h, s, d) dims, outermost first, d last; [N] or [+N]: a fused projection's view",
    }
    return {
        "layout": {
            "type": "string",
            "description": "k's layout (and every tensor's that names none): bshd, bhsd, another order (e.g. sbhd, "
            "bs[3]hd), or thd (ragged / paged)",
            "pattern": r"^(thd|[bhs]+(\[\+?\d+\])?[bhs]*d)$",
        },
        **{name: text for name in FIELDS},
    }
