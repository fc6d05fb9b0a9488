"""graphcache.envelope_check: an envelope fed in pieces is judged exactly as
Artifact.decode judges it whole, holding only its header in memory."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import tracemalloc

import pytest

from graphcache import FORMAT_VERSION, Artifact, CorruptArtifact, SignatureError
from graphcache.artifact import MAGIC, MAX_HEADER, frame
from graphcache.envelope_check import EnvelopeCheck
from tests.fakes import make_artifact, spec


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


def envelopes() -> dict[str, tuple[bytes, str | None]]:
    """Named envelopes, good and bad, with the key each is uploaded under."""
    art = make_artifact(spec(), size=10_000)
    data = art.encode()
    other = make_artifact(spec(batch=2)).key
    forged = art.header()
    forged["key"] = other
    bad_spec = art.header()
    bad_spec["spec"]["head_dim"] = 7
    json_head = b"\x80abc"
    return {
        "good": (data, art.key),
        "good-any-key": (data, None),
        "signed": (art.signed(b"k").encode(), art.key),
        "empty": (b"", art.key),
        "short": (data[:20], art.key),
        "cut-in-header": (data[:200], art.key),
        "cut-in-payload": (data[:-1], art.key),
        "payload-longer": (data + b"x", art.key),
        "flipped-payload": (flip(data, len(data) - 10), art.key),
        "flipped-header": (flip(data, data.index(b'"batch":1') + 8), art.key),
        "flipped-header-digest": (flip(data, 20), art.key),
        "bad-magic": (b"XXXXX" + data[5:], art.key),
        "unknown-version": (data[:5] + struct.pack(">H", 9) + data[7:], art.key),
        "huge-header": (data[:7] + struct.pack(">I", MAX_HEADER + 1) + data[11:], art.key),
        "not-json": (
            MAGIC + struct.pack(">HI", FORMAT_VERSION, 4) + hashlib.sha256(json_head).digest() + json_head,
            art.key,
        ),
        "wrong-key": (data, other),
        "key-not-recomputable": (frame(forged, art.payload), None),
        "invalid-spec": (frame(bad_spec, art.payload), None),
    }


def decoded(data: bytes, key: str | None) -> tuple[str, str]:
    try:
        return "ok", Artifact.decode(data, expected_key=key).key
    except CorruptArtifact as exc:
        return exc.reason, str(exc)


def streamed(data: bytes, key: str | None, piece: int) -> tuple[str, str]:
    check = EnvelopeCheck()
    for at in range(0, len(data), piece):
        check.feed(data[at : at + piece])
    try:
        checked = check.finish(key)
    except CorruptArtifact as exc:
        return exc.reason, str(exc)
    assert checked.size == len(data)
    return "ok", checked.key


@pytest.mark.parametrize("piece", [1, 7, 43, 1000, 1 << 30], ids=lambda n: f"pieces-of-{n}")
@pytest.mark.parametrize("name", list(envelopes()))
def test_fed_in_pieces_an_envelope_is_judged_as_decode_judges_it_whole(name, piece):
    data, key = envelopes()[name]
    expected = decoded(data, key)
    assert streamed(data, key, piece) == expected
    assert (expected[0] == "ok") == name.startswith(("good", "signed"))


def test_the_signature_is_checked_as_on_the_whole_artifact():
    art = make_artifact(spec(batch=3), size=5000)
    check = EnvelopeCheck()
    check.feed(art.signed(b"new").encode())
    checked = check.finish(art.key)
    checked.verify_signature([b"old", b"new"])
    with pytest.raises(SignatureError, match="wrong signature"):
        checked.verify_signature(b"other")
    unsigned = EnvelopeCheck()
    unsigned.feed(art.encode())
    with pytest.raises(SignatureError, match="unsigned"):
        unsigned.finish(art.key).verify_signature(b"new")
    # A signed header altered after signing (digest fixed up) fails as on the artifact.
    forged = dataclasses.replace(art.signed(b"new"), builder_host="evil")
    check = EnvelopeCheck()
    check.feed(forged.encode())
    with pytest.raises(SignatureError):
        check.finish(art.key).verify_signature(b"new")


def test_a_64_mib_payload_is_hashed_not_held():
    payload = bytes(64 * 1024**2)
    art = make_artifact(spec(batch=4), size=16)
    art = dataclasses.replace(art, payload=payload)
    head = frame(art.header(), b"")
    view = memoryview(payload)
    check = EnvelopeCheck()
    tracemalloc.start()
    try:
        check.feed(head)
        for at in range(0, len(payload), 1 << 20):
            check.feed(view[at : at + (1 << 20)])
        checked = check.finish(art.key)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert checked.payload_size == len(payload) and checked.size == len(head) + len(payload)
    assert peak < 1024**2, peak
