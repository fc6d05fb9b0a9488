"""The framing of a batch answer (``POST /v1/batch``): many stored envelopes
in one streamed body, each self-delimiting, then which keys are absent.

Layout::

    b"GCBATCH1"                      magic and version (8 bytes)
    record*                          one per key asked for, in the order asked
    end record                       kind Z: the stream is complete

    record := kind (1 byte) key (64 ASCII hex) length (u64, big-endian) body

    kind E  body: the stored envelope (verified by the server, and again by
            the client before it is used)
    kind A  body: why the key is absent, UTF-8: "absent", "quarantined: REASON"
            (the stored entry failed verification and was set aside) or
            "unavailable: DETAIL" (the store did not answer for it)
    kind Z  key: 64 zeros; body: JSON ``{"found": N, "absent": M}``

A stream that ends without its Z record was cut short: the client treats the
keys it did not hear about as not fetched, never as absent.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from graphcache.errors import AnswerTooLarge, CorruptArtifact

MAGIC = b"GCBATCH1"
MEDIA_TYPE = "application/vnd.graphcache.batch"
ENVELOPE = b"E"
ABSENT = b"A"
END = b"Z"
END_KEY = "0" * 64
_HEAD = struct.Struct(">c64sQ")
HEAD_SIZE = _HEAD.size
# An envelope is bounded by the server's upload limit (GRAPHCACHE_MAX_UPLOAD,
# 64 MiB by default): a longer record is a broken or hostile stream, refused
# from its head before its body is read (a client passes its own bound,
# GRAPHCACHE_MAX_ARTIFACT). Absent and end records hold a line of text.
MAX_RECORD = 64 * 1024 * 1024
MAX_NOTE = 64 * 1024


def record_head(kind: bytes, key: str, length: int) -> bytes:
    return _HEAD.pack(kind, key.encode("ascii"), length)


def record(kind: bytes, key: str, body: bytes) -> bytes:
    return record_head(kind, key, len(body)) + body


def end_record(found: int, absent: int) -> bytes:
    return record(END, END_KEY, json.dumps({"found": found, "absent": absent}).encode())


@dataclass(frozen=True)
class Record:
    kind: bytes
    key: str
    body: bytes


class BatchParser:
    """Incremental parser: ``feed`` it chunks as they arrive; it yields each
    record once its body is complete. Raises CorruptArtifact (reason
    ``bad_batch``) on a stream that does not follow the layout, and
    AnswerTooLarge for a record whose head declares more than
    ``max_record`` bytes (an envelope) or ``MAX_NOTE`` (any other record),
    before its body is buffered: what the parser holds is at most one
    record within those bounds."""

    def __init__(self, max_record: int = MAX_RECORD) -> None:
        self.max_record = max_record
        self._buf = bytearray()
        self._magic = False
        self.complete = False
        self.summary: dict[str, int] = {}

    def feed(self, chunk: bytes) -> Iterator[Record]:
        self._buf += chunk
        if not self._magic:
            if len(self._buf) < len(MAGIC):
                return
            if bytes(self._buf[: len(MAGIC)]) != MAGIC:
                raise CorruptArtifact("the batch answer does not start with GCBATCH1", "bad_batch")
            del self._buf[: len(MAGIC)]
            self._magic = True
        while len(self._buf) >= HEAD_SIZE:
            if self.complete:
                raise CorruptArtifact("bytes after the end of the batch answer", "bad_batch")
            kind, raw_key, length = _HEAD.unpack_from(self._buf)
            if kind not in (ENVELOPE, ABSENT, END):
                raise CorruptArtifact(f"bad batch record (kind {kind!r}, length {length})", "bad_batch")
            limit = self.max_record if kind == ENVELOPE else MAX_NOTE
            if length > limit:
                what = "an artifact (GRAPHCACHE_MAX_ARTIFACT)" if kind == ENVELOPE else "a record of its kind"
                raise AnswerTooLarge(
                    f"a batch record (kind {kind.decode()}, key {bytes(raw_key[:12]).decode('ascii', 'replace')}...) "
                    f"declares {length} bytes, more than the {limit} this client reads for {what}",
                    sent=length,
                    limit=limit,
                )
            if len(self._buf) < HEAD_SIZE + length:
                return
            body = bytes(self._buf[HEAD_SIZE : HEAD_SIZE + length])
            del self._buf[: HEAD_SIZE + length]
            try:
                key = raw_key.decode("ascii")
            except UnicodeDecodeError:
                raise CorruptArtifact("a batch record's key is not ASCII", "bad_batch") from None
            if kind == END:
                self.complete = True
                try:
                    self.summary = dict(json.loads(body))
                except (ValueError, TypeError):
                    raise CorruptArtifact("the batch answer's end record is not JSON", "bad_batch") from None
                continue
            yield Record(kind, key, body)
