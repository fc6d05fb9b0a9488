"""The ``mechanism`` field of a GraphSpec: how a length class serves the
shapes below its maxima.

Left out (None, the default, and the only form a manifest writes), it is the
target's own choice, made where the class is keyed and built
(``graphcache.compilers.cudnn.releases.class_mechanism``): execute-time
shape override where cuDNN >= 9.21 and cudnn-frontend >= 1.24 have it, else
``padded``, the graph declared at the class's maxima with the padding mask
(graphcache.compilers.padded). ``padded`` asks for that anywhere (a class
whose override cuDNN refused, a benchmark of both). An exact spec, and a
backward class (served through override only), take none. None is left out
of the canonical form, so every spec that existed keeps its key.

May import: graphcache.errors.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import SpecError

MECHANISMS = ("padded",)


def check(spec: Any) -> None:
    """Raise SpecError naming ``mechanism`` for a value it does not take, or a spec it cannot apply to."""
    mechanism = spec.mechanism
    if mechanism is None:
        return
    if mechanism not in MECHANISMS:
        raise SpecError(
            f"mechanism={mechanism!r} is not supported; allowed: padded (declared at the class's maxima, the "
            "real lengths as the padding mask's seq-len tensors, no execute-time override), or leave it out "
            "(the target's own: override where cuDNN >= 9.21 and cudnn-frontend >= 1.24, else padded)",
            "mechanism",
        )
    if spec.shapes != "class":
        raise SpecError(
            f"mechanism={mechanism!r} is given for shapes='exact': a mechanism says how a length class "
            "serves shapes below its maxima; remove it, or set shapes='class'",
            "mechanism",
        )
    if spec.kind == "backward":
        raise SpecError(
            f"mechanism={mechanism!r} is not supported for kind='backward': backward classes are served "
            "through execute-time override only (cuDNN >= 9.21); leave mechanism out",
            "mechanism",
        )


def json_schema_props() -> dict[str, Any]:
    return {"mechanism": {"enum": [*MECHANISMS, None]}}


def class_part(spec: Any) -> str:
    """A class's word in ``summary()``: ``class``, or ``class(padded)``."""
    return "class" if spec.mechanism is None else f"class({spec.mechanism})"
