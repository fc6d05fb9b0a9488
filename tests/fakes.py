"""Stand-ins for what cannot run without a GPU.

FakeCompiler stands in for CudnnCompiler (cuDNN needs a GPU to build or
load a plan): it makes a deterministic payload from the spec, so everything
above the compiler (GraphCache, stores, the service, the CLI) is tested for
real on a CPU machine.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

from graphcache import (
    Artifact,
    GraphSpec,
    NotSerializable,
    PlanRejected,
    Target,
    TargetMismatch,
    UidMap,
    UnsupportedSpec,
)
from graphcache.compilers.cudnn.releases import resolved

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
OTHER_TARGET = Target.parse("a100_sxm4_80gb-sm80-cudnn9.28.0-fe1.32.0")


@dataclass
class FakeLoaded:
    spec: GraphSpec
    artifact: Artifact
    backend: str = "fake"

    def execute(self, q, k, v, *, out=None, seq_len_q=None, seq_len_kv=None):  # noqa: ANN001
        return self.artifact.payload


class FakeCompiler:
    """Deterministic builds: payload = the spec's digest repeated to ``size``."""

    name = "fake"

    def __init__(
        self,
        target: Target = TARGET,
        *,
        size: int = 4096,
        delay: float = 0.0,
        unsupported: set[str] | None = None,
        reject_loads: list[str] | None = None,
        classes: bool = True,
        override: bool = True,
    ) -> None:
        self._target = target
        # False: class specs are refused in every form (UnsupportedSpec, a
        # negative entry), as CudnnCompiler refuses a class cuDNN cannot serve.
        self.classes = classes
        # False: classes in the override form are refused and their padded
        # form built (an engine that refuses override for a spec).
        self.override = override
        self.size = size
        self.delay = delay
        self.unsupported = unsupported or set()
        # PlanRejected reasons the next loads raise, one per load (what
        # CudnnCompiler.load raises for a blob that would recompile or whose
        # canary disagrees).
        self.reject_loads = list(reject_loads or [])
        self.builds = 0
        self.loads = 0
        self._lock = threading.Lock()

    def target(self) -> Target:
        return self._target

    def build(self, spec: GraphSpec, target: Target, uids: UidMap | None = None) -> Artifact:
        with self._lock:
            self.builds += 1
        if self.delay:
            time.sleep(self.delay)
        if spec.is_class and not self.classes:
            raise UnsupportedSpec("fake: no class graph on this target", step="preflight")
        if spec.is_class and spec.mechanism is None and not self.override:
            raise UnsupportedSpec("fake: the engine refuses execute-time override for this spec", step="check")
        if spec.mask in self.unsupported:
            raise NotSerializable(f"fake: mask {spec.mask} has no serializable plan", step="serialize")
        # A class in the mechanism the target serves it by, as CudnnCompiler builds it (its key is the same).
        return make_artifact(resolved(spec, target), target, size=self.size, uids=uids)

    def load(self, artifact: Artifact) -> FakeLoaded:
        if artifact.target != self._target:
            raise TargetMismatch(f"built for {artifact.target}, this is {self._target}")
        with self._lock:
            self.loads += 1
            reason = self.reject_loads.pop(0) if self.reject_loads else None
        if reason is not None:
            raise PlanRejected(f"fake: stored plan {artifact.key[:12]} rejected ({reason})", reason)
        return FakeLoaded(artifact.spec, artifact)


def payload_for(spec: GraphSpec, size: int) -> bytes:
    seed = hashlib.sha256(spec.canonical_json().encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def make_artifact(spec: GraphSpec, target: Target = TARGET, size: int = 4096, uids: UidMap | None = None) -> Artifact:
    return Artifact(
        spec=spec,
        target=target,
        payload=payload_for(spec, size),
        uids=uids or UidMap.default(),
        dialect="fake",
        workspace_size=1024,
        build_seconds=0.5,
        created_at="2026-11-29T00:00:00+00:00",
        builder_host="test",
    )


def spec(**changes) -> GraphSpec:  # noqa: ANN003
    base = {"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "causal"}
    base.update(changes)
    return GraphSpec.from_dict(base)
