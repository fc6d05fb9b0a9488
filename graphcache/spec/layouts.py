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

``read`` is the inverse: the layouts a tensor's shape and strides fit
(graphcache.torch.derive picks among them).

A group's N is a size like any other: at most 2**31 - 1 (``bounds``), and
the buffer a grouped tensor spans at a spec's sizes must be countable in
cuDNN's int64 strides (``check``).

May import: graphcache.errors, graphcache.spec.bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations
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


# -- reading a layout off a tensor ---------------------------------------------------


class NoLayout(ValueError):
    """A tensor no layout expresses; ``reason`` is the code the copy is counted under."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Fit:
    """A layout a tensor fits. Its dims of size 1 fit any layout; ``batch``
    and ``seq`` say whether the strides of a size-1 batch or sequence dim
    are this layout's too (True where that dim is larger): the tensor's
    producer laid it out so, and the same call with more sequences (or
    tokens) would fit this layout alone. ``loose``: a group whose width
    only the stride of a size-1 dim gives (any stride is valid for a dim of
    size 1, so such a group says nothing cuDNN reads: never a call's layout,
    only a hint of what a larger call of the same producer has)."""

    text: str
    batch: bool
    seq: bool
    loose: bool = False

    @property
    def exact(self) -> bool:
        return self.batch and self.seq


@lru_cache(maxsize=4096)
def read(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[Fit, ...]:
    """Every layout a 4-D (b, h, s, d) tensor of ``shape`` and ``stride`` is
    in (its dims of size > 1 decide; see ``Fit`` for the rest).

    Raises NoLayout with the reason where none is: the head dim not
    contiguous (``head_dim_stride``), a stride 0 on a dim of size > 1
    (``broadcast``), strides that alias (``overlap``), a pattern no layout
    text expresses (``strides``), or no element at all (``empty``: a dim of
    size 0, which graphcache.torch.derive hands to torch before reading)."""
    if 0 in shape:  # no element to read: every stride is as good as any other
        raise NoLayout("empty", f"shape {tuple(shape)} has no elements")
    size = dict(zip("bhsd", shape, strict=True))
    st = dict(zip("bhsd", stride, strict=True))
    if size["d"] != 1 and st["d"] != 1:
        raise NoLayout("head_dim_stride", f"the head dim has stride {st['d']}; cuDNN takes it contiguous (stride 1)")
    active = [x for x in "bhsd" if size[x] != 1]
    zero = [x for x in active if st[x] == 0]
    if zero:
        raise NoLayout("broadcast", f"dim {zero[0]} is broadcast (stride 0); cuDNN reads each element once")
    found: dict[str, Fit] = {}
    for perm in permutations("bhs"):
        order = "".join(perm) + "d"
        for gap, kind in ((None, ""), (1, "*"), (2, "*"), (3, "*"), (1, "+"), (2, "+"), (3, "+")):
            fit = _fit(order, gap, kind, size, st, active)
            if fit is not None and fit.text not in found:
                found[fit.text] = fit
    if not found:
        spans = sorted((st[x], size[x]) for x in active)
        span, overlap = 1, False
        for s, n in spans:
            overlap = overlap or s < span
            span = s * n
        if overlap:
            raise NoLayout("overlap", f"strides {tuple(stride)} alias elements of shape {tuple(shape)}")
        raise NoLayout("strides", f"strides {tuple(stride)} of shape {tuple(shape)} are no layout graphcache expresses")
    return tuple(found.values())


def _fit(
    order: str, gap: int | None, kind: str, size: dict[str, int], st: dict[str, int], active: list[str]
) -> Fit | None:
    n, loose = 0, False
    if gap is not None:
        # The block inside the token, and the first dim outside it that says how wide its slot is.
        inner = Layout(order).strides(tuple(size[c] for c in "bhsd"))
        unit = inner["bhsd".index(order[gap])]
        block = unit * size[order[gap]]
        outside = [x for x in reversed(order[:gap]) if size[x] != 1]
        loose = not outside
        if loose:  # only a size-1 batch or sequence dim's stride says how wide the slot is
            outside = [x for x in reversed(order[:gap]) if x in "bs"]
        if not outside:
            return None
        wide = st[outside[0]]
        if kind == "*":
            if block == 0 or wide % block or wide // block < 2:
                return None
            n = wide // block
        else:
            if wide <= block or (wide - block) % unit or wide % block == 0:
                return None
            n = (wide - block) // unit
    layout = Layout(order, gap, kind, n)
    computed = dict(zip("bhsd", layout.strides(tuple(size[c] for c in "bhsd")), strict=True))
    if any(computed[x] != st[x] for x in active):
        return None
    batch, seq = (size[x] != 1 or computed[x] == st[x] for x in "bs")
    if loose and not (batch and seq):
        return None  # a group only the size-1 dims outside it would carry, and they do not
    return Fit(layout.text, batch, seq, loose)


def rank(text: str) -> tuple[int, str]:
    """The fixed order among layouts a tensor fits equally: bshd, bhsd, then by text."""
    return (NAMED.index(text) if text in NAMED else len(NAMED), text)


# -- choosing among the layouts q, k and v fit ---------------------------------------------


def choose(fits: dict[str, tuple[Fit, ...]], hint: bool = False) -> dict[str, str]:
    """The layout of each of q, k, v (the roles ``fits`` holds) among those
    its strides fit.

    A call's own (``hint`` False) is decided by its dims of size > 1 alone,
    so any two calls cuDNN runs identically (they differ only in the strides
    of size-1 dims, which any value fits) get one spec: of the layouts whose
    strides on those dims agree (``loose`` groups left out), k takes one q
    and v fit too (a call whose three tensors share a layout keeps the spec
    it always had), q and v take k's where they fit it, else one in k's
    order (a group apart: GPT-2's decode q beside its cache is ``b[3]hsd``),
    else the fixed order (``rank``: bshd, bhsd, then by text). With ``hint``, the layouts the
    size-1 batch and sequence strides say (``Fit.batch``, ``Fit.seq``): what
    the same producer's calls with more sequences or tokens have, which
    ``graphcache record --max-batch`` / ``--max-seq`` widen a call to.
    """
    if hint:
        usable = fits
    else:
        usable = {role: tuple(f for f in found if not f.loose) for role, found in fits.items()}
    texts = {role: {f.text for f in found} for role, found in usable.items()}
    chosen: dict[str, str] = {}
    if "k" in usable:
        others = [texts[r] for r in ("q", "v") if r in usable]
        chosen["k"] = _best(usable["k"], lambda text: all(text in o for o in others), hint)
    k = chosen.get("k")
    order = parse(k).order if k else None
    for role in ("v", "q"):
        if role in usable:
            chosen[role] = _best(usable[role], lambda text: text == k, hint, lambda text: parse(text).order == order)
    return chosen


def _best(fits: tuple[Fit, ...], first: Any, hint: bool, near: Any = None) -> str:
    """The fit ``first`` says, else (a call's own) one ``near`` says (q or v
    in k's order, its group apart), else the fixed order."""
    if hint:  # the batch stride's word first (what record --max-batch widens), then first, the sequence's
        return min(fits, key=lambda f: (not f.batch, not first(f.text), not f.seq, rank(f.text))).text
    return min(fits, key=lambda f: (not first(f.text), not (near and near(f.text)), rank(f.text))).text


def settled(spec: Any) -> dict[str, str]:
    """``layout``, ``layout_q`` and ``layout_v`` as a call whose tensors
    have the strides ``spec``'s layouts give at its sizes gets them
    (``choose``): a spec made from another's layouts at other sizes (record
    --max-batch widening a batch-1 call) named as the calls of its sizes
    name it. Tensors are read by their role's layout at the spec's sizes."""
    if spec.layout == "thd":
        return {}
    fits = {role: read(spec.dense_dims(role), strides(spec, role)) for role in ("q", "k", "v")}
    chosen = choose(fits)
    return {"layout": chosen["k"], "layout_q": chosen["q"], "layout_v": chosen["v"]}
