from __future__ import annotations

import dataclasses
import json
import struct

import pytest

from graphcache import FORMAT_VERSION, Artifact, CorruptArtifact, SignatureError, key_for
from graphcache.artifact import MAGIC, frame, read_header
from tests.fakes import OTHER_TARGET, TARGET, make_artifact, spec


@pytest.fixture
def artifact() -> Artifact:
    return make_artifact(spec(), size=10_000)


def test_round_trip_keeps_every_field(artifact):
    data = artifact.encode()
    back = Artifact.decode(data, expected_key=artifact.key)
    assert back == artifact
    assert back.payload == artifact.payload
    assert back.key == key_for(artifact.spec, TARGET)
    header = read_header(data)
    for name in (
        "key",
        "spec",
        "uids",
        "target",
        "dialect",
        "workspace_size",
        "build_seconds",
        "builder_host",
        "created_at",
        "payload_sha256",
        "payload_size",
        "validation_error",
    ):
        assert name in header
    assert header["target_text"] == str(TARGET)


def test_no_pickle_header_is_plain_json(artifact):
    data = artifact.encode()
    (size,) = struct.unpack_from(">I", data, 7)
    json.loads(data[43 : 43 + size])
    assert data.startswith(MAGIC)


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


def test_flipped_payload_byte_is_corrupt(artifact):
    data = artifact.encode()
    with pytest.raises(CorruptArtifact, match="sha256"):
        Artifact.decode(flip(data, len(data) - 10))


def test_flipped_header_byte_is_corrupt(artifact):
    data = artifact.encode()
    for field in (b'"batch":1', b'"workspace_size":1024', b'"builder_host":"test"'):
        at = data.index(field) + len(field) - 1
        with pytest.raises(CorruptArtifact, match="header sha256"):
            Artifact.decode(flip(data, at))
    with pytest.raises(CorruptArtifact):
        Artifact.decode(flip(data, 20))  # inside the header digest itself


@pytest.mark.parametrize("cut", [0, 5, 10, 200, -1])
def test_truncation_is_corrupt(artifact, cut):
    data = artifact.encode()
    with pytest.raises(CorruptArtifact):
        Artifact.decode(data[:cut])


def test_bad_magic_and_unknown_version(artifact):
    data = artifact.encode()
    with pytest.raises(CorruptArtifact, match="bad magic"):
        Artifact.decode(b"XXXXX" + data[5:])
    with pytest.raises(CorruptArtifact, match="unknown format version 9"):
        Artifact.decode(data[:5] + struct.pack(">H", 9) + data[7:])


def test_wrong_expected_key(artifact):
    other = make_artifact(spec(batch=2))
    with pytest.raises(CorruptArtifact, match="not the requested"):
        Artifact.decode(artifact.encode(), expected_key=other.key)


def test_header_key_that_does_not_recompute(artifact):
    # A foreign tool (or a forger) writes a header whose key is not its own.
    header = artifact.header()
    header["key"] = make_artifact(spec(batch=2)).key
    data = frame(header, artifact.payload)
    with pytest.raises(CorruptArtifact, match="does not recompute"):
        Artifact.decode(data)


def test_header_with_invalid_spec_is_corrupt_not_a_crash(artifact):
    header = artifact.header()
    header["spec"]["head_dim"] = 7
    data = frame(header, artifact.payload)
    with pytest.raises(CorruptArtifact, match="head_dim"):
        Artifact.decode(data)


def test_non_json_header_is_corrupt():
    import hashlib

    data = MAGIC + struct.pack(">HI", FORMAT_VERSION, 4) + hashlib.sha256(b"\x80abc").digest() + b"\x80abc"
    with pytest.raises(CorruptArtifact, match="JSON"):
        Artifact.decode(data)


def test_target_is_part_of_the_key(artifact):
    other = dataclasses.replace(artifact, target=OTHER_TARGET)
    assert other.key != artifact.key


def test_signing(artifact):
    signed = artifact.signed(b"secret")
    back = Artifact.decode(signed.encode())
    back.verify_signature(b"secret")
    with pytest.raises(SignatureError, match="wrong signature"):
        back.verify_signature(b"other")
    with pytest.raises(SignatureError, match="unsigned"):
        artifact.verify_signature(b"secret")
    # Altering a signed header field (not the spec) breaks the signature.
    forged = dataclasses.replace(back, builder_host="evil")
    with pytest.raises(SignatureError):
        forged.verify_signature(b"secret")


GOOD_CANARY = {"seed": 1, "sha256": "ab" * 32, "deterministic": False, "l2": 3.5, "sum": -1.0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sample_stride", "x"),
        ("sample_stride", -2),
        ("sample_stride", True),
        ("l2", "abc"),
        ("sample", ["a"]),
        ("sha256", None),
        ("deterministic", "yes"),
    ],
)
def test_a_malformed_canary_record_is_a_corrupt_header_naming_the_field(artifact, field, value):
    """A load compares against the canary record; one that cannot be read is
    caught at decode (the entry is then dropped), not at every load."""
    good = dataclasses.replace(artifact, canary={**GOOD_CANARY, "sample_stride": 2, "sample": [0.5, 1]})
    assert Artifact.decode(good.encode()).canary == good.canary
    bad = dataclasses.replace(artifact, canary={**good.canary, field: value})
    with pytest.raises(CorruptArtifact, match=f"canary.{field}") as err:
        Artifact.decode(bad.encode())
    assert err.value.reason == "bad_header"
