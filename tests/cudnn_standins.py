"""Stand-ins for released cudnn-frontend versions, for the build steps a CPU cannot run.

What they stand in for: the frontend's graph API (``cudnn.pygraph``) on a GPU
machine, where every build step runs. Only the parts graphcache's dialect
chain depends on are modelled, and each of those is read from the release,
not invented:

- the module attributes graphcache reads (``WATCHED``) that the release has;
- the exact ``sdpa`` keyword set, and which keywords are required;
- where an unknown keyword raises ``TypeError``, and with which message.

Sources (read 2026-11-30 from the wheels on PyPI, ``pip download --no-deps
nvidia-cudnn-frontend==X``):
- 1.3.0, 1.5.0, 1.7.0, 1.9.0, 1.10.0, 1.12.0, 1.24.0: the pybind docstring
  ``cudnn.pygraph.sdpa.__doc__`` (``cudnn/_compiled_module*.so``) and
  ``dir(cudnn)``. The call raises pybind's ``TypeError: sdpa(): incompatible
  function arguments`` for an unknown keyword or a missing required one.
- 1.27.0, 1.28.0, 1.31.0, 1.32.0: ``cudnn/_pygraph.py`` (a pure-Python
  ``pygraph`` whose ``sdpa(self, *args, name, compute_data_type, out_dims,
  **kwargs)`` accepts anything) and the keyword list of the C++ node it
  lowers to, ``cudnn._compiled_module.backend_graph.sdpa.__doc__``. Lowering
  raises the same pybind TypeError. 1.27/1.28 ``validate()`` lowers
  (``_pygraph.py``: ``self._lowered_graph = self._lower_to_cpp()`` at the end
  of ``validate``). 1.31/1.32 ``validate()`` runs a Python-native SDPA
  validator (``cudnn/_sdpa_validate.py``) and ``build_operation_graph()``
  lowers nothing while Python engines are candidates; lowering happens in
  ``create_execution_plans()`` (``_finalize_backend_layout``), which treats
  ``cudnnGraphNotSupportedError``/``RuntimeError``/``ImportError``/
  ``AttributeError`` as a backend decline but lets ``TypeError`` through.

tests/test_frontend_versions.py checks these tables against the real
bindings where scripts/tools/old_frontends.sh has installed them, and
tests/test_compiler_cudnn.py checks the 1.32 table against the installed 1.32.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

# The module attributes graphcache (or its tests) reads; a stand-in has the
# ones its release has, and only those.
WATCHED = (
    "pygraph",
    "data_type",
    "heur_mode",
    "behavior_note",
    "cudnnGraphNotSupportedError",
    "backend_version",
    "backend_version_string",
    "create_handle",
    "set_stream",
    "diagonal_alignment",  # first in 1.10
    "Handle",  # first in 1.28
)

# sdpa keywords per release, in the order of the release's docstring.
SDPA_1_3 = (
    "q",
    "k",
    "v",
    "is_inference",
    "attn_scale",
    "bias",
    "use_alibi_mask",
    "use_padding_mask",
    "seq_len_q",
    "seq_len_kv",
    "use_causal_mask",
    "dropout",
    "rng_dump",
    "compute_data_type",
    "name",
)
# 1.5 adds the bottom-right flag and the causal window (1.7 is read here; 1.5-1.9 alike).
SDPA_1_7 = SDPA_1_3[:11] + ("use_causal_mask_bottom_right", "sliding_window_length") + SDPA_1_3[11:]
# 1.9 adds paged attention.
_PAGED_KV = ("paged_attention_k_table", "paged_attention_v_table", "paged_attention_max_seq_len_kv")
SDPA_1_9 = SDPA_1_7[:15] + _PAGED_KV + SDPA_1_7[15:]
# 1.10 adds the diagonal band (and cudnn.diagonal_alignment); 1.12 also score_mod.
SDPA_1_10 = (
    SDPA_1_9[:13] + ("diagonal_alignment", "diagonal_band_left_bound", "diagonal_band_right_bound") + SDPA_1_9[13:]
)
SDPA_1_12 = SDPA_1_10 + ("score_mod",)
# 1.13 adds generate_stats (1.24 read here); is_inference becomes optional.
SDPA_1_24 = (
    SDPA_1_12[:6]
    + ("block_mask",)
    + SDPA_1_12[6:]
    + ("generate_stats", "implementation", "score_max", "score_sum_exp", "sink_token", "unfuse_fma")
)
SDPA_1_27 = SDPA_1_24 + ("cu_seq_len_q", "cu_seq_len_kv")
_PAGED = SDPA_1_27.index("paged_attention_max_seq_len_kv") + 1
SDPA_1_28 = SDPA_1_27[:_PAGED] + ("max_total_seq_len_q", "max_total_seq_len_kv") + SDPA_1_27[_PAGED:]
SDPA_1_31 = SDPA_1_28 + ("stats_use_log2",)

_BASE_ATTRS = frozenset(WATCHED) - {"diagonal_alignment", "Handle"}


@dataclass(frozen=True)
class Release:
    """What one released frontend offers the dialect chain."""

    version: str
    sdpa_keywords: tuple[str, ...]
    required: frozenset[str]
    attrs: frozenset[str]
    # Where an unknown (or missing required) sdpa keyword raises TypeError:
    # "sdpa" (pybind, at the call), "validate" or "create_execution_plans"
    # (the lazy Python pygraph, when it lowers to C++).
    refuses_at: str
    source: str
    deserialize_takes_handle: bool = True  # deserialize(handle, data) from 1.14
    deserialize_enforce: bool = False  # deserialize(..., enforce_precompiled=) from 1.26
    serialize_as_bytes: bool = False  # serialize(as_bytes=True) from 1.32


RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release(
            "1.3.0",
            SDPA_1_3,
            frozenset({"q", "k", "v", "is_inference"}),
            _BASE_ATTRS,
            "sdpa",
            "nvidia-cudnn-frontend 1.3.0 wheel: cudnn.pygraph.sdpa.__doc__",
            deserialize_takes_handle=False,
        ),
        Release(
            "1.5.0",
            SDPA_1_7,
            frozenset({"q", "k", "v", "is_inference"}),
            _BASE_ATTRS,
            "sdpa",
            "nvidia-cudnn-frontend 1.5.0 wheel: cudnn.pygraph.sdpa.__doc__, dir(cudnn)",
            deserialize_takes_handle=False,
        ),
        Release(
            "1.7.0",
            SDPA_1_7,
            frozenset({"q", "k", "v", "is_inference"}),
            _BASE_ATTRS,  # no diagonal_alignment: it is new in 1.10
            "sdpa",
            "nvidia-cudnn-frontend 1.7.0 wheel: cudnn.pygraph.sdpa.__doc__, dir(cudnn)",
            deserialize_takes_handle=False,
        ),
        Release(
            "1.9.0",
            SDPA_1_9,
            frozenset({"q", "k", "v", "is_inference"}),
            _BASE_ATTRS,  # the last release without diagonal_alignment
            "sdpa",
            "nvidia-cudnn-frontend 1.9.0 wheel: cudnn.pygraph.sdpa.__doc__, dir(cudnn)",
            deserialize_takes_handle=False,
        ),
        Release(
            "1.10.0",
            SDPA_1_10,
            frozenset({"q", "k", "v", "is_inference"}),
            _BASE_ATTRS | {"diagonal_alignment"},
            "sdpa",
            "nvidia-cudnn-frontend 1.10.0 wheel: cudnn.pygraph.sdpa.__doc__, dir(cudnn)",
            deserialize_takes_handle=False,
        ),
        Release(
            "1.12.0",
            SDPA_1_12,
            frozenset({"q", "k", "v", "is_inference"}),
            _BASE_ATTRS | {"diagonal_alignment"},
            "sdpa",
            "nvidia-cudnn-frontend 1.12.0 wheel: cudnn.pygraph.sdpa.__doc__",
            deserialize_takes_handle=False,
        ),
        Release(
            "1.24.0",
            SDPA_1_24,
            frozenset({"q", "k", "v"}),
            _BASE_ATTRS | {"diagonal_alignment"},
            "sdpa",
            "nvidia-cudnn-frontend 1.24.0 wheel: cudnn.pygraph.sdpa.__doc__",
        ),
        Release(
            "1.27.0",
            SDPA_1_27,
            frozenset({"q", "k", "v"}),
            _BASE_ATTRS | {"diagonal_alignment"},
            "validate",
            "nvidia-cudnn-frontend 1.27.0 wheel: cudnn/_pygraph.py, backend_graph.sdpa.__doc__",
            deserialize_enforce=True,
        ),
        Release(
            "1.28.0",
            SDPA_1_28,
            frozenset({"q", "k", "v"}),
            _BASE_ATTRS | {"diagonal_alignment", "Handle"},
            "validate",
            "nvidia-cudnn-frontend 1.28.0 wheel: cudnn/_pygraph.py, backend_graph.sdpa.__doc__",
            deserialize_enforce=True,
        ),
        Release(
            "1.31.0",
            SDPA_1_31,
            frozenset({"q", "k", "v"}),
            _BASE_ATTRS | {"diagonal_alignment", "Handle"},
            "create_execution_plans",
            "nvidia-cudnn-frontend 1.31.0 wheel: cudnn/_pygraph.py, cudnn/_sdpa_validate.py",
            deserialize_enforce=True,
        ),
        Release(
            "1.32.0",
            SDPA_1_31,
            frozenset({"q", "k", "v"}),
            _BASE_ATTRS | {"diagonal_alignment", "Handle"},
            "create_execution_plans",
            "nvidia-cudnn-frontend 1.32.0 wheel: cudnn/_pygraph.py, cudnn/_plan_serdes.py",
            serialize_as_bytes=True,
            deserialize_enforce=True,
        ),
    )
}


def pybind_refusal(function: str, kwargs: dict[str, Any]) -> TypeError:
    """The TypeError pybind11 raises when no overload takes these arguments
    (its first line, as every release above prints it)."""
    return TypeError(
        f"{function}(): incompatible function arguments. The following argument types are supported:\n"
        f"    1. (self, ...)\n\nInvoked with: kwargs: {', '.join(sorted(kwargs))}"
    )


class _Unserializable(TypeError):
    """1.32's ``cudnn._plan_serdes._Unserializable``: a TypeError that is not
    about keywords (a plan holding a value the blob format cannot carry)."""


class Tensor:
    def __init__(self, **attrs: Any) -> None:
        self.attrs = dict(attrs)

    def _set(self, name: str, value: Any) -> Tensor:
        self.attrs[name] = value
        return self

    def set_uid(self, uid: int) -> Tensor:
        return self._set("uid", uid)

    def get_uid(self) -> Any:
        return self.attrs.get("uid")

    def set_output(self, flag: bool) -> Tensor:
        return self._set("output", flag)

    def set_dim(self, dim: list[int]) -> Tensor:
        return self._set("dim", dim)

    def get_dim(self) -> Any:
        return self.attrs.get("dim")

    def set_stride(self, stride: list[int]) -> Tensor:
        return self._set("stride", stride)

    def get_stride(self) -> Any:
        return self.attrs.get("stride")

    def set_data_type(self, dt: Any) -> Tensor:
        return self._set("data_type", dt)


def make_frontend(
    release: Release,
    *,
    keywords: tuple[str, ...] | None = None,
    unserializable: bool = False,
) -> SimpleNamespace:
    """A module-like stand-in for ``release``. ``keywords`` overrides the
    keyword set (for a hypothetical release); ``unserializable`` makes a 1.32
    ``serialize()`` raise its ``_Unserializable`` TypeError."""
    known = frozenset(keywords if keywords is not None else release.sdpa_keywords)
    calls: list[dict[str, Any]] = []
    lowered: list[dict[str, Any]] = []

    def check(kwargs: dict[str, Any]) -> None:
        if set(kwargs) - known or release.required - set(kwargs):
            raise pybind_refusal("sdpa", kwargs)
        lowered.append(kwargs)

    class GraphNotSupported(Exception):
        """Stands in for ``cudnn.cudnnGraphNotSupportedError``."""

    class Graph:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.sdpa_kwargs: dict[str, Any] | None = None

        def tensor(self, **attrs: Any) -> Tensor:
            return Tensor(**attrs)

        def sdpa(self, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
            call = dict(kwargs)
            if release.refuses_at == "sdpa":
                check(call)
            self.sdpa_kwargs = call
            calls.append(call)
            inference = kwargs.get("is_inference")
            if inference is None:
                inference = not kwargs.get("generate_stats")
            return Tensor(), None if inference else Tensor()

        def _lower_at(self, step: str) -> None:
            if release.refuses_at == step and self.sdpa_kwargs is not None:
                kwargs, self.sdpa_kwargs = self.sdpa_kwargs, None  # lowered once
                check(kwargs)

        def validate(self) -> None:
            self._lower_at("validate")

        def build_operation_graph(self) -> None:
            pass

        def create_execution_plans(self, modes: list[Any]) -> None:
            self._lower_at("create_execution_plans")

        def check_support(self) -> None:
            pass

        def build_plans(self) -> None:
            pass

        def get_workspace_size(self) -> int:
            return 0

        def serialize(self, **kwargs: Any) -> Any:
            if kwargs and not release.serialize_as_bytes:
                raise pybind_refusal("serialize", kwargs)
            if unserializable:
                raise _Unserializable("plan.knobs[0] holds a builtins.object, which a serialized plan cannot represent")
            blob = b"standin-plan:" + release.version.encode()
            return blob if kwargs.get("as_bytes") else list(blob)

        def deserialize(self, *args: Any, **kwargs: Any) -> None:
            if len(args) != (2 if release.deserialize_takes_handle else 1) or (
                kwargs and (set(kwargs) != {"enforce_precompiled"} or not release.deserialize_enforce)
            ):
                raise pybind_refusal("deserialize", {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs})

    module: dict[str, Any] = {
        "pygraph": Graph,
        "data_type": SimpleNamespace(HALF="half", BFLOAT16="bf16", FLOAT="float", INT32="int32", INT64="int64"),
        "heur_mode": SimpleNamespace(A="A", FALLBACK="FALLBACK"),
        "behavior_note": SimpleNamespace(RUNTIME_COMPILATION="RUNTIME_COMPILATION"),
        "cudnnGraphNotSupportedError": GraphNotSupported,
        "backend_version": lambda: 92800,
        "backend_version_string": lambda: "9.28.0",
        "create_handle": lambda: object(),
        "set_stream": lambda handle, stream: None,
        "diagonal_alignment": SimpleNamespace(TOP_LEFT="TOP_LEFT", BOTTOM_RIGHT="BOTTOM_RIGHT"),
        "Handle": object,
    }
    attrs = {name: value for name, value in module.items() if name in release.attrs}
    return SimpleNamespace(__version__=release.version, release=release, calls=calls, lowered=lowered, **attrs)


def standin(version: str, **options: Any) -> SimpleNamespace:
    return make_frontend(RELEASES[version], **options)


def fe_1_3() -> SimpleNamespace:
    return standin("1.3.0")


def fe_1_7() -> SimpleNamespace:
    """1.5-1.9: the causal flags, and no ``cudnn.diagonal_alignment``."""
    return standin("1.7.0")


def fe_1_12() -> SimpleNamespace:
    return standin("1.12.0")


def fe_1_24() -> SimpleNamespace:
    return standin("1.24.0")


def fe_1_27() -> SimpleNamespace:
    """1.27-1.30: sdpa() takes any keyword; validate() lowers and refuses."""
    return standin("1.28.0")


def fe_1_32() -> SimpleNamespace:
    """1.31-1.32: validate() does not lower SDPA; create_execution_plans() does."""
    return standin("1.32.0")


def fe_1_27_lazy_old_keywords() -> SimpleNamespace:
    """Hypothetical, no release is like this: 1.28's lazy lowering with only
    1.12's keywords. Every lazy release knows all of graphcache's keywords,
    so this is the one way to see the chain fall back after ``sdpa()``
    accepted a keyword and lowering refused it, which a future keyword will do."""
    return make_frontend(RELEASES["1.28.0"], keywords=SDPA_1_12)


def fe_1_32_lazy_old_keywords() -> SimpleNamespace:
    """Hypothetical like the one above, with 1.32's lowering point."""
    return make_frontend(RELEASES["1.32.0"], keywords=SDPA_1_12)
