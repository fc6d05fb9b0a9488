"""What each cudnn-frontend and cuDNN release can do: the one place in the
compiler where version numbers are compared.

``FEATURES`` is the table, one ``Feature`` a row: the oldest frontend and
cuDNN that have it, the compute capabilities it needs, and where the figure
was read (``source``: /work/shared/CUDNN_NOTES.md and its notes/). Callers ask
by name, never by number: ``available(SHAPE_OVERRIDE, "1.32.0", 92800, "9.0")``,
``missing(...)`` for the sentence an UnsupportedSpec carries. A version the
caller does not pass (None) is unknown, and a feature that needs it is not
available. ``known_bad(spec, target)`` is the window of ``KNOWN_BAD`` (cuDNN,
compute capability, call shape) that forbids serving a spec on a target, and
``refusal`` the sentence, with the window's name and source, that a
negative entry for it carries. ``class_mechanism(spec, target)`` is how a
length class serves real shapes on a target (execute-time override, or
``padded``: declared at the maxima with the padding mask), and ``resolved``
the class spec with that mechanism written in, which its key covers.

A target's versions are read by ``table_versions``: a GPU's as they are; the
reference compiler's (``graphcache.compilers.reference``, compute capability
0.0) as an SM90 GPU with the cuDNN and frontend it names
(GRAPHCACHE_REFERENCE_CUDNN / _FRONTEND), 0.0.0 standing for "no limit".

The rows are ``release_rows``; its names are this module's too.

May import: release_rows, graphcache.errors and graphcache.target (cuDNN's integer form).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, ClassVar

from graphcache.compilers.cudnn.release_rows import *  # noqa: F403 - the feature names, by which callers ask
from graphcache.compilers.cudnn.release_rows import (
    BIAS_OVERRIDE,
    KNOWN_BAD,
    PADDING_MASK,
    ROWS,
    SHAPE_OVERRIDE,
    Feature,
    Window,
)
from graphcache.errors import KnownBad, TargetError
from graphcache.target import cudnn_version_text

Version = tuple[int, int, int]
Capability = tuple[int, int]
VersionLike = str | int | tuple[int, ...]

FEATURES: Mapping[str, Feature] = MappingProxyType({row.name: row for row in ROWS})

_VERSION = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


@cache
def parse_version(value: VersionLike) -> Version:
    """``(major, minor, patch)`` of "1.32.0", "1.32.0+cu12", "9.18.1", cuDNN's
    integer form (92800, 8902) or a tuple. Raises TargetError for anything else."""
    if isinstance(value, tuple) and value and all(isinstance(p, int) and p >= 0 for p in value):
        major, minor, patch = (*value, 0, 0)[:3]
        return (major, minor, patch)
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        number = int(value)
        if number < 1000:  # a bare major version
            return (number, 0, 0)
        value = cudnn_version_text(number)  # cuDNN's integer form: 92800, 8902
    match = _VERSION.match(value) if isinstance(value, str) else None
    if match is None:
        raise TargetError(f"version {value!r} is not a version: write it as '1.32.0', '9.18.1' or cuDNN's 92800")
    return (int(match[1]), int(match[2] or 0), int(match[3] or 0))


def _cc(value: str | Capability) -> Capability:
    if isinstance(value, tuple):
        return value
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", value)
    if match is None:
        raise TargetError(f"compute capability {value!r} is not one: write it as '9.0'")
    return int(match[1]), int(match[2])


def feature(name: str) -> Feature:
    """The table's row for ``name``. Raises KeyError naming the known features."""
    try:
        return FEATURES[name]
    except KeyError:
        raise KeyError(f"no feature {name!r} in the release table; known: {', '.join(FEATURES)}") from None


def _cudnn_floor(row: Feature, cc: Capability | None) -> str | None:
    """The highest cuDNN floor that applies on ``cc`` (every arch floor on an unknown cc)."""
    floors = [row.cudnn] if row.cudnn else []
    floors += [f.cudnn for f in row.arch_floors if cc is None or cc < _cc(f.below)]
    return max(floors, key=parse_version) if floors else None


def requirement(name: str, cc: str | Capability | None = None) -> str:
    """What ``name`` needs, in words ("cuDNN >= 9.21 and cudnn-frontend >=
    1.24"); with ``cc``, the cuDNN floor of that compute capability."""
    row = feature(name)
    floor = _cudnn_floor(row, _cc(cc) if cc is not None else None)
    if cc is None and row.arch_floors:
        floor = f"{row.cudnn}" + "".join(f" (>= {f.cudnn} below compute capability {f.below})" for f in row.arch_floors)
    parts = [f"cuDNN >= {floor}"] if floor else []
    parts += [f"cudnn-frontend >= {row.frontend}"] if row.frontend else []
    parts += [f"compute capability >= {row.min_cc}"] if row.min_cc else []
    return " and ".join(parts) or "nothing"


def missing(
    name: str,
    frontend: VersionLike | None = None,
    cudnn: VersionLike | None = None,
    cc: str | Capability | None = None,
) -> str | None:
    """None where this target has ``name``; else the sentence an
    UnsupportedSpec should carry: what it needs and what this target has.
    Raises KeyError for an unknown feature, TargetError for a version that
    does not parse."""
    row = feature(name)
    cap = _cc(cc) if cc is not None else None
    floor = _cudnn_floor(row, cap)
    short = (
        (floor is not None and (cudnn is None or parse_version(cudnn) < parse_version(floor)))
        or (row.frontend is not None and (frontend is None or parse_version(frontend) < parse_version(row.frontend)))
        or (row.min_cc is not None and (cap is None or cap < _cc(row.min_cc)))
    )
    if not short:
        return None
    has = [f"cuDNN {_shown(cudnn)}"] if floor else []
    has += [f"cudnn-frontend {_shown(frontend)}"] if row.frontend else []
    has += [f"compute capability {f'{cap[0]}.{cap[1]}' if cap else 'unknown'}"] if row.min_cc or row.arch_floors else []
    return f"{row.what} needs {requirement(name, cap)}; this target has {', '.join(has)}"


def _shown(version: VersionLike | None) -> str:
    if version is None:
        return "unknown"
    if parse_version(version) == _NO_LIMIT:
        return "any"
    return ".".join(map(str, parse_version(version)))


def available(
    name: str,
    frontend: VersionLike | None = None,
    cudnn: VersionLike | None = None,
    cc: str | Capability | None = None,
) -> bool:
    """Whether a target with these versions has ``name`` (an unknown version
    that the feature depends on counts as not having it)."""
    return missing(name, frontend, cudnn, cc) is None


def features(
    frontend: VersionLike | None = None, cudnn: VersionLike | None = None, cc: str | Capability | None = None
) -> frozenset[str]:
    """Every feature of the table this target has."""
    return frozenset(name for name in FEATURES if available(name, frontend, cudnn, cc))


def frontends(first: str, until: str | None = None) -> str:
    """The label of the frontends from ``first``'s floor up to (not including)
    ``until``'s: "1.13+" or "1.10-1.12"."""
    low = feature(first).frontend
    if until is None:
        return f"{low}+"
    major, minor, _ = parse_version(feature(until).frontend or "0")
    return f"{low}-{major}.{minor - 1}" if minor else f"{low} to before {major}.0"


# -- a target as the table reads it -----------------------------------------------

# What a reference target's 0.0.0 stands for: newer than any release the table names.
_NO_LIMIT: Version = (9999, 0, 0)
# The compute capability a reference target is read at: the SM90 GPUs (H100,
# H200) that the cuDNN releases PyTorch bundles run on most.
_REFERENCE_CC: Capability = (9, 0)


def is_reference(target: Any) -> bool:
    """Whether ``target`` is the reference compiler's (gpu ``reference``, compute capability 0.0)."""
    return bool(target.gpu == "reference")


def table_versions(target: Any) -> tuple[str, str, str]:
    """(frontend, cuDNN, compute capability) of ``target`` as the table reads
    them: a GPU's own; a reference target's named versions at compute
    capability 9.0, its 0.0.0 (the default) read as newer than every release,
    so the default reference target has every feature."""
    if not is_reference(target):
        return target.frontend, target.cudnn, target.compute_capability
    newest = ".".join(map(str, _NO_LIMIT))
    frontend = newest if parse_version(target.frontend) == (0, 0, 0) else target.frontend
    cudnn = newest if parse_version(target.cudnn) == (0, 0, 0) else target.cudnn
    return frontend, cudnn, "{}.{}".format(*_REFERENCE_CC)


# -- how a length class serves its shapes --------------------------------------------


@dataclass(frozen=True)
class Mechanism:
    """How a class spec serves real shapes below its maxima on a target:
    ``name`` ``override`` (execute-time shape override) or ``padded``
    (declared at the maxima, the real lengths as the padding mask's seq-len
    tensors, the tensors read where their memory fits the declared strides,
    else copied into a reused buffer); ``serves`` False where neither can
    (exact graphs serve); ``why``, the sentence ``explain`` and ``warm
    --check`` show."""

    name: str
    serves: bool
    why: str

    OVERRIDE: ClassVar[str] = "override"
    PADDED: ClassVar[str] = "padded"
    # What ``padded`` does, in the words explain shows.
    HOW_PADDED: ClassVar[str] = (
        "the graph is declared at the class's maxima with the padding mask, the call's real lengths as its seq-len "
        "tensors; a tensor whose memory already fits the declared strides is read in place, any other is copied "
        "into a buffer of the declared size, reused across calls (counted in copies)"
    )


def class_mechanism(spec: Any, target: Any) -> Mechanism | None:
    """The mechanism that serves the class spec ``spec`` on ``target`` (None
    for an exact spec): execute-time override where the target has it
    (``SHAPE_OVERRIDE``, and ``BIAS_OVERRIDE`` for a bias), else ``padded``
    where it has the padding mask, which every cuDNN graphcache builds for
    does. A spec that asks for ``mechanism: padded`` gets it. Backward
    classes are served by override only."""
    if not spec.is_class:
        return None
    frontend, cudnn, cc = table_versions(target)
    padding = missing(PADDING_MASK, frontend, cudnn, cc)
    if spec.mechanism == Mechanism.PADDED:
        if padding:
            return Mechanism(Mechanism.PADDED, False, f"the spec asks for mechanism padded, and {padding}")
        return Mechanism(Mechanism.PADDED, True, "the spec asks for mechanism padded: " + Mechanism.HOW_PADDED)
    problem = missing(SHAPE_OVERRIDE, frontend, cudnn, cc)
    if problem is None and spec.bias is not None:
        problem = missing(BIAS_OVERRIDE, frontend, cudnn, cc)
    if problem is None:
        return Mechanism(
            Mechanism.OVERRIDE,
            True,
            f"execute-time shape override ({requirement(SHAPE_OVERRIDE)}: {_has(target)} has it): the graph runs "
            "at each call's own shape, reading its tensors where they lie",
        )
    if spec.kind == "backward":
        return Mechanism(
            Mechanism.OVERRIDE, False, f"{problem}, and backward classes have no padded form: exact graphs serve"
        )
    if padding:
        return Mechanism(Mechanism.PADDED, False, f"{problem}, and {padding}: exact graphs serve")
    return Mechanism(Mechanism.PADDED, True, f"no execute-time shape override ({problem}): {Mechanism.HOW_PADDED}")


def _has(target: Any) -> str:
    frontend, cudnn, _ = table_versions(target)
    where = "the reference target's" if is_reference(target) else ""
    return f"{where} cuDNN {_shown(cudnn)} with cudnn-frontend {_shown(frontend)}".lstrip()


def resolved(spec: Any, target: Any) -> Any:
    """``spec`` with the mechanism ``target`` serves it by written in: a class
    spec that leaves it out gets ``mechanism: padded`` where that is the
    target's choice; any other spec is returned as it is. The key covers the
    resolved spec (graphcache.key), so one store holds both kinds of class
    graph for different targets."""
    if not spec.is_class or spec.mechanism is not None:
        return spec
    chosen = class_mechanism(spec, target)
    if chosen is not None and chosen.name == Mechanism.PADDED:
        return spec.replace(mechanism=Mechanism.PADDED)
    return spec


def forms(klass: Any, target: Any) -> list[Any]:
    """The class graphs that may serve the class ``klass`` on ``target``, in
    the order a load tries them: the one the target serves it by, then, where
    that is execute-time override and the target has the padding mask, its
    ``padded`` form (cuDNN may refuse override for one spec: a negative
    entry is not the end of the class). A class naming its mechanism: itself."""
    chosen = class_mechanism(klass, target)
    if chosen is None or chosen.name != Mechanism.OVERRIDE or klass.mechanism is not None or klass.kind == "backward":
        return [klass]
    padded = klass.replace(mechanism=Mechanism.PADDED)
    fallback = class_mechanism(padded, target)
    return [klass, padded] if fallback is not None and fallback.serves else [klass]


# -- known-bad windows ----------------------------------------------------------------


def known_bad(spec: Any, target: Any) -> Window | None:
    """The first window of ``KNOWN_BAD`` that forbids serving ``spec`` (a
    GraphSpec: its ``seq_q``, ``layout``, ``heads_q``, ``heads_kv``) on
    ``target`` (a Target: its ``cudnn`` and ``compute_capability``), else
    None. A target whose versions do not parse is in no window, nor is the
    default reference target (``reference-sm00-cudnn0.0.0-fe0.0.0``): it
    runs torch's SDPA, no cuDNN release at all. A reference target that
    names a cuDNN (GRAPHCACHE_REFERENCE_CUDNN) is read as an SM90 GPU with
    it (``table_versions``), so it walks the windows such a GPU walks."""
    try:
        _, version, capability = table_versions(target)
        cudnn = parse_version(version)
        cc = _cc(capability)
    except TargetError:
        return None
    for row in KNOWN_BAD:
        if _in_window(row, spec, cudnn, cc):
            return row
    return None


def _in_window(row: Window, spec: Any, cudnn: Version, cc: Capability) -> bool:
    if row.cudnn_from is not None and cudnn < parse_version(row.cudnn_from):
        return False
    if row.cudnn_through is not None and cudnn > parse_version(row.cudnn_through):
        return False
    if row.cudnn_below is not None and cudnn >= parse_version(row.cudnn_below):
        return False
    if any(cudnn == parse_version(v) for v in row.except_cudnn):
        return False
    if (row.cc_from is not None and cc < _cc(row.cc_from)) or (row.cc_below is not None and cc >= _cc(row.cc_below)):
        return False
    if row.seq_q is not None and spec.seq_q != row.seq_q:
        return False
    if row.layouts and spec.layout not in row.layouts:
        return False
    gqa = (spec.heads_kv or spec.heads_q) < spec.heads_q
    return row.gqa is None or gqa == row.gqa


def refusal(row: Window, spec: Any, target: Any) -> str:
    """The sentence a refused spec's negative entry carries: what, where, why, from where."""
    return f"{spec.summary()} is not served on {target}: known-bad window {row.name}: {row.what} (source: {row.source})"


def refused(spec: Any, target: Any) -> KnownBad | None:
    """The error (graphcache.errors.KnownBad, an UnsupportedSpec) that
    refuses ``spec`` on ``target`` under a known-bad window, else None."""
    row = known_bad(spec, target)
    return None if row is None else KnownBad(refusal(row, spec, target), row.name)
