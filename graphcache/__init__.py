"""graphcache: build cuDNN attention graphs once, serve them to every worker.

The package is in wings: ``graphcache.spec`` (what a graph is),
``graphcache.models`` (what a model calls), ``graphcache.ops`` (what ops and
engineers run), ``graphcache.stores``, ``graphcache.compilers``,
``graphcache.torch``, ``graphcache.hf``, ``graphcache.cli``. Modules that
moved into a wing keep their old import paths (``MOVED``): ``import
graphcache.classes`` is ``graphcache.spec.classes``, the same module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

# Old module paths -> where they live now (issue 34's wings).
MOVED = {
    "graphcache.spec_ragged": "graphcache.spec.ragged",
    "graphcache.spec_bias": "graphcache.spec.bias",
    "graphcache.spec_sinks": "graphcache.spec.sinks",
    "graphcache.uids": "graphcache.spec.uids",
    "graphcache.classes": "graphcache.spec.classes",
    "graphcache.modelconfig": "graphcache.models.config",
    "graphcache.modelspecs": "graphcache.models.specs",
    "graphcache.manifest": "graphcache.ops.manifest",
    "graphcache.bench": "graphcache.ops.bench",
    "graphcache.benchrun": "graphcache.ops.benchrun",
    "graphcache.doctor": "graphcache.ops.doctor",
    "graphcache.lease": "graphcache.stores.lease",
    # graphcache.torch by door: its shared core, then each door's modules.
    "graphcache.torch.derive": "graphcache.torch.core.derive",
    "graphcache.torch.bias": "graphcache.torch.core.bias",
    "graphcache.torch.plan": "graphcache.torch.core.plan",
    "graphcache.torch.runtime": "graphcache.torch.core.runtime",
    "graphcache.torch.counts": "graphcache.torch.core.counts",
    "graphcache.torch.guard": "graphcache.torch.core.guard",
    "graphcache.torch.onmiss": "graphcache.torch.core.onmiss",
    "graphcache.torch.doors": "graphcache.torch.core.doors",
    "graphcache.torch.door": "graphcache.torch.aten.install",
    "graphcache.torch.aten_plan": "graphcache.torch.aten.plan",
    "graphcache.torch.aten_math": "graphcache.torch.aten.cpu_math",
    "graphcache.torch.varlen_derive": "graphcache.torch.varlen.thd_spec",
    "graphcache.torch.varlen_torch": "graphcache.torch.varlen.torch_op",
    "graphcache.torch.patching": "graphcache.torch.sdpa",
    "graphcache.torch.recording_text": "graphcache.torch.recording.text",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module's old path as the module at its new one."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        return None  # the module at its new path ran already


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.insert(0, _Moved())

from graphcache.artifact import Artifact  # noqa: E402
from graphcache.cache import GraphCache, PrefetchReport  # noqa: E402
from graphcache.errors import (  # noqa: E402
    BuildError,
    CorruptArtifact,
    ExecutionError,
    GraphCacheError,
    ManifestError,
    NoGpu,
    NotFound,
    NotSerializable,
    PlanRejected,
    SignatureError,
    SpecError,
    StoreError,
    StoreUnavailable,
    TargetError,
    TargetMismatch,
    UnsupportedGpu,
    UnsupportedSpec,
)
from graphcache.key import FORMAT_VERSION, key_for  # noqa: E402
from graphcache.ops import manifest  # noqa: E402
from graphcache.spec import GraphSpec  # noqa: E402
from graphcache.spec.uids import UidMap  # noqa: E402
from graphcache.target import Target  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BuildError",
    "FORMAT_VERSION",
    "Artifact",
    "CorruptArtifact",
    "ExecutionError",
    "GraphCache",
    "GraphCacheError",
    "GraphSpec",
    "ManifestError",
    "NoGpu",
    "NotFound",
    "NotSerializable",
    "PlanRejected",
    "PrefetchReport",
    "SignatureError",
    "SpecError",
    "StoreError",
    "StoreUnavailable",
    "Target",
    "TargetError",
    "TargetMismatch",
    "UidMap",
    "UnsupportedGpu",
    "UnsupportedSpec",
    "key_for",
    "manifest",
]
