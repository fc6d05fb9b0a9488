"""Every error graphcache raises, as types a caller can catch.

Messages say what was found and what to do about it; the CLI prints them as
one line and the service maps them to status codes in one place.
"""

from __future__ import annotations


class GraphCacheError(Exception):
    """Base class of every graphcache error."""


class SpecError(GraphCacheError, ValueError):
    """A graph spec (or a field of one) is invalid.

    ``field`` names the offending field so that callers (the HTTP service, the
    manifest loader) can point at it.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TargetError(GraphCacheError, ValueError):
    """A target text (``h200-sm90-cudnn9.28.0-fe1.32.0``) could not be parsed."""


class NoGpu(GraphCacheError):
    """This machine has no usable CUDA GPU (or no torch with CUDA)."""


class UnsupportedGpu(GraphCacheError):
    """The GPU or cuDNN found is too old for what was asked."""


class UnsupportedSpec(GraphCacheError):
    """cuDNN (or the installed frontend) cannot express this spec."""


class NotSerializable(UnsupportedSpec):
    """The plan cuDNN chose cannot be serialized, so it cannot be cached."""


class CorruptArtifact(GraphCacheError):
    """Bytes that claim to be an artifact failed verification.

    Corrupt data is never deserialized: treat it as a miss. ``reason`` is a
    short code (bad_magic, truncated, unknown_version, bad_header,
    header_digest_mismatch, digest_mismatch, key_not_recomputable,
    key_mismatch, unsigned, bad_signature) for metrics and HTTP errors.
    """

    def __init__(self, message: str, reason: str = "corrupt") -> None:
        super().__init__(message)
        self.reason = reason


class SignatureError(CorruptArtifact):
    """An artifact is unsigned or wrongly signed where a signature is required."""


class TargetMismatch(GraphCacheError):
    """An artifact was built for another GPU / cuDNN / frontend than this one."""


class StoreError(GraphCacheError):
    """A store could not be reached or answered with an error."""


class StoreLocationError(GraphCacheError, ValueError):
    """A store location (--store, GRAPHCACHE_STORE, --cache-dir) names no usable store:
    an unknown URL scheme, or a cache folder that does not exist for a verb that only reads."""


class StoreUnavailable(StoreError):
    """A remote store (the service, Redis) is down or too slow."""


class ExecutionError(GraphCacheError, ValueError):
    """Tensors handed to ``LoadedGraph.execute`` do not match the spec."""


class ManifestError(GraphCacheError, ValueError):
    """A manifest file is malformed; the message names the file, entry and field."""


class NotFound(GraphCacheError, KeyError):
    """No artifact is stored for a key, and nothing here can build it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"
