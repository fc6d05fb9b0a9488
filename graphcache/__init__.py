"""graphcache: build cuDNN attention graphs once, serve them to every worker."""

from __future__ import annotations

from graphcache import manifest
from graphcache.artifact import Artifact
from graphcache.cache import GraphCache, PrefetchReport
from graphcache.errors import (
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
from graphcache.key import FORMAT_VERSION, key_for
from graphcache.spec import GraphSpec
from graphcache.target import Target
from graphcache.uids import UidMap

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
