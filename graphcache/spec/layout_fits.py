"""Reading a layout off a tensor: the layouts (graphcache.spec.layouts) a
tensor's shape and strides fit, and the choice among them that names a
call's q, k and v.

``read`` lists every layout a 4-D (b, h, s, d) tensor fits: its dims of
size 1 fit any placement, and each ``Fit`` says whether the strides torch
left on a size-1 batch or sequence dim are that layout's too, and whether
it is a group only a size-1 dim's stride gives (``loose``); NoLayout names
why a tensor fits none. ``choose`` decides a call's layouts by its dims
larger than 1 alone (graphcache.torch.derive), or, as a hint, by what its
size-1 strides say; ``settled`` names a spec's layouts as the calls of its
sizes name them (graphcache record --max-batch / --max-seq).

May import: graphcache.spec.layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations
from typing import Any

from graphcache.spec.layouts import NAMED, Layout, parse, strides


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
