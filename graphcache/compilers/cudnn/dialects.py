"""The dialect chain: one generation of SDPA keywords per dialect.

The frontend's SDPA keywords changed across versions (CUDNN_NOTES.md). The
chain (driven by ``build.build_graph``) tries the newest keyword set first
and falls back when the frontend lacks a name the dialect needs or refuses
one of its sdpa() keywords, each dialect expressing the spec's mask exactly
or declining: a causal mask is never dropped to make an old frontend happy.

A dialect is chosen by probing the module (``requires``) and by the
frontend's refusal, never by comparing version numbers: stand-ins and odd
builds are asked what they have. The names probed and the releases in the
labels come from the release table (releases.py).

May import: releases, graphcache.spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphcache.compilers.cudnn.releases import BOTTOM_RIGHT_FLAGS, DIAGONAL_BAND, GENERATE_STATS, feature, frontends
from graphcache.spec import GraphSpec


def _band(cudnn: Any, spec: GraphSpec) -> dict[str, Any]:
    """Mask keywords of frontends 1.10+ (diagonal alignment and band bounds).

    Only called for a frontend that has ``cudnn.diagonal_alignment`` (the
    dialect's ``requires``): 1.5-1.9 lack it and decline before this runs.
    """
    align = cudnn.diagonal_alignment
    if spec.mask == "none":
        return {}
    if spec.mask == "causal":
        return {"diagonal_alignment": align.TOP_LEFT, "diagonal_band_right_bound": 0}
    if spec.mask == "causal_bottom_right":
        return {"diagonal_alignment": align.BOTTOM_RIGHT, "diagonal_band_right_bound": 0}
    if spec.mask == "sliding_window_bottom_right":
        # varlen_attn's window: bottom-right per sequence; left L is cuDNN's
        # left bound L + 1 (it counts the diagonal); None: unbounded left.
        band = {"diagonal_alignment": align.BOTTOM_RIGHT, "diagonal_band_right_bound": spec.window_right}
        if spec.window_left is not None:
            band["diagonal_band_left_bound"] = spec.window_left + 1
        return band
    # sliding_window: cuDNN's left bound counts the diagonal, so it is >= 1.
    assert spec.window_left is not None
    return {
        "diagonal_alignment": align.TOP_LEFT,
        "diagonal_band_left_bound": spec.window_left + 1,
        "diagonal_band_right_bound": spec.window_right,
    }


def _newest(cudnn: Any, spec: GraphSpec) -> dict[str, Any] | None:
    return {"generate_stats": spec.generate_stats, **_band(cudnn, spec)}


def _band_is_inference(cudnn: Any, spec: GraphSpec) -> dict[str, Any] | None:
    return {"is_inference": not spec.generate_stats, **_band(cudnn, spec)}


def _causal_flags(cudnn: Any, spec: GraphSpec) -> dict[str, Any] | None:
    base: dict[str, Any] = {"is_inference": not spec.generate_stats}
    if spec.mask == "none":
        return base
    if spec.mask == "causal":
        return {**base, "use_causal_mask": True}
    if spec.mask == "causal_bottom_right":
        return {**base, "use_causal_mask_bottom_right": True}
    if spec.mask == "sliding_window_bottom_right":
        return None  # sliding_window_length is top-left: these frontends cannot say it
    # sliding_window_length is a causal window: it cannot look right.
    assert spec.window_left is not None
    if spec.window_right:
        return None
    return {**base, "use_causal_mask": True, "sliding_window_length": spec.window_left + 1}


@dataclass(frozen=True)
class Dialect:
    """One generation of SDPA keywords; ``kwargs`` returns None when it cannot
    express the spec's mask exactly.

    ``requires`` names the module attributes the dialect reads (e.g.
    ``diagonal_alignment``, first in 1.10). A frontend without one of them
    does not speak the dialect: it declines, like a frontend refusing a
    keyword, and the chain goes on to the next one.
    """

    name: str
    frontends: str
    kwargs: Callable[[Any, GraphSpec], dict[str, Any] | None]
    requires: tuple[str, ...] = ()

    def missing(self, cudnn: Any) -> list[str]:
        """The module attributes this dialect needs and ``cudnn`` lacks."""
        return [attr for attr in self.requires if not hasattr(cudnn, attr)]


_BAND_NAMES = feature(DIAGONAL_BAND).attributes

DIALECTS: tuple[Dialect, ...] = (
    Dialect("diagonal_band", frontends(GENERATE_STATS), _newest, requires=_BAND_NAMES),
    Dialect("diagonal_band_is_inference", frontends(DIAGONAL_BAND, GENERATE_STATS), _band_is_inference, _BAND_NAMES),
    Dialect("causal_flags", frontends(BOTTOM_RIGHT_FLAGS, DIAGONAL_BAND), _causal_flags),
)

# pybind11's overload failure for the C++ sdpa(): raised at the call by
# frontends before 1.27, and by 1.27+ when their Python graph is lowered (at
# validate() in 1.27-1.30, at create_execution_plans() in 1.31+). Read from
# each release's wheel (docs/frontends.md); other TypeErrors (1.32's
# _plan_serdes._Unserializable, a wrong argument type) are not refusals.
KEYWORD_REFUSAL = "sdpa(): incompatible function arguments"
# The same for a backward graph's sdpa_backward() (its pybind overload, as the
# forward's: cudnn-frontend python/pygraph/sdpa.cpp at every tag).
BACKWARD_KEYWORD_REFUSAL = "sdpa_backward(): incompatible function arguments"


def refuses_keywords(exc: BaseException) -> bool:
    """Whether ``exc`` is the frontend refusing the dialect's sdpa() (or
    sdpa_backward()) keywords."""
    text = str(exc).lstrip()
    return isinstance(exc, TypeError) and text.startswith((KEYWORD_REFUSAL, BACKWARD_KEYWORD_REFUSAL))
