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

import torch

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
        with torch.no_grad():  # as a cuDNN graph: a fresh output with no autograd history
            return super().execute(q, k, v, **kwargs)


class CpuGraphCompiler(FakeCompiler):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.executions = 0

    def load(self, artifact: Artifact) -> StandinGraph:  # type: ignore[override]
        super().load(artifact)  # TargetMismatch for a foreign artifact, as the real one; counts loads
        return StandinGraph(artifact.spec, self)


class FailingCompiler(CpuGraphCompiler):
    """Stands in for a loaded cuDNN plan that raises at execute on a hit
    (cudnn-frontend#1087: a class graph that passed its build check at some
    override shapes, refused with INVALID_DYNAMIC_SHAPE at another): the
    graphs whose spec and real query shape ``fails(spec, q_shape)`` names
    raise RuntimeError from execute and run_varlen. ``attempts`` counts the
    calls of a graph that raised."""

    def __init__(self, fails, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.fails = fails
        self.attempts = 0

    def load(self, artifact: Artifact) -> StandinGraph:  # type: ignore[override]
        owner = self

        class Failing(StandinGraph):
            def _refuse(self, q) -> None:  # noqa: ANN001
                if owner.fails(self.spec, tuple(q.shape)):
                    owner.attempts += 1
                    raise RuntimeError("cudnnGraphExecute: CUDNN_STATUS_BAD_PARAM (stand-in: INVALID_DYNAMIC_SHAPE)")

            def execute(self, q, k, v, **kwargs):  # noqa: ANN001, ANN003
                self._refuse(q)
                return super().execute(q, k, v, **kwargs)

            def run_varlen(self, q, k, v, *rest):  # noqa: ANN001, ANN002
                self._refuse(q)
                return super().run_varlen(q, k, v, *rest)

        super().load(artifact)
        return Failing(artifact.spec, self)
