"""The cuDNN SDPA compiler: build, serialize, deserialize, execute.

One concern per module (docs/architecture.md, "The cuDNN compiler"):
``dialects`` (the SDPA keyword generations), ``graph`` (declaring a spec's
graph), ``build`` (the build steps), ``failures`` (what a failure means),
``serialize`` (the stored blob and its round trip), ``loaded`` (CudnnGraph:
workspaces and execution) and ``compiler`` (CudnnCompiler). Every name importers used from
the single module this was is re-exported here.
"""

from __future__ import annotations

from graphcache.compilers.cudnn.build import BUILD_STEPS, BuiltGraph, build_graph, python_engines
from graphcache.compilers.cudnn.compiler import CudnnCompiler
from graphcache.compilers.cudnn.dialects import DIALECTS, KEYWORD_REFUSAL, Dialect, refuses_keywords
from graphcache.compilers.cudnn.failures import (
    ENVIRONMENT,
    TRANSIENT,
    VERDICT_STEPS,
    classify_failure,
    execute_failure,
    frontend_version,
)
from graphcache.compilers.cudnn.loaded import CudnnGraph
from graphcache.compilers.cudnn.serialize import (
    deserialize_into,
    engine_name,
    load_failure,
    payload_bytes,
    payload_for_frontend,
    serialization_refusal,
    serialize_failure,
)
from graphcache.recipe import RECIPE_VERSION

__all__ = [
    "BUILD_STEPS",
    "DIALECTS",
    "ENVIRONMENT",
    "KEYWORD_REFUSAL",
    "RECIPE_VERSION",
    "TRANSIENT",
    "VERDICT_STEPS",
    "BuiltGraph",
    "CudnnCompiler",
    "CudnnGraph",
    "Dialect",
    "build_graph",
    "classify_failure",
    "deserialize_into",
    "engine_name",
    "execute_failure",
    "frontend_version",
    "load_failure",
    "payload_bytes",
    "payload_for_frontend",
    "python_engines",
    "refuses_keywords",
    "serialization_refusal",
    "serialize_failure",
]
