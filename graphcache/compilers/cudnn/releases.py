"""What each cudnn-frontend and cuDNN release can do: the one place in the
compiler where version numbers are compared.

``FEATURES`` is the table, one ``Feature`` a row: the oldest frontend and
cuDNN that have it, the compute capabilities it needs, and where the figure
was read (``source``: /work/shared/CUDNN_NOTES.md and its notes/). Callers ask
by name, never by number: ``available(SHAPE_OVERRIDE, "1.32.0", 92800, "9.0")``,
``missing(...)`` for the sentence an UnsupportedSpec carries. A version the
caller does not pass (None) is unknown, and a feature that needs it is not
available.

May import: graphcache.errors and graphcache.target (cuDNN's integer form).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

from graphcache.errors import TargetError
from graphcache.target import cudnn_version_text

Version = tuple[int, int, int]
Capability = tuple[int, int]
VersionLike = str | int | tuple[int, ...]

# -- feature names (a contract: other modules import these) -------------------

FUSED_ATTENTION = "fused_attention"
SERIALIZED_PLANS = "serialized_plans"
BOTTOM_RIGHT_FLAGS = "bottom_right_flags"
BEHAVIOR_NOTE_FILTER = "behavior_note_filter"
DIAGONAL_BAND = "diagonal_band"
GENERATE_STATS = "generate_stats"
DESERIALIZE_HANDLE = "deserialize_handle"
UID_KEYWORD = "uid_keyword"
ENFORCE_PRECOMPILED = "enforce_precompiled"
LAZY_KEYWORDS = "lazy_keywords"
PYTHON_ENGINES = "python_engines"
BYTES_PAYLOAD = "bytes_payload"
PYTHON_ENGINE_BLOBS = "python_engine_blobs"
OVERRIDE_FLAG = "override_flag"
SHAPE_OVERRIDE = "shape_override"
OVERRIDE_WORKSPACE = "override_workspace"
PAGED = "paged"
PACKED_PAGE_TABLES = "packed_page_tables"
RAGGED = "ragged"
RAGGED_OVER_PAGED = "ragged_over_paged"
TOKEN_OFFSETS = "token_offsets"
CU_SEQ_LEN = "cu_seq_len"
CU_SEQ_LEN_MIXED = "cu_seq_len_mixed"
BIAS = "bias"
BIAS_OVERRIDE = "bias_override"


@dataclass(frozen=True)
class ArchFloor:
    """A higher cuDNN floor on GPUs whose compute capability is below ``below``."""

    below: str
    cudnn: str
    source: str


@dataclass(frozen=True)
class Feature:
    """One row of the table. Floors are written as the sources write them
    ("9.18.1", "1.24"); None means the feature does not depend on that part.
    ``attributes`` are the ``cudnn`` module names that first appear with it,
    for code that probes the module instead of its version (the dialects)."""

    name: str
    what: str
    source: str
    frontend: str | None = None
    cudnn: str | None = None
    min_cc: str | None = None
    arch_floors: tuple[ArchFloor, ...] = ()
    attributes: tuple[str, ...] = ()


# "THD (ragged offset) is only supported in Hopper and above" fires only when
# sm < 90 and cuDNN < 9.18.1: SM80/SM89 need 9.18.1, SM90+ have no such gate.
_RAGGED_SM8X = ArchFloor(
    "9.0", "9.18.1", "notes/ragged-paged.md Q1 'Versions and architectures' (sdpa_support_surface.h:346-351)"
)

_ROWS = (
    # -- what graphcache needs at all (CudnnCompiler.preflight) --
    Feature(
        FUSED_ATTENTION,
        "cuDNN fused attention",
        "notes/ragged-paged.md Q2 'Architecture: SM80+' (the samples assert major >= 8)",
        min_cc="8.0",
    ),
    Feature(
        SERIALIZED_PLANS,
        "a serialized SDPA plan",
        "CUDNN_NOTES 'Packages' and 'Serialization': graphcache's plans are cuDNN 9.x runtime plans",
        cudnn="9.0",
    ),
    # -- SDPA keyword generations (dialects.py) --
    Feature(
        BOTTOM_RIGHT_FLAGS,
        "sdpa(use_causal_mask_bottom_right=, sliding_window_length=)",
        "CUDNN_NOTES 'Checked against the released bindings': 1.5 adds them",
        frontend="1.5",
    ),
    Feature(
        DIAGONAL_BAND,
        "sdpa(diagonal_alignment=) with band bounds",
        "CUDNN_NOTES 'Checked against the released bindings': cudnn.diagonal_alignment first exists in 1.10",
        frontend="1.10",
        attributes=("diagonal_alignment",),
    ),
    Feature(
        GENERATE_STATS,
        "sdpa(generate_stats=)",
        "CUDNN_NOTES 'SDPA keywords by frontend generation': 1.13 replaces is_inference",
        frontend="1.13",
    ),
    Feature(
        LAZY_KEYWORDS,
        "the Python pygraph (an unknown keyword fails only at lowering)",
        "CUDNN_NOTES 'SDPA keywords': from 1.27 cudnn.pygraph is pure Python",
        frontend="1.27",
    ),
    # -- building (build.py) --
    Feature(
        BEHAVIOR_NOTE_FILTER,
        "select_behavior_notes(RUNTIME_COMPILATION)",
        # CUDNN_NOTES says "bound from 1.5", but the real 1.3.0 binding has
        # pygraph.select_behavior_notes and behavior_note.RUNTIME_COMPILATION.
        "the 1.3.0 wheel (tests/test_frontend_versions.py); 1.3 is the oldest release checked",
        frontend="1.3",
        attributes=("behavior_note",),
    ),
    Feature(
        UID_KEYWORD,
        "graph.tensor(uid=)",
        "CUDNN_NOTES 'Build and execute': uid= keyword from 1.14, .set_uid() on every version",
        frontend="1.14",
    ),
    Feature(
        PYTHON_ENGINES,
        "a Python (CuTe DSL) engine (graph.selected_engine)",
        "CUDNN_NOTES 'Checked against the released bindings': 1.31/1.32 ship Python SDPA engines",
        frontend="1.31",
    ),
    # -- the stored blob (serialize.py) --
    Feature(
        DESERIALIZE_HANDLE,
        "deserialize(handle, data)",
        "CUDNN_NOTES 'Serialization': handle argument from 1.14",
        frontend="1.14",
    ),
    Feature(
        ENFORCE_PRECOMPILED,
        "deserialize(enforce_precompiled=)",
        "CUDNN_NOTES 'Serialization': enforce_precompiled= from 1.26",
        frontend="1.26",
    ),
    Feature(
        BYTES_PAYLOAD,
        "serialize(as_bytes=True) (and bytes to deserialize)",
        "CUDNN_NOTES 'Serialization': 1.32 adds as_bytes and takes bytes; 1.23 and earlier refuse bytes",
        frontend="1.32",
    ),
    Feature(
        PYTHON_ENGINE_BLOBS,
        "serialize() of a Python-engine plan",
        "CUDNN_NOTES 'Checked against the released bindings': 1.32 emits a CUDNN_FE_PYPLAN blob",
        frontend="1.32",
    ),
    # -- execute-time shape override (length classes) --
    Feature(
        OVERRIDE_FLAG,
        "pygraph(is_override_shape_enabled=)",
        "notes/shape-classes.md §2: frontend v1.20.0, 'Override shape support requires cudnn 9.21.0 and above'",
        frontend="1.20",
        cudnn="9.21",
    ),
    Feature(
        SHAPE_OVERRIDE,
        "execute-time shape override",
        "notes/shape-classes.md §1 'Pitfall' and §2: Python execute() drops the override lists in 1.18-1.23, "
        "forwards them from 1.24; the flag needs cuDNN 9.21.0",
        frontend="1.24",
        cudnn="9.21",
    ),
    Feature(
        OVERRIDE_WORKSPACE,
        "get_workspace_size(override_shapes=)",
        "notes/shape-classes.md §1 'Workspace with overrides': 'Runtime workspace query with override shapes "
        "requires cuDNN v9.23.0' (W124, W132)",
        frontend="1.24",
        cudnn="9.23",
    ),
    # -- an additive score bias (attn_mask tensors) --
    Feature(
        BIAS,
        "sdpa(bias=), an additive score bias",
        "cudnn-frontend v1.0.0 python_bindings/pygraph/sdpa.cpp (bias=) and the flash node's pointwise ADD; "
        "its test_mhas.py runs a (1, h, s_q, s_kv) bias from cuDNN 8.9.3; graphcache's plans need 9.0",
        frontend="1.0",
        cudnn="9.0",
    ),
    Feature(
        BIAS_OVERRIDE,
        "a bias under execute-time shape override",
        "1.32 wheel node/sdpa_support_surface.h: the unified SDPA node (the override engine, "
        "notes/shape-classes.md §2) takes a Bias input from cuDNN 9.21.0; override itself needs FE 1.24",
        frontend="1.24",
        cudnn="9.21",
    ),
    # -- ragged and paged (serving engines) --
    Feature(
        PAGED,
        "a paged K/V cache",
        "notes/ragged-paged.md Q2 'Versions and architectures': cuDNN >= 9.5.0 at compile and run time, FE >= 1.8",
        frontend="1.8",
        cudnn="9.5",
        min_cc="8.0",
    ),
    Feature(
        PACKED_PAGE_TABLES,
        "a packed (ragged-offset) page table",
        "notes/ragged-paged.md Q2 'Packed (ragged) page tables': cuDNN >= 9.10.2, FE v1.12",
        frontend="1.12",
        cudnn="9.10.2",
        min_cc="8.0",
    ),
    Feature(
        RAGGED,
        "a ragged (THD) layout",
        "notes/ragged-paged.md Q1 'Versions and architectures': FE v1.1, "
        "CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC requires cudnn 8.9",
        frontend="1.1",
        cudnn="8.9",
        min_cc="8.0",
        arch_floors=(_RAGGED_SM8X,),
    ),
    Feature(
        RAGGED_OVER_PAGED,
        "ragged q over a paged K/V cache",
        "notes/ragged-paged.md Q2 'Combinations': allowed from cuDNN 9.7.0 (FE v1.11 notes); "
        "notebook 52 reports packed q unreliable before 9.10.0",
        frontend="1.11",
        cudnn="9.7",
        min_cc="8.0",
        arch_floors=(_RAGGED_SM8X,),
    ),
    Feature(
        TOKEN_OFFSETS,
        "set_ragged_offset_multiplier (token-unit ragged offsets)",
        "notes/ragged-paged.md Q1 'Token-unit offsets': cuDNN 9.24.0, FE 1.25 (PR #300); unified fprop only",
        frontend="1.25",
        cudnn="9.24",
        min_cc="8.0",
        arch_floors=(_RAGGED_SM8X,),
    ),
    Feature(
        CU_SEQ_LEN,
        "sdpa(cu_seq_len_q=, cu_seq_len_kv=) prefix sums",
        "notes/ragged-paged.md Q1 'Mandatory companions' (cuDNN 9.24+, unified) and Q5 FlashInfer / PyTorch "
        "#194906 (FE >= 1.25)",
        frontend="1.25",
        cudnn="9.24",
        min_cc="8.0",
    ),
    Feature(
        CU_SEQ_LEN_MIXED,
        "cu_seq_len on one side with seq_len on the other",
        "notes/ragged-paged.md Q1 'Mandatory companions' (9.25+ for different forms) and Q5 FlashInfer "
        "_cudnn_supports_direct_seqlens (FE >= 1.27)",
        frontend="1.27",
        cudnn="9.25",
        min_cc="8.0",
    ),
)

FEATURES: Mapping[str, Feature] = MappingProxyType({row.name: row for row in _ROWS})

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
    return "unknown" if version is None else ".".join(map(str, parse_version(version)))


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
