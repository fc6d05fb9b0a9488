"""An envelope verified as its bytes arrive: what the server does with an
upload it streams to a file (bazel-remote's verify-on-put).

``EnvelopeCheck`` makes every check ``Artifact.decode`` makes, in the same
order and with the same errors, holding only the prefix and the header
(at most ``artifact.MAX_HEADER``) in memory: the payload is hashed piece by
piece as it is fed and never kept. The envelope's layout is
``graphcache.artifact``'s; nothing here parses it on its own.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from graphcache.artifact import (
    PREFIX_SIZE,
    Artifact,
    check_key,
    check_signature,
    header_cut,
    parse_header,
    parse_prefix,
)
from graphcache.errors import CorruptArtifact
from graphcache.spec import GraphSpec
from graphcache.target import Target


@dataclass(frozen=True)
class CheckedEnvelope:
    """An envelope ``EnvelopeCheck`` verified. ``meta`` is its artifact with
    an empty payload (the payload stays where it was written); the payload's
    real digest and size are beside it, and ``size`` is the whole envelope's."""

    meta: Artifact
    payload_sha256: str
    payload_size: int
    size: int

    @property
    def key(self) -> str:
        return self.meta.key

    @property
    def spec(self) -> GraphSpec:
        return self.meta.spec

    @property
    def target(self) -> Target:
        return self.meta.target

    def verify_signature(self, secret: bytes | Sequence[bytes]) -> None:
        """``Artifact.verify_signature``: raises SignatureError when unsigned
        or signed with none of the secrets."""
        check_signature(self.meta, secret, self.payload_sha256, self.payload_size)


class EnvelopeCheck:
    """Feed an envelope's bytes in pieces (``feed``), then ``finish``.

    The first error found is kept and raised by ``finish``; what is fed
    after it is only counted. Not thread-safe: one feeder at a time.
    """

    def __init__(self) -> None:
        self.size = 0  # bytes fed
        self._head = bytearray()  # prefix and header, until the header is parsed
        self._need = PREFIX_SIZE  # bytes of _head still to come before the next parse
        self._prefix: tuple[int, int, bytes] | None = None
        self._header: dict[str, Any] | None = None
        self._sha = hashlib.sha256()
        self._payload = 0
        self._error: CorruptArtifact | None = None

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Take the next bytes of the envelope."""
        self.size += len(chunk)
        if self._error is not None:
            return
        view = memoryview(chunk)
        while self._header is None and len(view):
            taken = min(self._need, len(view))
            self._head += view[:taken]
            self._need -= taken
            view = view[taken:]
            try:
                self._parse()
            except CorruptArtifact as exc:
                self._error = exc
                return
        if self._header is not None and len(view):
            self._payload += len(view)
            self._sha.update(view)

    @property
    def failed(self) -> CorruptArtifact | None:
        """The first error found so far (what ``finish`` will raise), or None:
        a reader may stop reading at once."""
        return self._error

    @property
    def expected(self) -> int | None:
        """The whole envelope's size, once its header has been read (prefix,
        header and the payload size the header declares); None before."""
        if self._header is None or self._prefix is None:
            return None
        return PREFIX_SIZE + self._prefix[1] + int(self._header["payload_size"])

    def _parse(self) -> None:
        """Parse what has arrived of the prefix, then of the header."""
        if self._need:
            return
        if self._prefix is None:
            self._prefix = parse_prefix(self._head)
            self._need = self._prefix[1]
            if self._need:
                return
        version, _, digest = self._prefix
        self._header = parse_header(bytes(self._head[PREFIX_SIZE:]), version, digest)
        self._head = bytearray()

    def finish(self, expected_key: str | None = None) -> CheckedEnvelope:
        """The verified envelope, once every byte was fed.

        Raises CorruptArtifact for what ``Artifact.decode`` of the same bytes
        would refuse, with the same reason."""
        if self._error is not None:
            raise self._error
        header = self._header
        if header is None:
            if self._prefix is None:
                raise CorruptArtifact(f"artifact is {self.size} bytes: too short to hold a header", "truncated")
            raise header_cut()
        if self._payload != header["payload_size"]:
            raise CorruptArtifact(
                f"payload is {self._payload} bytes, header says {header['payload_size']} (truncated?)",
                "truncated",
            )
        digest = self._sha.hexdigest()
        if not hmac.compare_digest(digest, header["payload_sha256"]):
            raise CorruptArtifact("payload sha256 does not match the header: corrupt payload", "digest_mismatch")
        meta = check_key(Artifact.from_header(header, b""), header, expected_key)
        return CheckedEnvelope(meta, digest, self._payload, self.size)
