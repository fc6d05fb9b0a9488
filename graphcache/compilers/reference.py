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
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from graphcache.artifact import Artifact
from graphcache.compilers.torch_backward import TorchSdpaBackwardGraph
from graphcache.compilers.torch_sdpa import TorchSdpaGraph
from graphcache.errors import PlanRejected, TargetMismatch
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap
from graphcache.target import Target

NAME = "reference"
# Compute capability 0.0 and cuDNN 0.0.0: a target no GPU detects as its own.
TARGET = Target(gpu="reference", compute_capability="0.0", cudnn="0.0.0", frontend="0.0.0")
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


class ReferenceCompiler:
    """Builds and loads reference plans for ``TARGET``; needs no GPU, and
    torch only to run what it loads."""

    name = NAME

    def target(self) -> Target:
        return TARGET

    def build(self, spec: GraphSpec, target: Target, uids: UidMap | None = None) -> Artifact:
        """The artifact of ``spec``'s reference plan. Raises TargetMismatch
        for any target but ``TARGET`` (a reference plan is never filed under
        a GPU's key)."""
        _check_target(target)
        start = time.perf_counter()
        payload = plan_bytes(spec)
        return Artifact(
            spec=spec,
            target=TARGET,
            payload=payload,
            uids=uids or UidMap.default(),
            dialect=NAME,
            build_seconds=time.perf_counter() - start,
            builder_host=socket.gethostname(),
            runtime={"compiler": NAME},
        )

    def load(self, artifact: Artifact) -> TorchSdpaGraph:  # a ReferenceGraph, or a ReferenceBackwardGraph
        """The graph of a reference artifact. Raises TargetMismatch for an
        artifact of another target and PlanRejected (``deserialize_failed``)
        for a payload that is not this spec's reference plan."""
        _check_target(artifact.target)
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


def _check_target(target: Target) -> None:
    if target != TARGET:
        raise TargetMismatch(
            f"the reference compiler builds and loads for {TARGET} only, not {target}: "
            "a GPU target's artifacts come from the cuDNN compiler"
        )
