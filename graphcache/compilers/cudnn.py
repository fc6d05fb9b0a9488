"""The cuDNN SDPA compiler: build, serialize, deserialize, execute.

The frontend's SDPA keywords changed across versions (CUDNN_NOTES.md). The
dialect chain tries the newest keyword set first and falls back when the
frontend lacks a name the dialect needs or refuses one of its sdpa()
keywords (any other TypeError is a BuildError), each dialect expressing the
spec's mask exactly or declining: a
causal mask is never dropped to make an old frontend happy. Frontends from
1.27 accept unknown keywords at ``sdpa()`` and fail only when the graph is
lowered, so one attempt covers the whole build, not one call.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphcache.artifact import Artifact
from graphcache.errors import (
    BuildError,
    ExecutionError,
    NoGpu,
    NotSerializable,
    PlanRejected,
    TargetMismatch,
    UnsupportedGpu,
    UnsupportedSpec,
)
from graphcache.recipe import RECIPE_VERSION
from graphcache.spec import GraphSpec
from graphcache.target import Target, runtime_info
from graphcache.uids import UidMap

log = logging.getLogger(__name__)

__all__ = ["RECIPE_VERSION", "CudnnCompiler", "CudnnGraph", "build_graph", "classify_failure"]

MIN_COMPUTE_CAPABILITY = (8, 0)
MIN_CUDNN_SERIALIZE = 90000  # serialized SDPA plans need cuDNN 9.x
_IO_TYPES = {"float16": "HALF", "bfloat16": "BFLOAT16"}
TRANSIENT = ("OUT OF MEMORY", "ALLOC_FAILED")
# Words of failures that belong to this host, not to the spec: a missing
# driver, NVRTC or sub-library, a driver too old, a CUDA or launch error, an
# internal error. They win over the exception's type: frontend 1.32 on a host
# with no driver reports its backend's failure as cudnnGraphNotSupportedError
# ("no engine proposed a plan ... the backend declined: "cuda" is an NVIDIA
# driver library ...").
ENVIRONMENT = re.compile(
    r"driver|nvrtc|sublibrary_loading_failed|runtime_prerequisite_missing|unable to find symbol"
    r"|can only be found via system search|cuda_get_device|internal_error|execution_failed|mapping_error"
    r"|cuda ?error|cudaerror|cuda_error_|invalid resource handle|illegal (memory )?address|launch failure"
    r"|no cuda|no gpu|device is none|out of memory|alloc_failed",
    re.IGNORECASE,
)
# Steps whose "not supported" is a verdict on the graph. Up to 1.23 (and in
# the pybind releases after it) the bindings raise cudnnGraphNotSupportedError
# also for HEURISTIC_QUERY_FAILED and GRAPH_EXECUTION_PLAN_CREATION_FAILED
# (python/pycudnn.cpp, v1.14.0), and build_plans fails with "No valid execution
# plans built" when every plan failed to compile (NVRTC, libcuda, memory):
# those cannot be told apart from a failing host, so they are never recorded.
# Frontends 1.31+ say at create_execution_plans why the backend declined
# (pygraph._backend_declined), which is trusted instead.
VERDICT_STEPS = ("validate", "build_operation_graph", "check_support")


# -- dialects -------------------------------------------------------------


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


DIALECTS: tuple[Dialect, ...] = (
    Dialect("diagonal_band", "1.13+", _newest, requires=("diagonal_alignment",)),
    Dialect("diagonal_band_is_inference", "1.10-1.12", _band_is_inference, requires=("diagonal_alignment",)),
    Dialect("causal_flags", "1.5-1.9", _causal_flags),
)

# pybind11's overload failure for the C++ sdpa(): raised at the call by
# frontends before 1.27, and by 1.27+ when their Python graph is lowered (at
# validate() in 1.27-1.30, at create_execution_plans() in 1.31+). Read from
# each release's wheel (docs/frontends.md); other TypeErrors (1.32's
# _plan_serdes._Unserializable, a wrong argument type) are not refusals.
KEYWORD_REFUSAL = "sdpa(): incompatible function arguments"


def refuses_keywords(exc: BaseException) -> bool:
    """Whether ``exc`` is the frontend refusing the dialect's sdpa() keywords."""
    return isinstance(exc, TypeError) and str(exc).lstrip().startswith(KEYWORD_REFUSAL)


BUILD_STEPS = (
    "validate",
    "build_operation_graph",
    "create_execution_plans",
    "check_support",
    "build_plans",
)


@dataclass
class BuiltGraph:
    """A frontend graph after the dialect chain, with its tensors and timings."""

    graph: Any
    tensors: dict[str, Any]
    dialect: str
    timings: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def _backend_version(cudnn: Any) -> str:
    try:
        return str(cudnn.backend_version_string())
    except Exception:  # noqa: BLE001 - no runtime (CPU) or an old frontend
        return "(version unknown)"


def frontend_version(cudnn: Any) -> str:
    return str(getattr(cudnn, "__version__", "unknown"))


def build_graph(
    cudnn: Any,
    spec: GraphSpec,
    uids: UidMap | None = None,
    handle: Any = None,
    *,
    lower: bool = True,
    dialects: tuple[Dialect, ...] = DIALECTS,
) -> BuiltGraph:
    """Construct (and with ``lower``, build plans for) the spec's SDPA graph.

    Without ``lower`` only ``validate()`` runs: what a machine with no GPU can
    check. Raises UnsupportedSpec when no dialect of this frontend can
    express the spec's mask (or cuDNN says not supported), and BuildError
    for a failure that is no verdict on the spec (this host, or a bug).
    """
    uids = uids or UidMap.default()
    tried: list[str] = []
    skipped: list[str] = []
    for dialect in dialects:
        missing = dialect.missing(cudnn)
        if missing:
            names = ", ".join(f"cudnn.{attr}" for attr in missing)
            skipped.append(f"{dialect.name} (cudnn-frontend {frontend_version(cudnn)} has no {names})")
            continue
        try:
            kwargs = dialect.kwargs(cudnn, spec)
        except AttributeError as exc:
            if not _frontend_lacks(cudnn, exc):
                # graphcache's own mistake: never a verdict on the spec.
                raise BuildError(f"dialect {dialect.name} failed on {spec.summary()}: {exc!r}") from exc
            # A name the dialect reads that ``requires`` did not list: still a
            # frontend that does not speak this dialect, never a crash of the chain.
            skipped.append(f"{dialect.name} (cudnn-frontend {frontend_version(cudnn)} lacks a name it needs: {exc})")
            continue
        if kwargs is None:
            skipped.append(f"{dialect.name} (cannot express mask {spec.mask!r} exactly)")
            continue
        try:
            graph, tensors, timings = _construct(cudnn, spec, uids, handle, kwargs, lower)
        except TypeError as exc:
            if not refuses_keywords(exc):
                raise BuildError(
                    f"cudnn-frontend {frontend_version(cudnn)} raised a TypeError building {spec.summary()} "
                    f"with dialect {dialect.name} that is not a refused sdpa() keyword, so the spec is not "
                    f"recorded as unsupported: {_first_line(exc)}"
                ) from exc
            tried.append(f"{dialect.name}: {str(exc).splitlines()[0][:200]}")
            log.info("dialect %s refused by frontend %s: %s", dialect.name, frontend_version(cudnn), exc)
            continue
        return BuiltGraph(graph, tensors, dialect.name, timings, skipped + tried)
    raise UnsupportedSpec(
        f"cudnn-frontend {frontend_version(cudnn)} cannot express mask {spec.mask!r} "
        f"for {spec.summary()}; tried: {'; '.join(tried) or 'none'}"
        + (f"; skipped: {'; '.join(skipped)}" if skipped else "")
        + ". Upgrade nvidia-cudnn-frontend or use the torch fallback."
    )


def _construct(
    cudnn: Any,
    spec: GraphSpec,
    uids: UidMap,
    handle: Any,
    mask_kwargs: dict[str, Any],
    lower: bool,
) -> tuple[Any, dict[str, Any], dict[str, float]]:
    dt = cudnn.data_type
    io_type = getattr(dt, _IO_TYPES[spec.dtype])
    graph_kwargs: dict[str, Any] = {
        "io_data_type": io_type,
        "intermediate_data_type": dt.FLOAT,
        "compute_data_type": dt.FLOAT,
    }
    if handle is not None:
        graph_kwargs["handle"] = handle
    graph = cudnn.pygraph(**graph_kwargs)
    tensors: dict[str, Any] = {}

    def add(role: str, dims: tuple[int, ...], strides: tuple[int, ...], data_type: Any) -> Any:
        t = graph.tensor(name=role, dim=list(dims), stride=list(strides), data_type=data_type)
        t.set_uid(uids[role])
        tensors[role] = t
        return t

    for role in ("q", "k", "v"):
        add(role, spec.dims(role), spec.strides(role), io_type)
    kwargs: dict[str, Any] = {"attn_scale": spec.attn_scale, **mask_kwargs}
    if spec.padding:
        kwargs["use_padding_mask"] = True
        for role in ("seq_len_q", "seq_len_kv"):
            kwargs[role] = add(role, spec.dims(role), spec.strides(role), dt.INT32)
    if spec.dropout:
        seed = add("dropout_seed", (1, 1, 1, 1), (1, 1, 1, 1), dt.INT64)
        offset = add("dropout_offset", (1, 1, 1, 1), (1, 1, 1, 1), dt.INT64)
        kwargs["dropout"] = (spec.dropout, seed, offset)
    o, stats = graph.sdpa(name="sdpa", q=tensors["q"], k=tensors["k"], v=tensors["v"], **kwargs)
    o.set_output(True).set_dim(list(spec.dims("o"))).set_stride(list(spec.strides("o")))
    o.set_uid(uids["o"])
    tensors["o"] = o
    if spec.generate_stats:
        if stats is None:
            raise UnsupportedSpec("the frontend returned no stats tensor for generate_stats=true")
        stats.set_output(True).set_data_type(dt.FLOAT)
        stats.set_dim(list(spec.dims("stats"))).set_stride(list(spec.strides("stats")))
        stats.set_uid(uids["stats"])
        tensors["stats"] = stats
    timings: dict[str, float] = {}
    steps = BUILD_STEPS if lower else BUILD_STEPS[:1]
    for step in steps:
        start = time.perf_counter()
        try:
            if step == "create_execution_plans":
                _exclude_python_engines(graph)
                graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                _keep_runtime_compiled(cudnn, graph)
            else:
                getattr(graph, step)()
        except TypeError as exc:
            if refuses_keywords(exc):
                raise  # an unknown keyword at lowering: the dialect chain tries the next one
            raise classify_failure(cudnn, spec, step, exc, graph) from exc
        except Exception as exc:  # noqa: BLE001 - cuDNN's errors have many types; classify_failure sorts them
            raise classify_failure(cudnn, spec, step, exc, graph) from exc
        timings[step] = time.perf_counter() - start
    return graph, tensors, timings


def _frontend_lacks(cudnn: Any, exc: AttributeError) -> bool:
    """Whether ``exc`` is the frontend missing a name (on the module or on one
    of its types), rather than a mistake in graphcache's own code."""
    owner = getattr(exc, "obj", None)
    if owner is cudnn:
        return True
    module = owner.__name__ if isinstance(owner, types.ModuleType) else getattr(owner, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] == "cudnn"


def python_engines(graph: Any) -> list[str]:
    """Names of the Python (CuTe DSL) engines frontends 1.31+ may pick for
    this graph; [] where there are none or they cannot be listed."""
    if not hasattr(graph, "deselect_engines") or not hasattr(type(graph), "selected_engine"):
        return []  # before 1.31: no Python engines
    try:
        from cudnn.engines import manifest  # type: ignore[import-not-found]

        return sorted({str(engine.name) for engine in manifest.engines_for(graph)})
    except Exception:  # noqa: BLE001 - a release without the manifest: serialization_refusal still guards
        return []


def _exclude_python_engines(graph: Any) -> None:
    """Keep Python-engine plans out of the cache. Their 1.32 blobs carry
    kernels that load only where the CUDA driver is exactly the builder's
    (frost/compiled_cache.py compares an environment manifest that includes
    cuda_driver), which the key does not cover, and 1.31 cannot serialize
    them at all; whether one is picked also depends on CuTe DSL importing on
    the builder. Backend (runtime-compiled) plans have none of these ties."""
    names = python_engines(graph)
    if names:
        graph.deselect_engines(names)


def _keep_runtime_compiled(cudnn: Any, graph: Any) -> None:
    """Keep only plans of runtime-compiled engines: the ones cuDNN can
    serialize. Needs plans to exist (a filter set on an empty plan list marks
    nothing), so it runs right after create_execution_plans, before
    check_support. Frontends without behavior notes (before 1.5) keep all."""
    notes = getattr(cudnn, "behavior_note", None)
    select = getattr(graph, "select_behavior_notes", None)
    if notes is not None and select is not None and hasattr(notes, "RUNTIME_COMPILATION"):
        select([notes.RUNTIME_COMPILATION])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:400] if text else type(exc).__name__


def _is_not_supported(cudnn: Any, exc: BaseException) -> bool:
    kind = getattr(cudnn, "cudnnGraphNotSupportedError", None)
    if isinstance(kind, type) and isinstance(exc, kind):
        return True
    return "NOT_SUPPORTED" in str(exc).upper()


def classify_failure(
    cudnn: Any, spec: GraphSpec, step: str, exc: BaseException, graph: Any = None
) -> BuildError | UnsupportedSpec:
    """What a failure at a build step means for the cache.

    UnsupportedSpec (stored as a negative entry for the whole target) only
    when cuDNN gave its verdict that the graph is not supported: the
    not-supported error, at a step whose refusal is a verdict (validate,
    build_operation_graph, check_support; create_execution_plans on 1.31+
    when the backend itself declined with that error), and no word of a
    failing host. Everything else is a BuildError, reported and never stored.
    """
    text = _first_line(exc)
    # The whole message, not its first line: the backend's reason comes last.
    words = str(exc)
    versions = f"cuDNN {_backend_version(cudnn)}, cudnn-frontend {frontend_version(cudnn)}"
    if any(word in words.upper() for word in TRANSIENT):
        # Out of memory is about this moment, not this spec.
        return BuildError(f"cuDNN ran out of memory building {spec.summary()} at {step}: {text}")
    host = BuildError(
        f"building {spec.summary()} failed at {step} because of this host ({versions}): {text}. "
        "Not recorded as unsupported: check the driver, NVRTC and cuDNN libraries here (graphcache doctor)."
    )
    if ENVIRONMENT.search(words):
        return host
    declined = getattr(graph, "_backend_declined", None) if graph is not None else None
    if declined is not None and not _is_not_supported(cudnn, declined):
        # 1.31+ fold any backend failure (a RuntimeError from a failing
        # device included) into "no engine proposed a plan".
        return host
    verdict = step in VERDICT_STEPS or (step == "create_execution_plans" and declined is not None)
    if _is_not_supported(cudnn, exc) and verdict:
        return UnsupportedSpec(f"{versions} does not support {spec.summary()}: refused at {step}: {text}", step=step)
    return BuildError(
        f"building {spec.summary()} failed at {step} ({versions}): {type(exc).__name__}: {text}. "
        "Not recorded as unsupported (cuDNN's answer at this step cannot be told apart from a failing "
        "host); report it if it repeats."
    )


# -- payload forms -----------------------------------------------------------


def payload_bytes(serialized: Any) -> bytes:
    """Normalise what ``serialize()`` returned (list of ints, bytes, bytearray)."""
    if isinstance(serialized, bytes):
        return serialized
    if isinstance(serialized, (bytearray, memoryview)):
        return bytes(serialized)
    if isinstance(serialized, (list, tuple)):
        return bytes(serialized)
    raise NotSerializable(f"serialize() returned {type(serialized).__name__}, not bytes or a list of ints")


def _version_tuple(frontend: str) -> tuple[int, int]:
    try:
        major, minor = (int(p) for p in frontend.split("+")[0].split(".")[:2])
    except ValueError:
        return (0, 0)
    return major, minor


def payload_for_frontend(payload: bytes, frontend: str) -> Any:
    """What this frontend's ``deserialize`` takes: bytes from 1.32 (where it
    avoids building a list), a list of ints before (1.23 refuses bytes)."""
    payload = bytes(payload)
    return payload if _version_tuple(frontend) >= (1, 32) else list(payload)


def deserialize_into(graph: Any, handle: Any, payload: bytes, frontend: str) -> None:
    """``graph.deserialize`` in the form this frontend takes: the handle from
    1.14, ``enforce_precompiled=True`` from 1.26 (a blob that would need
    NVRTC to recompile fails instead of recompiling behind the cache's back)."""
    data = payload_for_frontend(payload, frontend)
    version = _version_tuple(frontend)
    if version >= (1, 26):
        graph.deserialize(handle, data, enforce_precompiled=True)
    elif version >= (1, 14):
        graph.deserialize(handle, data)
    else:
        graph.deserialize(data)


def engine_name(graph: Any) -> str:
    """The engine of the selected plan: a Python (CuTe DSL) engine's name on
    frontends 1.31+, else 'cudnn-backend'."""
    try:
        engine = graph.selected_engine  # 1.31+: None when the backend serves the plan
    except Exception:  # noqa: BLE001 - older frontends lack it
        engine = None
    if engine is None:
        return "cudnn-backend"
    return str(getattr(engine, "name", type(engine).__name__))


def serialization_refusal(engine: str, frontend: str) -> str | None:
    """Why a plan of ``engine`` is not cached, or None.

    Python (CuTe DSL) engines appear in 1.31 and are deselected before
    planning (``_exclude_python_engines``); this is the guard behind that,
    for a plan that got one anyway (a release whose engine list cannot be
    read). 1.31's ``serialize()`` writes the backend graph without the
    selected Python plan, a blob that would rebuild (or fail) at every load;
    1.32's writes kernels that load only under the builder's exact CUDA
    driver, which the key does not cover.
    """
    if engine == "cudnn-backend":
        return None
    if _version_tuple(frontend) < (1, 32):
        return (
            f"cuDNN chose the Python engine {engine}, whose plans cudnn-frontend {frontend} cannot serialize: "
            "not cacheable with this frontend"
        )
    return (
        f"cuDNN chose the Python engine {engine}, whose serialized kernels load only under the builder's "
        "exact CUDA driver, which the key does not cover: not cacheable"
    )


# -- the compiler --------------------------------------------------------------


class CudnnCompiler:
    """Builds SDPA graphs with cuDNN on this machine's GPU and loads them back.

    ``cudnn_module`` lets a test hand in a stand-in for the frontend; by
    default ``import cudnn`` happens on first use, so importing graphcache
    never needs torch or cudnn. ``canary`` (default: GRAPHCACHE_CANARY, on)
    runs every loaded plan once on the canary input and refuses it when its
    output differs from what the build recorded.

    One cuDNN handle per compiler: builds, loads and executions take turns
    on it (a handle is not safe to use from two threads at once).
    """

    name = "cudnn"

    def __init__(
        self,
        device: int = 0,
        *,
        check_reference: bool = True,
        canary: bool | None = None,
        cudnn_module: Any = None,
    ) -> None:
        if canary is None:
            from graphcache.settings import Settings

            canary = Settings.from_env().canary
        self.device = device
        self.check_reference = check_reference
        self.canary = canary
        self._cudnn = cudnn_module
        self._handle: Any = None
        self._stream: Any = None
        self._target: Target | None = None
        self._lock = threading.RLock()

    # environment ------------------------------------------------------------

    def cudnn(self) -> Any:
        if self._cudnn is None:
            try:
                import cudnn  # type: ignore[import-not-found]
            except ImportError as exc:
                raise NoGpu("nvidia-cudnn-frontend is not installed: pip install 'graphcache[gpu]'") from exc
            self._cudnn = cudnn
        return self._cudnn

    def target(self) -> Target:
        """This machine's target (cached). Raises NoGpu."""
        if self._target is None:
            self._target = Target.detect(self.device)
        return self._target

    def preflight(self) -> None:
        """Raise a typed error saying what was found and what is needed."""
        import torch

        target = self.target()
        major, minor = (int(x) for x in target.compute_capability.split("."))
        if (major, minor) < MIN_COMPUTE_CAPABILITY:
            raise UnsupportedGpu(
                f"cuDNN fused attention needs a GPU with compute capability >= 8.0; found "
                f"{target.compute_capability} ({torch.cuda.get_device_name(self.device)})"
            )
        version = int(self.cudnn().backend_version())
        if version < MIN_CUDNN_SERIALIZE:
            raise UnsupportedGpu(
                f"serialized SDPA plans need cuDNN >= 9.0; found {target.cudnn}: install nvidia-cudnn-cu12 9.x"
            )

    def handle(self) -> Any:
        """The handle, bound to the current CUDA stream of this device.

        Call with the lock held: the stream is set again whenever the
        caller's current stream differs from the last one set, so work is
        always queued on the stream the caller's tensors were made on.
        """
        import torch

        cudnn = self.cudnn()
        if self._handle is None:
            # Created with this GPU current, without changing the caller's device.
            with torch.cuda.device(self.device):
                self._handle = cudnn.create_handle()
        stream = torch.cuda.current_stream(self.device)
        if stream.cuda_stream != self._stream:
            cudnn.set_stream(handle=self._handle, stream=stream.cuda_stream)
            self._stream = stream.cuda_stream
        return self._handle

    # build ------------------------------------------------------------------

    def build(self, spec: GraphSpec, target: Target | None = None, uids: UidMap | None = None) -> Artifact:
        """Build, serialize, deserialize and check one graph on this GPU.

        What is checked is what is stored: the serialized blob is loaded
        into a fresh graph, which runs against the float32 reference and
        gives the numerical canary. Raises NoGpu, UnsupportedGpu,
        TargetMismatch (asked to build for another target), UnsupportedSpec
        (cuDNN said not supported), NotSerializable (no serializable plan,
        or a blob that does not load back), and BuildError (anything about
        this host, or an output that disagrees with the reference).
        """
        with self._lock:
            return self._build(spec, target, uids or UidMap.default())

    def _build(self, spec: GraphSpec, target: Target | None, uids: UidMap) -> Artifact:
        here = self.target()
        if target is not None and target != here:
            raise TargetMismatch(f"cannot build for {target} on this machine ({here}); run the build there")
        self.preflight()
        cudnn = self.cudnn()
        start = time.perf_counter()
        built = build_graph(cudnn, spec, uids, self.handle())
        engine = engine_name(built.graph)
        notes = _behavior_notes(built.graph)
        refusal = serialization_refusal(engine, here.frontend)
        if refusal:
            raise NotSerializable(f"{spec.summary()}: {refusal}", step="serialize")
        t0 = time.perf_counter()
        try:
            payload = payload_bytes(_serialize(built.graph, here.frontend))
        except NotSerializable:
            raise
        except Exception as exc:  # noqa: BLE001 - the backend raises many types here
            raise serialize_failure(spec, engine, notes, here.frontend, exc) from exc
        built.timings["serialize"] = time.perf_counter() - t0
        if not payload:
            raise NotSerializable(
                f"serialize() returned an empty plan for {spec.summary()} (engine {engine})", step="serialize"
            )
        artifact = Artifact(
            spec=spec,
            target=here,
            payload=payload,
            uids=uids,
            dialect=built.dialect,
            workspace_size=int(built.graph.get_workspace_size()),
            build_seconds=time.perf_counter() - start,
            timings=built.timings,
            runtime={
                **runtime_info(self.device),
                "engine": engine,
                "behavior_notes": notes,
                "recipe": RECIPE_VERSION,
            },
        )
        # Round trip: the blob is what every worker will load, so it is the
        # blob, deserialized into a fresh graph, that must run and agree.
        t0 = time.perf_counter()
        try:
            loaded = self._deserialize(artifact)
        except PlanRejected as exc:
            raise NotSerializable(
                f"the serialized plan for {spec.summary()} (engine {engine}) does not load back: {exc}",
                step="deserialize",
            ) from exc
        built.timings["deserialize"] = time.perf_counter() - t0
        if not self.check_reference:
            return artifact
        return self._checked(artifact, loaded)

    def _checked(self, artifact: Artifact, loaded: CudnnGraph) -> Artifact:
        from graphcache.compilers import canary
        from graphcache.compilers.torch_sdpa import TOLERANCE, reference_error, within_tolerance

        spec = artifact.spec
        if spec.dropout:
            # Dropout draws from cuDNN's random stream, which torch cannot
            # reproduce: there is nothing to compare, so nothing is claimed.
            runtime = {**artifact.runtime, "validation": "skipped: dropout's random stream differs from torch's"}
            return dataclasses.replace(artifact, validation_error=None, canary=None, runtime=runtime)
        feed = canary.inputs(spec, f"cuda:{self.device}")
        first = _output(loaded.execute(**feed), spec).clone()
        second = _output(loaded.execute(**feed), spec)
        error = reference_error(spec, first, feed)
        if not within_tolerance(spec, error):
            raise BuildError(
                f"cuDNN output for {spec.summary()} (engine {artifact.runtime.get('engine')}) differs from "
                f"the float32 reference: relative error {error:.2e}, tolerance {TOLERANCE[spec.dtype]:.0e}; "
                "not caching this plan"
            )
        record = canary.describe(spec, first, feed, deterministic=False)
        record["deterministic"] = canary.same_bits(spec, record, second, feed)
        log.info("built %s in %.2fs; relative error %.2e", spec.summary(), artifact.build_seconds, error)
        return dataclasses.replace(artifact, validation_error=error, canary=record)

    # load -------------------------------------------------------------------

    def load(self, artifact: Artifact) -> CudnnGraph:
        """Deserialize a verified artifact for this machine.

        Raises NotSerializable for a negative entry, TargetMismatch for an
        artifact built for another GPU, cuDNN or frontend, and PlanRejected
        when the plan would need a recompile, does not deserialize, or fails
        its numerical canary (the cache then drops the entry).
        """
        with self._lock:
            if artifact.unsupported:
                raise NotSerializable(artifact.unsupported)
            here = self.target()
            if artifact.target != here:
                raise TargetMismatch(
                    f"artifact {artifact.key[:12]} was built for {artifact.target}; this machine is "
                    f"{here}. Fetch the key for this target, or build here."
                )
            loaded = self._deserialize(artifact)
            if self.canary:
                self._check_canary(loaded)
            return loaded

    def _deserialize(self, artifact: Artifact) -> CudnnGraph:
        cudnn = self.cudnn()
        handle = self.handle()
        graph = cudnn.pygraph(handle=handle)
        try:
            deserialize_into(graph, handle, bytes(artifact.payload), artifact.target.frontend)
        except Exception as exc:  # noqa: BLE001 - sorted by load_failure: the blob's fault, or this host's
            raise load_failure(artifact, exc) from exc
        return CudnnGraph(self, artifact, graph)

    def _check_canary(self, loaded: CudnnGraph) -> None:
        from graphcache.compilers import canary

        artifact = loaded.artifact
        if artifact.canary is None:
            return  # dropout specs, and builds without a reference check, record none
        spec = artifact.spec
        feed = canary.inputs(spec, f"cuda:{self.device}")
        if not canary.comparable(artifact.canary, feed):
            # Another graphcache or torch draws another input: nothing to
            # compare, and no reason to drop a plan that serves other hosts.
            log.warning("canary of %s skipped: its input differs from the build's", artifact.key[:12])
            return
        problem = canary.mismatch(spec, artifact.canary, _output(loaded.execute(**feed), spec), feed)
        if problem is not None:
            raise PlanRejected(
                f"the stored plan {artifact.key[:12]} for {spec.summary()} failed its numerical canary: {problem}",
                "canary_mismatch",
            )


def serialize_failure(
    spec: GraphSpec, engine: str, notes: list[str], frontend: str, exc: BaseException
) -> BuildError | NotSerializable:
    """What a failed ``serialize()`` of a built plan means: this host's
    BuildError where its words say so (memory, driver, CUDA errors), else
    NotSerializable (a negative entry): the plan cuDNN picks for the spec on
    this target cannot be written (1.32 raises _plan_serdes._Unserializable,
    a TypeError, for a plan it cannot represent)."""
    text = _first_line(exc)
    if ENVIRONMENT.search(str(exc)):
        return BuildError(f"serializing {spec.summary()} failed because of this host: {type(exc).__name__}: {text}")
    return NotSerializable(
        f"the plan cuDNN chose for {spec.summary()} (engine {engine}, behavior notes {notes}) "
        f"cannot be serialized by cudnn-frontend {frontend}: {text}",
        step="serialize",
    )


def load_failure(artifact: Artifact, exc: BaseException) -> BuildError | PlanRejected:
    """What a failed ``deserialize`` means. A call form this frontend does
    not take (TypeError), a failing device or a missing library is this
    host's BuildError: the stored plan serves other hosts, so it is neither
    dropped nor refused. Anything else is the blob's: PlanRejected,
    ``needs_recompile`` where ``enforce_precompiled`` refused it (1.26+:
    "enforce_precompiled requested, but serialized graph has no precompiled
    execution plan"), else ``deserialize_failed``."""
    text = _first_line(exc)
    if isinstance(exc, TypeError) or ENVIRONMENT.search(str(exc)):
        return BuildError(
            f"could not load {artifact.key[:12]} for {artifact.spec.summary()} on this host: "
            f"{type(exc).__name__}: {text}"
        )
    if "PRECOMPILED" in str(exc).upper():
        return PlanRejected(
            f"the stored plan {artifact.key[:12]} for {artifact.spec.summary()} would need a recompile "
            f"on this machine: {text}",
            "needs_recompile",
        )
    return PlanRejected(
        f"the stored plan {artifact.key[:12]} for {artifact.spec.summary()} does not deserialize: {text}",
        "deserialize_failed",
    )


def _output(result: Any, spec: GraphSpec) -> Any:
    return result[0] if spec.generate_stats else result


def _serialize(graph: Any, frontend: str) -> Any:
    # 1.32 adds as_bytes; before it serialize() takes no argument. Decided by
    # version, not by catching TypeError: 1.32's serializer raises a
    # TypeError subclass for a plan it cannot represent.
    if _version_tuple(frontend) >= (1, 32):
        return graph.serialize(as_bytes=True)
    return graph.serialize()


def _behavior_notes(graph: Any) -> list[str]:
    try:
        return [str(n) for n in graph.get_behavior_notes()]
    except Exception:  # noqa: BLE001 - older frontends lack the call
        return []


class CudnnGraph:
    """A deserialized cuDNN plan with its workspace.

    ``execute`` keys its variant pack by the artifact's UID map, the same
    table the builder used, and runs on the caller's current CUDA stream.
    The workspace is allocated once per stream, on that stream: two streams
    running the plan at once never share scratch memory.
    """

    backend = "cudnn"

    def __init__(self, compiler: CudnnCompiler, artifact: Artifact, graph: Any) -> None:
        import torch

        self._compiler = compiler
        self.artifact = artifact
        self.spec = artifact.spec
        self.uids = artifact.uids
        self._graph = graph
        self.device = torch.device("cuda", compiler.device)
        self.workspace_size = int(graph.get_workspace_size())
        self._workspaces: dict[int, Any] = {}
        self._dropout_calls = 0
        # The graph's own tensors are declared (b, h, s, d) with the layout's
        # strides: torch's views of the same memory, what run_views takes.
        self._out_view = (tuple(self.spec.dims("o")), tuple(self.spec.strides("o")))

    @property
    def workspace(self) -> Any:
        """The workspace of the current stream (allocated on first use)."""
        import torch

        stream = torch.cuda.current_stream(self.device)
        workspace = self._workspaces.get(stream.cuda_stream)
        if workspace is None:
            with torch.cuda.device(self.device):
                workspace = torch.empty(max(self.workspace_size, 1), device=self.device, dtype=torch.uint8)
            self._workspaces[stream.cuda_stream] = workspace
        return workspace

    def execute(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
    ) -> Any:
        """Run the plan; returns ``out`` (allocated when None), and
        ``(out, stats)`` when the spec generates stats. Raises
        ExecutionError for tensors that do not match the spec or are not on
        this graph's GPU."""
        import torch

        from graphcache.compilers.torch_sdpa import check_inputs

        spec = self.spec
        tensors = {"q": q, "k": k, "v": v, "o": out, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv}
        check_inputs(spec, tensors, device_type="cuda")
        if q.device != self.device:
            raise ExecutionError(f"q is on {q.device}; this graph was loaded on {self.device}: move the tensors")
        with torch.cuda.device(self.device), self._compiler._lock:
            if out is None:
                out = torch.empty(spec.storage_shape("o"), dtype=q.dtype, device=q.device)
            pack = {self.uids[r]: t for r, t in (("q", q), ("k", k), ("v", v), ("o", out))}
            if spec.padding:
                pack[self.uids["seq_len_q"]] = seq_len_q
                pack[self.uids["seq_len_kv"]] = seq_len_kv
            stats = None
            if spec.generate_stats:
                stats = torch.empty(spec.dims("stats"), dtype=torch.float32, device=q.device)
                pack[self.uids["stats"]] = stats
            if spec.dropout:
                self._dropout_calls += 1
                seed = torch.randint(0, 2**62, (1, 1, 1, 1), dtype=torch.int64, device=q.device)
                offset = torch.full((1, 1, 1, 1), self._dropout_calls, dtype=torch.int64, device=q.device)
                pack[self.uids["dropout_seed"]] = seed
                pack[self.uids["dropout_offset"]] = offset
            # The handle is bound to the current stream, where ``out`` and this
            # stream's workspace were allocated and the caller's kernels run.
            self._graph.execute(pack, self.workspace, handle=self._compiler.handle())
        return (out, stats) if spec.generate_stats else out

    def run_views(self, q: Any, k: Any, v: Any) -> Any:
        """The per-call path of graphcache.torch: ``q``, ``k``, ``v`` are the
        (b, h, s, d) views torch's SDPA takes, whose strides are the graph's
        own (the caller has matched shapes, strides, dtypes and device, as
        graphcache.torch's memo does); returns the output as such a view. No
        view is made and nothing is copied: cuDNN reads the memory through the
        strides the graph was built with. For specs without padding, stats or
        dropout; ``execute`` is the checked path."""
        import torch

        shape, strides = self._out_view
        with torch.cuda.device(self.device), self._compiler._lock:
            out = torch.empty_strided(shape, strides, dtype=q.dtype, device=q.device)
            pack = {self.uids["q"]: q, self.uids["k"]: k, self.uids["v"]: v, self.uids["o"]: out}
            self._graph.execute(pack, self.workspace, handle=self._compiler.handle())
        return out
