"""CudnnCompiler: this machine's cuDNN, the build with its round trip and
reference check, and loading stored plans.

May import: every other module of the package, graphcache.artifact/spec/
target/uids/errors/settings, canary, varlen_check and graphcache.reference
(the float32 reference and the measures; none of them imports torch at the
top, nor this package).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from graphcache.artifact import Artifact
from graphcache.compilers import canary, varlen_check
from graphcache.compilers.cudnn import backward, override, padded, ragged
from graphcache.compilers.cudnn.build import build_graph
from graphcache.compilers.cudnn.failures import execute_failure
from graphcache.compilers.cudnn.loaded import CudnnGraph, _output
from graphcache.compilers.cudnn.releases import (
    FUSED_ATTENTION,
    SERIALIZED_PLANS,
    class_mechanism,
    missing,
    resolved,
    table_versions,
)
from graphcache.compilers.cudnn.serialize import (
    _behavior_notes,
    _serialize,
    deserialize_into,
    engine_name,
    load_failure,
    payload_bytes,
    serialization_refusal,
    serialize_failure,
)
from graphcache.errors import (
    BuildError,
    NoGpu,
    NotSerializable,
    PlanRejected,
    TargetMismatch,
    UnsupportedGpu,
    UnsupportedSpec,
)
from graphcache.recipe import RECIPE_VERSION
from graphcache.reference.dense import reference_errors
from graphcache.reference.measure import TOLERANCE, within_tolerance
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap
from graphcache.target import Target, runtime_info

log = logging.getLogger(__name__)


def preflight_spec(spec: GraphSpec, target: Target) -> GraphSpec:
    """``spec`` as ``target`` builds it (a class in its mechanism: the
    artifact names it, its key is the same, graphcache.key), after the
    release table's checks of what ``target``'s cuDNN and frontend build
    (``releases.table_versions``: a GPU's own versions, or those a reference
    target names). Raises UnsupportedSpec naming what is missing."""
    frontend, cudnn, cc = table_versions(target)
    if spec.is_class:  # override needs cuDNN >= 9.21 and frontend >= 1.24; else the padded form
        chosen = class_mechanism(spec, target)
        assert chosen is not None
        if not chosen.serves:
            raise UnsupportedSpec(f"{spec.summary()} is a length class on {target}: {chosen.why}", step="preflight")
        spec = resolved(spec, target)
        if spec.mechanism is None:
            override.check_target(spec, frontend, cudnn)
    if spec.layout == "thd":  # paged >= 9.5, ragged over pages >= 9.7, ragged on SM8x >= 9.18.1
        ragged.check_target(spec, frontend, cudnn, cc)
    if spec.kind == "backward":  # sdpa_backward, and its mask keywords, by release
        backward.check_target(spec, frontend, cudnn, cc)
    return spec


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
        gpu = missing(FUSED_ATTENTION, cc=target.compute_capability)
        if gpu:
            raise UnsupportedGpu(f"{gpu} ({torch.cuda.get_device_name(self.device)})")
        runtime = missing(SERIALIZED_PLANS, cudnn=int(self.cudnn().backend_version()))
        if runtime:
            raise UnsupportedGpu(f"{runtime}: install nvidia-cudnn-cu12 9.x")

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
        spec = preflight_spec(spec, here)
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
        spec = artifact.spec
        if spec.layout == "thd":
            return _checked_ragged(artifact, loaded, self.cudnn())
        if isinstance(loaded, backward.CudnnBackwardGraph):  # dQ, dK, dV against autograd of the reference
            with sorted_failures(self.cudnn(), spec, "the backward check"):
                return backward.checked(artifact, loaded)
        if spec.dropout:
            # Dropout draws from cuDNN's random stream, which torch cannot
            # reproduce: there is nothing to compare, so nothing is claimed.
            runtime = {**artifact.runtime, "validation": "skipped: dropout's random stream differs from torch's"}
            return dataclasses.replace(artifact, validation_error=None, canary=None, runtime=runtime)
        with sorted_failures(self.cudnn(), spec, "the class check" if spec.is_class else "the build check"):
            check = padded.check_padded if spec.mechanism == "padded" else override.check_class
            worst = check(loaded) if spec.is_class else 0.0  # UnsupportedSpec naming failed shapes
            spec = override.canary_spec(spec)  # a class's canary runs at a real shape, not the declared one
            feed = canary.inputs(spec, str(loaded.device))
            result = loaded.execute(**feed)
            first, stats = (result[0].clone(), result[1]) if spec.generate_stats else (result.clone(), None)
            second = _output(loaded.execute(**feed), spec)
        error, lse_error = reference_errors(spec, first, feed, stats)
        error = max(error, worst)
        _judge(artifact, spec, error, lse_error)
        record = canary.describe(spec, first, feed, deterministic=False)
        record["deterministic"] = canary.same_bits(spec, record, second, feed)
        log.info("built %s in %.2fs; relative error %.2e", spec.summary(), artifact.build_seconds, error)
        runtime = artifact.runtime if lse_error is None else {**artifact.runtime, "lse_error": lse_error}
        return dataclasses.replace(artifact, validation_error=error, canary=record, runtime=runtime)

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
        return (backward.CudnnBackwardGraph if artifact.spec.kind == "backward" else CudnnGraph)(self, artifact, graph)

    def _check_canary(self, loaded: CudnnGraph) -> None:
        artifact = loaded.artifact
        if artifact.canary is None:
            return  # dropout specs, and builds without a reference check, record none
        spec = override.canary_spec(artifact.spec)
        feed = canary_feed(spec, str(loaded.device), artifact)
        if not canary.comparable(artifact.canary, feed):
            # Another graphcache or torch draws another input: nothing to
            # compare, and no reason to drop a plan that serves other hosts.
            log.warning("canary of %s skipped: its input differs from the build's", artifact.key[:12])
            return
        with sorted_failures(self.cudnn(), spec, "the canary"):
            out = loaded.run_varlen(**feed)[0] if spec.layout == "thd" else _output(loaded.execute(**feed), spec)
        problem = canary.mismatch(spec, artifact.canary, out, feed)
        if problem is not None:
            raise PlanRejected(
                f"the stored plan {artifact.key[:12]} for {spec.summary()} failed its numerical canary: {problem}",
                "canary_mismatch",
            )


@contextlib.contextmanager
def sorted_failures(cudnn: Any, spec: GraphSpec, during: str) -> Iterator[None]:
    """A failed execute in a check (``during``), sorted as a build step's
    failure is (``failures.execute_failure``): cuDNN's "not supported" an
    UnsupportedSpec at step check, anything else a BuildError. The checks'
    own verdicts pass as they are."""
    try:
        yield
    except (UnsupportedSpec, BuildError, PlanRejected):
        raise
    except Exception as exc:  # noqa: BLE001 - the frontend raises RuntimeError, ValueError, its own types
        raise execute_failure(cudnn, spec, exc, during) from exc


def canary_feed(spec: GraphSpec, device: str, artifact: Artifact) -> dict[str, Any]:
    """The canary's input; a thd spec's is its build check's call, with a
    0-token sequence only where the target's cuDNN takes one (>= 9.25)."""
    if spec.layout != "thd":
        return canary.inputs(spec, device)
    return varlen_check.inputs(spec, device, seed=canary.SEED, zero_length=ragged.zero_length_ok(artifact.target.cudnn))


def _checked_ragged(artifact: Artifact, loaded: CudnnGraph, cudnn: Any = None) -> Artifact:
    """The build-time check of a ragged / paged graph (``varlen_check``):
    unequal lengths with 1-token (and on cuDNN >= 9.25 0-token) sequences,
    off-tile lengths and NaN-poisoned slack, then a call of fewer sequences
    than the graph's batch, against the float32 reference, the log-sum-exp
    too where it is asked for; the first call's output becomes the canary
    every load re-checks (``canary_feed``)."""
    spec = artifact.spec
    zero_length = ragged.zero_length_ok(artifact.target.cudnn)
    with sorted_failures(cudnn, spec, "the paged check" if spec.page_size else "the ragged check"):
        feed = canary_feed(spec, str(loaded.device), artifact)
        first = loaded.run_varlen(**feed)[0].clone()
        second = loaded.run_varlen(**feed)[0]
        error, lse_error = varlen_check.errors(spec, loaded, feed)
        if spec.batch >= 2:  # padded to the batch: 0-token sequences, or 1-token dummies below 9.25
            fewer = varlen_check.inputs(spec, str(loaded.device), 1, zero_length=zero_length, sequences=spec.batch - 1)
            more = varlen_check.errors(spec, loaded, fewer)
            error, lse_error = max(error, more[0]), None if lse_error is None else max(lse_error, more[1] or 0.0)
    zero = "and 0-token sequences" if zero_length else "sequences (no 0-token ones below cuDNN 9.25)"
    _judge(artifact, spec, error, lse_error, on=f" on unequal, 1- {zero}, and on fewer sequences than the batch")
    record = canary.describe(spec, first, feed, deterministic=False)
    record["deterministic"] = canary.same_bits(spec, record, second, feed)
    runtime = dict(artifact.runtime)
    if lse_error is not None:
        runtime["lse_error"] = lse_error
    return dataclasses.replace(artifact, validation_error=error, canary=record, runtime=runtime)


def _judge(artifact: Artifact, spec: GraphSpec, error: float, lse_error: float | None, on: str = "") -> None:
    """The verdict on a checked plan: BuildError (not cached, tried again)
    when its output disagrees with the float32 reference (``on`` says on what
    inputs); UnsupportedSpec (remembered for this target) when the output is
    right and the log-sum-exp is not: cuDNN's own defect on this target
    (cudnn-frontend#1083: 9.26-9.27 write it only for each kv group's first
    head at s_q 1 with GQA), the same on every retry."""
    engine = artifact.runtime.get("engine")
    tolerance = TOLERANCE[spec.dtype]
    if not within_tolerance(spec, error):
        raise BuildError(
            f"cuDNN output for {spec.summary()} (engine {engine}) differs from the float32 reference{on}: "
            f"relative error {error:.2e}, tolerance {tolerance:.0e}; not caching this plan"
        )
    if lse_error is not None and not within_tolerance(spec, lse_error):
        raise UnsupportedSpec(
            f"cuDNN {artifact.target.cudnn} writes a wrong log-sum-exp (stats) for {spec.summary()} "
            f"(engine {engine}): {lse_error:.2e} from the float32 reference (tolerance {tolerance:.0e} on "
            "|lse - ref| / (1 + |ref|)) while the output agrees (one known cause: cudnn-frontend#1083, "
            "single-token GQA rows on cuDNN 9.26-9.27); generate_stats=false graphs are unaffected",
            step="check",
        )
