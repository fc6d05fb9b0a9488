"""The graphs one class of an attention's calls makes on a route, as
graphcache.models.specs' rules say (its module text): plain, with its
sliding window in reach, and as a padded batch (bias graphs on route
``sdpa``, ragged or dense window graphs on route ``graphcache``), and T5's
position-biased calls, every one a bias graph. ``ModelSpecs`` collects them,
each with who calls it, and what a route needs that no spec expresses yet.

May import: graphcache.models.config, graphcache.spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphcache.models.config import Attention
from graphcache.spec import GraphSpec
from graphcache.spec.classes import MIN_LENGTH

Layouts = str | dict[str, str]  # a layout, or the spec's layout fields


@dataclass
class ModelSpecs:
    """The specs, each with who calls it, and what the route needs that no
    spec here expresses yet (``missing``)."""

    users: dict[GraphSpec, list[str]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def add(self, spec: GraphSpec, user: str) -> None:
        users = self.users.setdefault(spec, [])
        if user not in users:
            users.append(user)

    def lack(self, what: str) -> None:
        if what not in self.missing:
            self.missing.append(what)


def _low(size: int) -> int:
    """The shortest length a class of ``size`` serves (its own: the smallest class starts at 1)."""
    return 1 if size <= MIN_LENGTH else size // 2 + 1


class _Maker:
    def __init__(self, out: ModelSpecs, route: str, dtype: str, bias: bool) -> None:
        self.out, self.route, self.dtype, self.bias = out, route, dtype, bias

    def call(
        self,
        a: Attention,
        batch: int,
        q: int,
        kv: int,
        layout: Layouts,
        phase: str,
        padded: bool = True,
        kv_max: int | None = None,
    ) -> None:
        """The graphs of one attention's calls of one class of sizes: plain,
        with its window in reach, and padded (batch > 1, where ``padded``).
        ``kv_max``: the most keys such a call has (a sliding layer's cache
        holds its window), default the class's ``kv``."""
        user = f"{a.users()}: {phase}"
        window = a.window
        most = kv if kv_max is None else kv_max
        # Plain: no mask tensor, as many queries as keys (or one), the window out of reach.
        # transformers' sdpa masks a window from kv >= window on; graphcache.hf passes it from kv > window.
        sdpa = self.route == "sdpa"
        chunked = a.causal and 1 < q < kv
        if not chunked and (window is None or (_low(kv) < window if sdpa else _low(kv) <= window)):
            mask = "causal" if a.causal and q > 1 else "none"
            self.out.add(self._dense(a, batch, q, kv, layout, mask), user)
        reach = window is not None and (most >= window if sdpa else most > window)
        if reach or chunked:
            self._masked(a, batch, q, kv, layout, user + (", window in reach" if reach else ""), True, most)
        if padded and batch > 1:
            self._masked(a, batch, q, kv, layout, user + ", padded batch", False, most)

    def biased(self, a: Attention, b: int, q: int, kv: int, layout: Layouts, phase: str, padded: bool = False) -> None:
        """One class of calls whose every call carries a float mask (T5's
        position bias): its bias graphs, by the bias dims the drop-in derives."""
        kinds = ["bhss"] if b == 1 else ["1hss", "bhss"] if padded else ["1hss"]
        for kind in kinds:
            user = f"{a.users()}: {phase}" + (", padded batch" if kind == "bhss" and b > 1 else "")
            self.out.add(self._dense(a, b, q, kv, layout, "none", bias=kind), user)

    def _masked(
        self, a: Attention, batch: int, q: int, kv: int, layout: Layouts, user: str, unpadded: bool, most: int
    ) -> None:
        if self.route == "sdpa":
            if not self.bias:
                self.out.lack(
                    "bias graphs (GraphSpec has no bias field here): route sdpa passes a mask tensor for padded "
                    "batches, windows in reach and chunked prefill; those calls run torch's SDPA"
                )
                return
            # With a mask, transformers' sdpa repeats the KV heads instead of enable_gqa (use_gqa_in_sdpa),
            # but packs a decode step's query heads into rows (pack_gqa), which the drop-in folds back
            # into the GQA decode step (graphcache.torch.bias.rows_are_heads).
            heads_kv = a.heads_kv if q == 1 else a.heads_q
            self.out.add(self._dense(a, batch, q, kv, layout, "none", bias="b1ss", heads_kv=heads_kv), user)
            return
        window = a.window
        if unpadded and a.causal and q == kv and window is not None and most > window:
            # graphcache.hf: a causal prompt with its window in reach is a dense sliding_window graph.
            bounds: dict[str, object] = {"window_left": window - 1, "window_right": 0}
            self.out.add(self._dense(a, batch, q, kv, layout, "sliding_window", **bounds), user)
            return
        # graphcache.hf passes the window only when the keys outnumber it.
        if window is None or _low(kv) <= window:
            self.out.add(self._thd(a, batch, q, kv, {"mask": "causal_bottom_right" if a.causal else "none"}), user)
        if window is not None and most > window:
            right = 0 if a.causal else window - 1
            band: dict[str, object] = {"mask": "sliding_window_bottom_right", "window_left": window - 1}
            self.out.add(self._thd(a, batch, q, kv, {**band, "window_right": right}), user)

    def _fields(self, a: Attention) -> dict[str, object]:
        # A scale of 1/sqrt(head_dim), however computed (transformers writes
        # head_dim**-0.5), is the spec's default, as graphcache.torch.derive maps it.
        default = math.isclose(a.scale, 1.0 / math.sqrt(a.head_dim), rel_tol=1e-12, abs_tol=0.0)
        scale = None if default else a.scale
        # transformers' sdpa uses GQA only up to head_dim 256 (use_gqa_in_sdpa); above, it repeats the KV heads.
        heads_kv = a.heads_kv if a.head_dim <= 256 else a.heads_q
        return dict(heads_q=a.heads_q, heads_kv=heads_kv, head_dim=a.head_dim, dtype=self.dtype, attn_scale=scale)

    def _dense(self, a: Attention, b: int, q: int, kv: int, layout: Layouts, mask: str, **extra: object) -> GraphSpec:
        fields = {**self._fields(a), **({"layout": layout} if isinstance(layout, str) else layout)}
        return GraphSpec.from_dict(
            {**fields, "batch": b, "seq_q": q, "seq_kv": kv, "mask": mask, "shapes": "class", **extra}
        )

    def _thd(self, a: Attention, b: int, q: int, kv: int, mask: dict[str, object]) -> GraphSpec:
        fields = self._fields(a)  # the model's own scale, the default where it is 1/sqrt(d) up to rounding
        return GraphSpec.from_dict({**fields, "batch": b, "seq_q": q, "seq_kv": kv, "layout": "thd", **mask})
