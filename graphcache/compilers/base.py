"""What a compiler is, and what it hands back."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from graphcache.artifact import Artifact
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap
from graphcache.target import Target


@runtime_checkable
class LoadedGraph(Protocol):
    """A graph ready to run. ``execute`` returns the output tensor, or
    ``(output, stats)`` when the spec generates stats. A graph may also offer
    ``run_views(q, k, v)``: torch's (b, h, s, d) views in, such a view out,
    unchecked (graphcache.torch uses it on a hit when it is there)."""

    spec: GraphSpec
    backend: str

    def execute(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
    ) -> Any: ...


@runtime_checkable
class Compiler(Protocol):
    """Builds artifacts for a target and loads them back.

    ``build`` sets the tensor UIDs from ``uids`` (the default map when None)
    and records the map in the artifact, so its key is the caller's. It
    raises NoGpu / UnsupportedGpu / UnsupportedSpec / NotSerializable (the
    spec cannot be served on this target: recorded) and BuildError (this
    host failed: not recorded). ``load`` raises TargetMismatch for a foreign
    artifact and PlanRejected for a plan that cannot be used as it is.
    """

    name: str

    def target(self) -> Target: ...

    def build(self, spec: GraphSpec, target: Target, uids: UidMap | None = None) -> Artifact: ...

    def load(self, artifact: Artifact) -> LoadedGraph: ...
