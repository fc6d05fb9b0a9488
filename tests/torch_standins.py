"""A CPU-runnable stand-in for the cuDNN compiler, for graphcache.torch tests.

CpuGraphCompiler stands in for graphcache.compilers.cudnn.CudnnCompiler
(this release, written against cudnn-frontend 1.32): building, deserializing
and executing a cuDNN plan needs a GPU. Builds are FakeCompiler's (a
deterministic payload in a real, verified artifact); ``load`` hands back
graphcache's own TorchSdpaGraph for the artifact's spec, which runs the
spec's exact semantics on the CPU and checks its inputs against the spec the
way CudnnGraph.execute does (shape, dtype, packed layout). So the drop-in's
store lookup, memo, load-once and layout handling run for real.
"""

from __future__ import annotations

from graphcache import Artifact
from graphcache.compilers.torch_sdpa import TorchSdpaGraph
from tests.fakes import FakeCompiler


class StandinGraph(TorchSdpaGraph):
    backend = "cpu-standin"  # not "torch": the drop-in treats that as a fallback graph

    def __init__(self, spec, owner: CpuGraphCompiler) -> None:  # noqa: ANN001
        super().__init__(spec)
        self._owner = owner

    def execute(self, q, k, v, **kwargs):  # noqa: ANN001, ANN003
        self._owner.executions += 1
        return super().execute(q, k, v, **kwargs)


class CpuGraphCompiler(FakeCompiler):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.executions = 0

    def load(self, artifact: Artifact) -> StandinGraph:  # type: ignore[override]
        super().load(artifact)  # TargetMismatch for a foreign artifact, as the real one; counts loads
        return StandinGraph(artifact.spec, self)
