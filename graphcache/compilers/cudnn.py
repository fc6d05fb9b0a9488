"""The cuDNN SDPA compiler: build, serialize, deserialize, execute.

The frontend's SDPA keywords changed across versions (CUDNN_NOTES.md). The
dialect chain tries the newest keyword set first and falls back on
TypeError, each dialect expressing the spec's mask exactly or declining: a
causal mask is never dropped to make an old frontend happy. Frontends from
1.27 accept unknown keywords at ``sdpa()`` and fail only when the graph is
lowered, so one attempt covers the whole build, not one call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphcache.artifact import Artifact
from graphcache.errors import (
    ExecutionError,
    GraphCacheError,
    NoGpu,
    NotSerializable,
    TargetMismatch,
    UnsupportedGpu,
    UnsupportedSpec,
)
from graphcache.spec import GraphSpec
from graphcache.target import Target, runtime_info
from graphcache.uids import UidMap

log = logging.getLogger(__name__)

MIN_COMPUTE_CAPABILITY = (8, 0)
MIN_CUDNN_SERIALIZE = 90000  # serialized SDPA plans need cuDNN 9.x
_IO_TYPES = {"float16": "HALF", "bfloat16": "BFLOAT16"}
TRANSIENT = ("OUT OF MEMORY", "ALLOC_FAILED")


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
    express the spec's mask.
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
                raise GraphCacheError(
                    f"cudnn-frontend {frontend_version(cudnn)} raised a TypeError building {spec.summary()} "
                    f"with dialect {dialect.name} that is not a refused sdpa() keyword, so the spec is not "
                    f"recorded as unsupported: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else exc!r}"
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
                graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            else:
                getattr(graph, step)()
        except TypeError:
            raise  # an unknown keyword at lowering: the dialect chain tries the next one
        except Exception as exc:  # noqa: BLE001 - cuDNN's errors have many types; say which step refused
            text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            if any(word in text.upper() for word in TRANSIENT):
                # Out of memory is about this moment, not this spec: never recorded as unsupported.
                raise GraphCacheError(f"cuDNN ran out of memory building {spec.summary()} at {step}: {text}") from exc
            raise UnsupportedSpec(
                f"cuDNN {_backend_version(cudnn)} refused {spec.summary()} at {step}: {text}"
            ) from exc
        timings[step] = time.perf_counter() - start
    return graph, tensors, timings


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


def payload_for_frontend(payload: bytes, frontend: str) -> Any:
    """What this frontend's ``deserialize`` takes: bytes from 1.32 (where it
    avoids building a list), a list of ints before (1.23 refuses bytes)."""
    payload = bytes(payload)
    try:
        major, minor = (int(p) for p in frontend.split(".")[:2])
    except ValueError:
        return list(payload)
    return payload if (major, minor) >= (1, 32) else list(payload)


# -- the compiler --------------------------------------------------------------


class CudnnCompiler:
    """Builds SDPA graphs with cuDNN on this machine's GPU and loads them back.

    ``cudnn_module`` lets a test hand in a stand-in for the frontend; by
    default ``import cudnn`` happens on first use, so importing graphcache
    never needs torch or cudnn.
    """

    name = "cudnn"

    def __init__(
        self,
        device: int = 0,
        *,
        check_reference: bool = True,
        cudnn_module: Any = None,
    ) -> None:
        self.device = device
        self.check_reference = check_reference
        self._cudnn = cudnn_module
        self._handle: Any = None
        self._target: Target | None = None
        # One cuDNN handle per compiler; builds and loads take turns on it.
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
        if self._handle is None:
            import torch

            cudnn = self.cudnn()
            torch.cuda.set_device(self.device)
            self._handle = cudnn.create_handle()
            cudnn.set_stream(handle=self._handle, stream=torch.cuda.current_stream().cuda_stream)
        return self._handle

    # build ------------------------------------------------------------------

    def build(self, spec: GraphSpec, target: Target | None = None, uids: UidMap | None = None) -> Artifact:
        """Build, serialize and reference-check one graph on this GPU.

        Raises NoGpu, UnsupportedGpu, TargetMismatch (asked to build for
        another target), UnsupportedSpec, NotSerializable, and ExecutionError
        when the plan's output disagrees with the float32 reference.
        """
        with self._lock:
            return self._build(spec, target, uids)

    def _build(self, spec: GraphSpec, target: Target | None, uids: UidMap | None) -> Artifact:
        here = self.target()
        if target is not None and target != here:
            raise TargetMismatch(f"cannot build for {target} on this machine ({here}); run the build there")
        self.preflight()
        uids = uids or UidMap.default()
        cudnn = self.cudnn()
        start = time.perf_counter()
        built = build_graph(cudnn, spec, uids, self.handle())
        try:
            t0 = time.perf_counter()
            payload = payload_bytes(_serialize(built.graph))
            built.timings["serialize"] = time.perf_counter() - t0
        except NotSerializable:
            raise
        except Exception as exc:  # noqa: BLE001 - the backend raises many types here
            raise NotSerializable(
                f"the plan cuDNN chose for {spec.summary()} cannot be serialized "
                f"(behavior notes: {_behavior_notes(built.graph)}): {exc}"
            ) from exc
        if not payload:
            raise NotSerializable(f"serialize() returned an empty plan for {spec.summary()}")
        workspace = int(built.graph.get_workspace_size())
        build_seconds = time.perf_counter() - start
        artifact = Artifact(
            spec=spec,
            target=here,
            payload=payload,
            uids=uids,
            dialect=built.dialect,
            workspace_size=workspace,
            build_seconds=build_seconds,
            timings=built.timings,
            runtime={**runtime_info(), "behavior_notes": _behavior_notes(built.graph)},
        )
        if self.check_reference:
            error = self._reference_error(CudnnGraph(self, artifact, built.graph))
            if error > _tolerance(spec):
                raise ExecutionError(
                    f"cuDNN output for {spec.summary()} differs from the float32 reference: relative "
                    f"error {error:.2e} > {_tolerance(spec):.0e}; not caching this plan"
                )
            log.info("built %s in %.2fs; relative error %.2e", spec.summary(), build_seconds, error)
            import dataclasses

            artifact = dataclasses.replace(artifact, validation_error=error)
        return artifact

    def _reference_error(self, graph: CudnnGraph) -> float:
        from graphcache.compilers.torch_sdpa import random_inputs, reference, relative_error

        spec = graph.spec
        if spec.dropout:
            return 0.0  # dropout's random stream differs from torch's: nothing to compare
        inputs = random_inputs(spec, f"cuda:{self.device}")
        result = graph.execute(**inputs)
        out = result[0] if spec.generate_stats else result
        ref, _ = reference(spec, **inputs)
        return relative_error(out, ref)

    # load -------------------------------------------------------------------

    def load(self, artifact: Artifact) -> CudnnGraph:
        """Deserialize a verified artifact for this machine.

        Raises NotSerializable for a negative entry and TargetMismatch for an
        artifact built for another GPU, cuDNN or frontend.
        """
        with self._lock:
            return self._load(artifact)

    def _load(self, artifact: Artifact) -> CudnnGraph:
        if artifact.unsupported:
            raise NotSerializable(artifact.unsupported)
        here = self.target()
        if artifact.target != here:
            raise TargetMismatch(
                f"artifact {artifact.key[:12]} was built for {artifact.target}; this machine is "
                f"{here}. Fetch the key for this target, or build here."
            )
        cudnn = self.cudnn()
        handle = self.handle()
        graph = cudnn.pygraph(handle=handle)
        data = payload_for_frontend(artifact.payload, here.frontend)
        try:
            graph.deserialize(handle, data)
        except TypeError:  # frontends before 1.14 take no handle
            graph.deserialize(data)
        return CudnnGraph(self, artifact, graph)


def _serialize(graph: Any) -> Any:
    try:
        return graph.serialize(as_bytes=True)
    except TypeError:  # frontends before 1.32 return a list of ints
        return graph.serialize()


def _behavior_notes(graph: Any) -> list[str]:
    try:
        return [str(n) for n in graph.get_behavior_notes()]
    except Exception:  # noqa: BLE001 - older frontends lack the call
        return []


def _tolerance(spec: GraphSpec) -> float:
    from graphcache.compilers.torch_sdpa import TOLERANCE

    return TOLERANCE[spec.dtype]


class CudnnGraph:
    """A deserialized (or freshly built) cuDNN plan with its workspace.

    The workspace is allocated once, at load; ``execute`` keys its variant
    pack by the artifact's UID map, the same table the builder used.
    """

    backend = "cudnn"

    def __init__(self, compiler: CudnnCompiler, artifact: Artifact, graph: Any) -> None:
        import torch

        self._compiler = compiler
        self.artifact = artifact
        self.spec = artifact.spec
        self.uids = artifact.uids
        self._graph = graph
        self.workspace_size = int(graph.get_workspace_size())
        self.workspace = torch.empty(max(self.workspace_size, 1), device=f"cuda:{compiler.device}", dtype=torch.uint8)
        self._dropout_calls = 0

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
        ``(out, stats)`` when the spec generates stats."""
        import torch

        from graphcache.compilers.torch_sdpa import check_inputs

        spec = self.spec
        tensors = {"q": q, "k": k, "v": v, "o": out, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv}
        check_inputs(spec, tensors, device_type="cuda")
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
        self._graph.execute(pack, self.workspace, handle=self._compiler.handle())
        return (out, stats) if spec.generate_stats else out
