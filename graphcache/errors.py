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
    """cuDNN (or the installed frontend) cannot express this spec.

    Deterministic for a target, so GraphCache records it as a negative entry
    shared by every host of that target: raise it only where cuDNN itself
    said "not supported", never for a failure of this host. ``step`` names
    the build step that refused (None where no step ran).
    """

    def __init__(self, message: str, step: str | None = None) -> None:
        super().__init__(message)
        self.step = step


class NotSerializable(UnsupportedSpec):
    """The plan cuDNN chose cannot be serialized, so it cannot be cached."""


class KnownBad(UnsupportedSpec):
    """A spec the release table's known-bad windows forbid on its target
    (graphcache.compilers.cudnn.release_rows.KNOWN_BAD): cuDNN would build
    it, and it would be wrong. ``window`` names the row; the message says
    what, on which target, and the row's source. Stored as a negative entry
    (step ``known_bad``) like any refusal, and refused before the store is
    asked, so a plan stored before the window was known is never served."""

    def __init__(self, message: str, window: str = "") -> None:
        super().__init__(message, step="known_bad")
        self.window = window


class BuildError(GraphCacheError):
    """A build failed for a reason that is not a property of the spec on its
    target: a missing driver or NVRTC, out of memory, an internal cuDNN
    error, a plan that failed its reference check. Reported, never recorded
    as a negative entry (that would poison the cache for every host)."""


class PlanRejected(GraphCacheError):
    """A stored plan verified as bytes but cannot be used as it is on this
    machine: it would need a recompile, it does not deserialize, or its
    numerical canary disagrees. GraphCache drops the entry and rebuilds.

    ``reason``: needs_recompile, deserialize_failed or canary_mismatch.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class CorruptArtifact(GraphCacheError):
    """Bytes that claim to be an artifact failed verification.

    Corrupt data is never deserialized: treat it as a miss. ``reason`` is a
    short code (bad_magic, truncated, unknown_version, bad_header,
    header_digest_mismatch, digest_mismatch, key_not_recomputable,
    key_mismatch, unsigned, bad_signature, unreadable) for metrics and HTTP errors.
    """

    def __init__(self, message: str, reason: str = "corrupt") -> None:
        super().__init__(message)
        self.reason = reason


# Every CorruptArtifact reason, for counters declared at zero from the start.
CORRUPT_REASONS = (
    "bad_magic",
    "truncated",
    "unknown_version",
    "bad_header",
    "header_digest_mismatch",
    "digest_mismatch",
    "key_not_recomputable",
    "key_mismatch",
    "unreadable",
)
SIGNATURE_REASONS = ("unsigned", "bad_signature")


class SignatureError(CorruptArtifact):
    """An artifact is unsigned or wrongly signed where a signature is required."""


class UnreadableEntry(CorruptArtifact):
    """A stored entry whose value cannot be read as a file: an I/O error, no
    permission, or something else in the value file's place (a directory, a
    FIFO, a symlink, which is never followed). Its reason is ``unreadable``;
    handled as a corrupt entry (the service sets it aside, clients count it
    and go on). ``path`` is the value file's."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message, "unreadable")
        self.path = path


class TargetMismatch(GraphCacheError):
    """An artifact was built for another GPU / cuDNN / frontend than this one."""


class StoreError(GraphCacheError):
    """A store could not be reached or answered with an error."""


class StoreLocationError(GraphCacheError, ValueError):
    """A store location (--store, GRAPHCACHE_STORE, --cache-dir) names no usable store:
    an unknown URL scheme, or a cache folder that does not exist for a verb that only reads."""


class StoreUnavailable(StoreError):
    """A remote store (the service, Redis) is down or too slow."""


class AnswerTooLarge(StoreUnavailable):
    """A server sent (or declared) more bytes than the largest answer this
    client accepts (GRAPHCACHE_MAX_ARTIFACT): a misconfigured proxy or a
    hostile server, never read to its end. ``sent`` is what it sent or
    declared (at least), ``limit`` the bound."""

    def __init__(self, message: str, *, sent: int, limit: int) -> None:
        super().__init__(message)
        self.sent = sent
        self.limit = limit


class StoreFull(StoreError):
    """A store has no room for a write (a full disk): reads still work.

    ``needed`` is the size of the write refused (None when not one entry's),
    ``free`` the bytes the filesystem has left, ``stored`` and ``entries``
    what the store holds; any of them None where unknown.
    """

    def __init__(
        self,
        message: str,
        *,
        needed: int | None = None,
        free: int | None = None,
        stored: int | None = None,
        entries: int | None = None,
    ) -> None:
        super().__init__(message)
        self.needed = needed
        self.free = free
        self.stored = stored
        self.entries = entries


class ExecutionError(GraphCacheError, ValueError):
    """Tensors handed to ``LoadedGraph.execute`` do not match the spec."""


class ManifestError(GraphCacheError, ValueError):
    """A manifest file is malformed; the message names the file, entry and field."""


class ManifestTooLarge(ManifestError):
    """A manifest names more specs than one manifest may (GRAPHCACHE_MAX_SPECS),
    or its YAML aliases expand past what a manifest may hold; it was refused
    before it was expanded. ``limit`` is the bound, ``named`` what it names
    (as far as it was counted)."""

    def __init__(self, message: str, *, limit: int, named: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.named = named


class NotFound(GraphCacheError, KeyError):
    """No artifact is stored for a key, and nothing here can build it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"


class UnsupportedCall(UnsupportedSpec):
    """A torch SDPA call that cannot be a cuDNN graph (graphcache.torch).

    ``reason`` is the short code ``graphcache.torch.stats()`` counts the call
    under: mask, dtype, head_dim, not_4d, layout, invalid, nested, ...
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class UnsupportedVersion(GraphCacheError, ImportError):
    """A library graphcache integrates with (transformers, for graphcache.hf)
    is a release outside the range it supports; the message names both."""
