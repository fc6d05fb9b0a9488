"""The reference compiler: artifacts any machine can build and run, a CPU
included, so that the whole path (serve, warm, warm --check, prefetch, the
drop-in's hits, bench) can be walked and tested without a GPU.

Its "plan" is a small JSON document naming the spec; loading it gives a graph
that runs torch's scaled_dot_product_attention with the spec's exact mask
semantics (``TorchSdpaGraph``; stats and ragged / paged calls from
graphcache's float32 reference), and for a backward spec torch's SDPA
backward (``TorchSdpaBackwardGraph``: autograd of torch's math kernel). Its artifacts live under a target of their
own, ``reference-sm00-cudnn0.0.0-fe0.0.0``: no GPU has compute capability
0.0, so no cuDNN worker's key can ever name one of them, and this compiler
builds and loads for that target only. Nothing here is cuDNN: what it
measures or serves says nothing about cuDNN's build or load times.

**Standing in for a cuDNN release.** ``GRAPHCACHE_REFERENCE_CUDNN=9.19.0``
(and ``GRAPHCACHE_REFERENCE_FRONTEND=1.28.0``) give the reference target
those versions (``reference-sm00-cudnn9.19.0-fe1.28.0``, still compute
capability 0.0: never a GPU's key), and its builds then apply the release
table as the cuDNN compiler does on an SM90 GPU with them
(``releases.table_versions``): what that release cannot do is refused
(``UnsupportedSpec`` at preflight, a negative entry), and a length class is
served by the mechanism it has: on a cuDNN without execute-time override,
``padded``, whose stand-in (``ReferencePaddedGraph``) places every call's
tensors as the cuDNN graph would (``graphcache.compilers.padded``: in place,
or copied and counted) and computes on those places. A CPU then walks the
path a worker on that cuDNN walks. Left unset (0.0.0), a version limits
nothing, as before.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from graphcache.artifact import Artifact
from graphcache.compilers.classgraph import bhsd_view, check_covered, real_spec, storage_view
from graphcache.compilers.padded import PaddedShape, real
from graphcache.compilers.torch_backward import TorchSdpaBackwardGraph
from graphcache.compilers.torch_sdpa import TorchSdpaGraph, compute
from graphcache.errors import PlanRejected, TargetMismatch, UnsupportedGpu
from graphcache.reference.checks import check_inputs
from graphcache.settings import Settings
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap
from graphcache.target import Target

NAME = "reference"
# Compute capability 0.0 and cuDNN 0.0.0: a target no GPU detects as its own.
TARGET = Target(gpu="reference", compute_capability="0.0", cudnn="0.0.0", frontend="0.0.0")


def target_for(cudnn: str = "0.0.0", frontend: str = "0.0.0") -> Target:
    """The reference target standing in for ``cudnn`` and ``frontend``
    (0.0.0: no limit; both 0.0.0 is ``TARGET``)."""
    return Target(gpu="reference", compute_capability="0.0", cudnn=cudnn, frontend=frontend)


PLAN_FORMAT = "graphcache-reference"
PLAN_VERSION = 1


class ReferenceGraph(TorchSdpaGraph):
    """A loaded reference plan: torch's SDPA with the spec's semantics, on
    whatever device the tensors are (``TorchSdpaGraph`` says what it checks).
    ``backend`` is ``reference``: a graph the cache serves, not a fallback."""

    backend = NAME


class ReferenceBackwardGraph(TorchSdpaBackwardGraph):
    """A loaded reference plan of a backward spec: dQ, dK, dV from torch's
    SDPA backward (``TorchSdpaBackwardGraph`` says what it checks)."""

    backend = NAME


class ReferencePaddedGraph:
    """A loaded reference plan of a ``padded`` class: the stand-in of the
    cuDNN graph declared at the class's maxima with the padding mask
    (graphcache.compilers.cudnn.padded). Each call's tensors are placed as
    that graph would read them (``PaddedShape.place``: in place where their
    memory fits the declared strides, else copied into the reused buffer and
    counted), the answer is computed from those places over the call's real
    lengths (torch's SDPA, as ``TorchSdpaGraph``), written into the declared
    output, and the call gets the view of its real rows."""

    backend = NAME

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec
        self.workspace_size = 0

    def execute(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        bias: Any = None,
        sink: Any = None,
        shape: PaddedShape | None = None,
    ) -> Any:
        """As ``TorchSdpaGraph.execute`` of a class: real tensors in the
        class's layout, of any shape it covers (ExecutionError otherwise).
        ``shape``: a bound run's, used where it is this call's spec and device."""
        spec = real_spec(self.spec, q, k)
        given = {"q": q, "k": k, "v": v, "o": out, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "bias": bias}
        check_inputs(spec, given)
        if shape is None or shape.spec != spec or shape.device != q.device:
            shape = PaddedShape(self.spec, spec, q.device)
        views = [bhsd_view(spec, r, t) for r, t in (("q", q), ("k", k), ("v", v))]
        result = self.run(shape, *views, bias=bias, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, sink=sink)
        o, stats = result if spec.generate_stats else (result, None)
        o = storage_view(spec, "o", o)
        if out is not None:
            out.copy_(o)
            o = out
        return (o, stats) if spec.generate_stats else o

    def run(
        self,
        shape: PaddedShape,
        q: Any,
        k: Any,
        v: Any,
        *,
        bias: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        sink: Any = None,
    ) -> Any:
        """One call at ``shape``'s exact spec: (b, h, s, d) views in, the
        output's (b, h, s, d) view of its real rows out (and the stats where
        the spec asks)."""
        spec = shape.spec
        placed = shape.place(q, k, v, bias, seq_len_q, seq_len_kv)
        at = {r: real(t, spec, r) for r, t in placed.tensors.items() if r in ("q", "k", "v", "o", "stats", "bias")}
        stored = {r: storage_view(spec, r, at[r]) for r in ("q", "k", "v")}
        len_q, len_kv = (seq_len_q, seq_len_kv) if spec.padding else (None, None)
        result = compute(spec, stored["q"], stored["k"], stored["v"], None, len_q, len_kv, at.get("bias"), sink)
        o, stats = result if spec.generate_stats else (result, None)
        at["o"].copy_(bhsd_view(spec, "o", o))
        if stats is not None:
            at["stats"].copy_(stats)
        return shape.output(placed)

    def bind(self, spec: GraphSpec) -> ReferencePaddedRun:
        """This class graph at one exact spec of its class (ExecutionError
        for a spec the class does not cover)."""
        return ReferencePaddedRun(self, spec)


class ReferencePaddedRun:
    """A padded reference class graph bound to one exact spec: its declared
    shapes and seq-len tensors made once (on the first call's device)."""

    backend = NAME

    def __init__(self, graph: ReferencePaddedGraph, spec: GraphSpec) -> None:
        check_covered(graph.spec, spec)
        self.graph = graph
        self.spec = spec
        self.class_spec = graph.spec
        self._shape: PaddedShape | None = None

    def execute(self, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        """The checked path: the class graph's ``execute``, with this run's
        declared shapes where the call is its spec."""
        return self.graph.execute(q, k, v, **kwargs, shape=self._shape_on(q.device))

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        """The drop-in's per-call path: torch's (b, h, s, d) views of this
        exact shape in (and a bias spec's packed bias), the output's view out."""
        return self.graph.run(self._shape_on(q.device), q, k, v, bias=bias)

    def _shape_on(self, device: Any) -> PaddedShape:
        shape = self._shape
        if shape is None or shape.device != device:
            shape = self._shape = PaddedShape(self.graph.spec, self.spec, device)
        return shape


class ReferenceCompiler:
    """Builds and loads reference plans for its target (``TARGET``, or the
    cuDNN and frontend GRAPHCACHE_REFERENCE_CUDNN / _FRONTEND name, or those
    given); needs no GPU, and torch only to run what it loads."""

    name = NAME

    def __init__(self, cudnn: str | None = None, frontend: str | None = None) -> None:
        if cudnn is None or frontend is None:
            settings = Settings.from_env()
            cudnn = settings.reference_cudnn if cudnn is None else cudnn
            frontend = settings.reference_frontend if frontend is None else frontend
        self._target = target_for(cudnn, frontend)

    def target(self) -> Target:
        return self._target

    def build(self, spec: GraphSpec, target: Target, uids: UidMap | None = None) -> Artifact:
        """The artifact of ``spec``'s reference plan. Raises TargetMismatch
        for any target but this compiler's (a reference plan is never filed
        under a GPU's key); on a target that names a cuDNN, what the release
        table says that cuDNN cannot do (UnsupportedGpu below cuDNN 9,
        UnsupportedSpec at preflight), as the cuDNN compiler does. A class
        spec is built in the mechanism the target serves it by (``padded``
        without execute-time override)."""
        _check_target(target, self._target)
        spec = _preflight(spec, target)
        start = time.perf_counter()
        payload = plan_bytes(spec)
        return Artifact(
            spec=spec,
            target=target,
            payload=payload,
            uids=uids or UidMap.default(),
            dialect=NAME,
            build_seconds=time.perf_counter() - start,
            builder_host=socket.gethostname(),
            runtime={"compiler": NAME},
        )

    def load(self, artifact: Artifact) -> Any:  # a ReferenceGraph, ReferenceBackwardGraph or ReferencePaddedGraph
        """The graph of a reference artifact. Raises TargetMismatch for an
        artifact of another target and PlanRejected (``deserialize_failed``)
        for a payload that is not this spec's reference plan."""
        _check_target(artifact.target, self._target)
        try:
            plan: Any = json.loads(bytes(artifact.payload))
        except (UnicodeDecodeError, ValueError):
            plan = None
        if not isinstance(plan, dict) or plan != json.loads(plan_bytes(artifact.spec)):
            raise PlanRejected(
                f"stored plan {artifact.key[:12]} is not the reference plan of {artifact.spec.summary()}",
                "deserialize_failed",
            )
        if artifact.spec.kind == "backward":
            return ReferenceBackwardGraph(artifact.spec)
        if artifact.spec.mechanism == "padded":
            return ReferencePaddedGraph(artifact.spec)
        return ReferenceGraph(artifact.spec)


def plan_bytes(spec: GraphSpec) -> bytes:
    """The reference plan of ``spec``: what runs it, and the spec itself."""
    plan = {
        "plan": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "runs": _RUNS[spec.kind],
        "spec": spec.to_dict(),
    }
    return json.dumps(plan, sort_keys=True).encode()


_RUNS = {
    "forward": "torch scaled_dot_product_attention; stats and ragged calls: graphcache's float32 reference",
    "backward": "torch scaled_dot_product_attention's backward (autograd)",
}


def _check_target(target: Target, own: Target) -> None:
    if target != own:
        other = (
            "another reference target's come from a reference compiler with its versions"
            if (target.gpu == NAME)
            else "a GPU target's artifacts come from the cuDNN compiler"
        )
        raise TargetMismatch(
            f"this reference compiler builds and loads for {own} only, not {target}: {other} "
            "(GRAPHCACHE_REFERENCE_CUDNN, GRAPHCACHE_REFERENCE_FRONTEND)"
        )


def _preflight(spec: GraphSpec, target: Target) -> GraphSpec:
    """``spec`` as ``target`` builds it (a class in its mechanism), after the
    release table's checks the cuDNN compiler makes, for a reference target
    that names a cuDNN or frontend (the default reference target: none, as
    before). Raises UnsupportedGpu / UnsupportedSpec as that compiler does."""
    from graphcache.compilers.cudnn import releases
    from graphcache.compilers.cudnn.compiler import preflight_spec

    if target == TARGET:
        return spec
    runtime = releases.missing(releases.SERIALIZED_PLANS, cudnn=releases.table_versions(target)[1])
    if runtime:
        raise UnsupportedGpu(f"{runtime} (GRAPHCACHE_REFERENCE_CUDNN={target.cudnn})")
    return preflight_spec(spec, target)
