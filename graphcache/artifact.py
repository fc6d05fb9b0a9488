"""The artifact envelope: one self-describing, verifiable cache entry.

Layout (big-endian)::

    b"GCART"  magic (5 bytes)
    u16       format version
    u32       header length N
    32 bytes  sha256 of the header bytes
    N bytes   header: UTF-8 JSON, sorted keys
    rest      payload: the bytes cuDNN's serialize() gave

Plan, metadata and UID map travel as one unit, so they can never come from
different builds. Nothing here unpickles anything.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import hmac
import json
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from graphcache.errors import (
    CorruptArtifact,
    KnownBad,
    NotSerializable,
    SignatureError,
    SpecError,
    TargetError,
    UnsupportedSpec,
)
from graphcache.key import FORMAT_VERSION, is_key, key_for
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap
from graphcache.target import Target

MAGIC = b"GCART"
_PREFIX = struct.Struct(">5sHI32s")
MAX_HEADER = 1 << 20
_REQUIRED = {
    "format": int,
    "key": str,
    "spec": dict,
    "uids": dict,
    "target": dict,
    "payload_sha256": str,
    "payload_size": int,
}


@dataclass(frozen=True)
class Artifact:
    """One cache entry: header fields plus the payload bytes.

    ``key`` is derived from spec, UID map and target, never stored apart from
    them. After ``decode`` the payload is a read-only memoryview of the
    envelope (``bytes(artifact.payload)`` copies it out). ``unsupported`` marks
    a negative entry: the spec was tried on this target and cannot be cached
    (the reason), with an empty payload. ``canary`` describes the plan's
    output on a fixed seeded input at build time (digest and summary
    values), which a load re-checks.
    """

    spec: GraphSpec
    target: Target
    payload: bytes
    uids: UidMap = field(default_factory=UidMap.default)
    dialect: str = ""
    workspace_size: int = 0
    build_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    builder_host: str = field(default_factory=socket.gethostname)
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    validation_error: float | None = None
    canary: dict[str, Any] | None = None
    runtime: dict[str, Any] = field(default_factory=dict)
    unsupported: str | None = None
    signature: str | None = None

    def __post_init__(self) -> None:
        # A ragged spec's map holds its offset and table roles (UidMap.for_spec),
        # as its key and its graph do.
        object.__setattr__(self, "uids", self.uids.for_spec(self.spec))

    @property
    def key(self) -> str:
        cached = self.__dict__.get("_key")
        if cached is None:
            cached = key_for(self.spec, self.target, self.uids)
            object.__setattr__(self, "_key", cached)
        return cached

    @property
    def payload_sha256(self) -> str:
        cached = self.__dict__.get("_sha")
        if cached is None:
            cached = hashlib.sha256(self.payload).hexdigest()
            object.__setattr__(self, "_sha", cached)
        return cached

    # -- header ----------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The header as stored (what ``inspect`` prints)."""
        return header_of(self, self.payload_sha256, len(self.payload))

    def encode(self) -> bytes:
        """The envelope bytes."""
        return frame(self.header(), self.payload)

    # -- negative entries ------------------------------------------------

    @classmethod
    def negative(cls, spec: GraphSpec, target: Target, uids: UidMap, exc: UnsupportedSpec) -> Artifact:
        """The entry that remembers cuDNN's verdict on ``spec`` for ``target``
        (no payload): which refusal it was, at which build step, under which
        frontend and cuDNN."""
        runtime = {"unsupported_kind": type(exc).__name__, "unsupported_step": exc.step}
        runtime.update(frontend=target.frontend, cudnn=target.cudnn)
        if isinstance(exc, KnownBad):
            runtime["known_bad"] = exc.window
        return cls(spec=spec, target=target, payload=b"", uids=uids, unsupported=str(exc), runtime=runtime)

    def refusal(self) -> UnsupportedSpec | None:
        """The error a negative entry stands for (None for a plan)."""
        if not self.unsupported:
            return None
        kind = self.runtime.get("unsupported_kind")
        if kind == "KnownBad":
            return KnownBad(self.unsupported, window=str(self.runtime.get("known_bad", "")))
        cls = NotSerializable if kind == "NotSerializable" else UnsupportedSpec
        return cls(self.unsupported, step=self.runtime.get("unsupported_step"))

    # -- signing ---------------------------------------------------------

    def signed(self, secret: bytes) -> Artifact:
        """A copy signed with HMAC-SHA256 over the header (which holds the
        payload's sha256, so the payload is covered too)."""
        unsigned = dataclasses.replace(self, signature=None)
        return dataclasses.replace(self, signature=_mac(secret, unsigned.header()))

    def verify_signature(self, secret: bytes | Sequence[bytes]) -> None:
        """Raises SignatureError when unsigned or signed with none of the
        secrets given (one, or several during a key rotation: any may match)."""
        check_signature(self, secret, self.payload_sha256, len(self.payload))

    # -- decoding --------------------------------------------------------

    @classmethod
    def decode(cls, data: bytes, expected_key: str | None = None) -> Artifact:
        """Parse and verify an envelope.

        Raises:
            CorruptArtifact: bad magic, truncation, unknown format version,
                malformed header, payload digest mismatch, a header key that
                does not recompute from the header's spec/uids/target, or one
                that differs from ``expected_key``.
        """
        header, offset = _parse(data)
        view = memoryview(data)[offset:]
        if len(view) != header["payload_size"]:
            raise CorruptArtifact(
                f"payload is {len(view)} bytes, header says {header['payload_size']} (truncated?)",
                "truncated",
            )
        digest = hashlib.sha256(view).hexdigest()
        if not hmac.compare_digest(digest, header["payload_sha256"]):
            raise CorruptArtifact("payload sha256 does not match the header: corrupt payload", "digest_mismatch")
        # The payload stays a zero-copy view of ``data``: copying 4 MiB into a
        # fresh allocation cost more than hashing it (page faults).
        artifact = cls.from_header(header, view)  # type: ignore[arg-type]
        object.__setattr__(artifact, "_sha", digest)
        return check_key(artifact, header, expected_key)

    @classmethod
    def from_header(cls, header: dict[str, Any], payload: bytes) -> Artifact:
        """The artifact a parsed header describes, with ``payload``.

        Raises CorruptArtifact (``bad_header``) for an invalid spec, target
        or field type."""
        try:
            spec = GraphSpec.from_dict(header["spec"])
            target = Target.from_dict(header["target"])
        except (SpecError, TargetError, TypeError) as exc:
            raise CorruptArtifact(f"header spec/target is invalid: {exc}", "bad_header") from exc
        except Exception as exc:  # noqa: BLE001 - a stored header is untrusted: any failure is corruption
            raise CorruptArtifact(f"header spec/target is invalid ({type(exc).__name__})", "bad_header") from exc
        try:
            return cls(
                spec=spec,
                target=target,
                payload=payload,
                uids=UidMap.from_dict(header["uids"]),
                dialect=str(header.get("dialect", "")),
                workspace_size=int(header.get("workspace_size") or 0),
                build_seconds=float(header.get("build_seconds") or 0.0),
                timings=dict(header.get("timings") or {}),
                builder_host=str(header.get("builder_host", "")),
                created_at=str(header.get("created_at", "")),
                validation_error=header.get("validation_error"),
                canary=_canary(header.get("canary")),
                runtime=dict(header.get("runtime") or {}),
                unsupported=header.get("unsupported"),
                signature=header.get("signature"),
            )
        except (TypeError, ValueError, RecursionError) as exc:
            raise CorruptArtifact(f"header field has the wrong type: {str(exc)[:200]}", "bad_header") from exc


def header_of(artifact: Artifact, payload_sha256: str, payload_size: int) -> dict[str, Any]:
    """``artifact``'s header, for a payload of that digest and size (which
    need not be in memory: an upload verified as it streamed to a file)."""
    return {
        "format": FORMAT_VERSION,
        "key": artifact.key,
        "spec": artifact.spec.to_dict(),
        "uids": artifact.uids.to_dict(),
        "target": artifact.target.to_dict(),
        "target_text": str(artifact.target),
        "dialect": artifact.dialect,
        "workspace_size": artifact.workspace_size,
        "build_seconds": artifact.build_seconds,
        "timings": dict(artifact.timings),
        "builder_host": artifact.builder_host,
        "created_at": artifact.created_at,
        "payload_sha256": payload_sha256,
        "payload_size": payload_size,
        "validation_error": artifact.validation_error,
        "canary": None if artifact.canary is None else dict(artifact.canary),
        "runtime": dict(artifact.runtime),
        "unsupported": artifact.unsupported,
        "signature": artifact.signature,
    }


def check_signature(
    artifact: Artifact, secret: bytes | Sequence[bytes], payload_sha256: str, payload_size: int
) -> None:
    """``Artifact.verify_signature`` for a payload of that digest and size
    (the payload itself is not read). Raises SignatureError."""
    if not artifact.signature:
        raise SignatureError(f"artifact {artifact.key[:12]} is unsigned; a signature is required", "unsigned")
    secrets = [secret] if isinstance(secret, bytes) else list(secret)
    head = header_of(dataclasses.replace(artifact, signature=None, payload=b""), payload_sha256, payload_size)
    ok = False
    for one in secrets:  # every key tried: the time taken does not tell which matched
        ok |= hmac.compare_digest(artifact.signature, _mac(one, head))
    if not ok:
        which = "the signing key" if len(secrets) == 1 else f"any of the {len(secrets)} signing keys"
        raise SignatureError(
            f"artifact {artifact.key[:12]} has a wrong signature (not signed with {which} of "
            "GRAPHCACHE_SIGNING_KEY, or altered after signing)",
            "bad_signature",
        )


def _optional_dict(value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"expected a mapping or null, got {type(value).__name__}")
    return value


_CANARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "sha256": str,
    "deterministic": bool,
    "l2": (int, float),
    "sum": (int, float),
    "sample_stride": int,
    "sample": list,
}


def _canary(value: Any) -> dict[str, Any] | None:
    """The canary record, its fields checked: a load compares against them,
    so a malformed one is a corrupt header, not a crash at every load."""
    record = _optional_dict(value)
    if record is None:
        return None
    for name, kind in _CANARY_FIELDS.items():
        field = record.get(name)
        if not isinstance(field, kind) or (kind is int and isinstance(field, bool)):
            raise TypeError(f"canary.{name} is {field!r}")
    if record["sample_stride"] < 1:
        raise ValueError(f"canary.sample_stride is {record['sample_stride']}, not a positive count")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in record["sample"]):
        raise TypeError("canary.sample holds a value that is not a number")
    return record


def read_header(data: bytes) -> dict[str, Any]:
    """The header of an envelope without verifying the payload (for listings).

    Raises CorruptArtifact when the framing or the header is malformed.
    """
    header, _ = _parse(data)
    return header


def check_key(artifact: Artifact, header: dict[str, Any], expected: str | None) -> Artifact:
    """``artifact`` when its key recomputes to the header's and is
    ``expected`` (None: any); else CorruptArtifact."""
    if artifact.key != header["key"]:
        raise CorruptArtifact(
            "header key does not recompute from its spec, uid map and target: "
            "the header was altered or written by a foreign tool",
            "key_not_recomputable",
        )
    if expected is not None and expected != artifact.key:
        raise CorruptArtifact(
            f"artifact is for key {artifact.key[:12]}..., not the requested {expected[:12]}...",
            "key_mismatch",
        )
    return artifact


def _parse(data: bytes) -> tuple[dict[str, Any], int]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CorruptArtifact(f"artifact must be bytes, got {type(data).__name__}", "bad_header")
    if len(data) < PREFIX_SIZE:
        raise CorruptArtifact(f"artifact is {len(data)} bytes: too short to hold a header", "truncated")
    version, size, head_digest = parse_prefix(data)
    end = PREFIX_SIZE + size
    if end > len(data):
        raise header_cut()
    return parse_header(bytes(data[PREFIX_SIZE:end]), version, head_digest), end


PREFIX_SIZE = _PREFIX.size


def header_cut() -> CorruptArtifact:
    """The error of an envelope that ends inside its header (or claims one
    longer than MAX_HEADER)."""
    return CorruptArtifact("header length runs past the end of the data (truncated)", "truncated")


def parse_prefix(data: bytes | bytearray | memoryview) -> tuple[int, int, bytes]:
    """The format version, header length and header digest in an envelope's
    first ``PREFIX_SIZE`` bytes. Raises CorruptArtifact: bad magic, an
    unknown version, a header longer than ``MAX_HEADER``."""
    magic, version, size, head_digest = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CorruptArtifact("bad magic: these bytes are not a graphcache artifact", "bad_magic")
    if version != FORMAT_VERSION:
        raise CorruptArtifact(
            f"unknown format version {version}; this graphcache reads version {FORMAT_VERSION}",
            "unknown_version",
        )
    if size > MAX_HEADER:
        raise header_cut()
    return version, size, head_digest


def parse_header(head: bytes, version: int, head_digest: bytes) -> dict[str, Any]:
    """The header of ``head`` (its bytes after the prefix), checked against
    the prefix's digest and version. Raises CorruptArtifact: digest, JSON,
    a required field missing or of the wrong type, a bad key."""
    if not hmac.compare_digest(hashlib.sha256(head).digest(), head_digest):
        raise CorruptArtifact("header sha256 does not match: corrupt header", "header_digest_mismatch")
    try:
        header = json.loads(head.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptArtifact(f"header is not valid JSON: {exc}", "bad_header") from exc
    except RecursionError:
        # JSON nested deeper than the interpreter recurses, valid digests and
        # all: a corrupt entry like any other, never a RecursionError at
        # every read of it (one such entry stopped every worker's start-up).
        raise CorruptArtifact("header is not valid JSON: nested too deep", "bad_header") from None
    if not isinstance(header, dict):
        raise CorruptArtifact("header is not a JSON object", "bad_header")
    for name, kind in _REQUIRED.items():
        if not isinstance(header.get(name), kind) or isinstance(header.get(name), bool):
            raise CorruptArtifact(f"header field {name!r} is missing or not a {kind.__name__}", "bad_header")
    if header["format"] != version:
        raise CorruptArtifact("header format differs from the envelope's format version", "bad_header")
    if not is_key(header["key"]):
        raise CorruptArtifact("header key is not 64 lowercase hex characters", "bad_header")
    return header


def frame(header: dict[str, Any], payload: bytes) -> bytes:
    """Wrap a header and payload in the envelope (no checks: ``decode`` checks)."""
    head = _dump(header)
    return _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head), hashlib.sha256(head).digest()) + head + payload


def _dump(header: dict[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _mac(secret: bytes, header: dict[str, Any]) -> str:
    return hmac.new(secret, _dump(header), hashlib.sha256).hexdigest()
