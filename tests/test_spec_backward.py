"""A backward spec (``kind: backward``, graphcache/spec/backward.py): its
key, canonical form, UID map and validation; forward keys stay as they were."""

from __future__ import annotations

import pytest

from graphcache import GraphSpec, ManifestError, SpecError, Target, UidMap, key_for, manifest
from graphcache.spec.backward import backward_of, training

TARGET = Target.parse("h200-sm90-mp132-cudnn9.28.0-fe1.32.0")

# Keys of forward specs of every kind as main computed them before backward
# graphs existed (commit f1e9111): a forward spec's key must never move.
FORWARD_KEYS = {
    "f9d97ac9ffb444f4e17c280a45f99d5831322139b2e73562ed85a3e5a5192319": dict(
        batch=4, heads_q=32, heads_kv=8, seq_q=256, head_dim=128, dtype="bfloat16", mask="causal", shapes="class"
    ),
    "83c7abe467d9d65fdd3c3b40fd62f5dd6a11cf0047554fba961ce281eb5dde0c": dict(
        batch=2, heads_q=8, seq_q=128, head_dim=64, bias="b1ss", generate_stats=True, layout="bhsd"
    ),
    "e6e37c3a2bcdeb42373d1cf3fbd202f0c3de74f65674021ccdfb8bffdbe5c530": dict(
        batch=1, heads_q=8, seq_q=64, head_dim=64, sinks=True, mask="sliding_window", window_left=31
    ),
    "597291daa37c20852f3f1f17472ecc36b3d6f4804f104f4926e4b43b53032abc": dict(
        batch=4, heads_q=8, heads_kv=2, seq_q=1, head_dim=64, layout="thd", page_size=16, num_pages=64, pages_per_seq=8
    ),
}
BACKWARD = dict(batch=2, heads_q=8, heads_kv=2, seq_q=128, head_dim=64, dtype="bfloat16", mask="causal")
BACKWARD_KEY = "760c6b5b541a5a111a3fd8271d96caeef0af9d8949f5e8b94009946cedd4f7a6"


@pytest.mark.parametrize("key", sorted(FORWARD_KEYS))
def test_forward_keys_are_the_ones_they_were(key):
    spec = GraphSpec(**FORWARD_KEYS[key])
    assert key_for(spec, TARGET) == key
    assert "kind" not in spec.to_dict() and spec == GraphSpec(**FORWARD_KEYS[key], kind="forward")


def test_a_backward_spec_is_its_forward_with_kind_backward_and_a_key_of_its_own():
    forward = GraphSpec(**BACKWARD)
    back = backward_of(forward)
    assert back.kind == "backward" and back.to_dict() == {**forward.to_dict(), "kind": "backward"}
    assert key_for(back, TARGET) == BACKWARD_KEY != key_for(forward, TARGET)
    assert GraphSpec.from_dict(back.to_dict()) == back  # the canonical form reads back
    assert back.summary() == "b2 h8/2 s128 d64 bf16 bshd causal backward"
    # Its UID map adds the gradient roles (the stats stay at 5: an input now).
    roles = UidMap.default().for_spec(back).to_dict()
    assert {r: roles[r] for r in ("stats", "dO", "dQ", "dK", "dV")} == {
        "stats": 5,
        "dO": 19,
        "dQ": 20,
        "dK": 21,
        "dV": 22,
    }
    assert "dQ" not in UidMap.default().for_spec(forward).to_dict()


def test_gradients_have_the_dims_and_layout_of_their_tensors():
    back = GraphSpec(**BACKWARD, kind="backward")
    for grad, of in (("dQ", "q"), ("dK", "k"), ("dV", "v"), ("dO", "o")):
        assert back.dims(grad) == back.dims(of) and back.strides(grad) == back.strides(of)
        assert back.storage_shape(grad) == back.storage_shape(of)
    assert back.dims("dK") == (2, 2, 128, 64)  # GQA: the key/value heads


def test_a_backward_reads_the_stats_and_writes_none():
    # generate_stats says whether a graph writes the stats: a training step's
    # forward does, its backward reads them, so a family of both reads naturally.
    back = GraphSpec(**BACKWARD, kind="backward", generate_stats=True)
    assert back.generate_stats is False and back == GraphSpec(**BACKWARD, kind="backward")
    forward, backward = training(GraphSpec(**BACKWARD))
    assert forward.generate_stats and forward.kind == "forward" and backward == back


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"kind": "gradient"}, "kind", "allowed: forward"),
        ({"kind": "backward", "dropout": 0.1}, "dropout", "replay the forward graph's random stream"),
        ({"kind": "backward", "sinks": True}, "sinks", "dSink"),
        (
            {"kind": "backward", "layout": "thd", "mask": "none"},
            "layout",
            "ragged / paged backward graphs are not served",
        ),
    ],
)
def test_what_a_backward_spec_does_not_take_is_a_spec_error_naming_the_field(fields, field, words):
    with pytest.raises(SpecError) as err:
        GraphSpec.from_dict({**BACKWARD, **fields})
    assert err.value.field == field and words in str(err.value)


def test_a_manifest_family_lists_forward_and_backward(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "graphs:\n  - name: train\n    batch: 2\n    heads_q: 8\n    heads_kv: 2\n    seq_q: 128\n    head_dim: 64\n"
        "    dtype: bfloat16\n    mask: causal\n    generate_stats: true\n    kind: [forward, backward]\n"
    )
    forward, back = manifest.load(path)
    assert (forward.kind, forward.generate_stats) == ("forward", True) and back == GraphSpec(
        **BACKWARD, kind="backward"
    )
    path.write_text(path.read_text().replace("kind: [forward, backward]", "kind: backwards"))
    with pytest.raises(ManifestError, match=r"graphs\[0\] \(train\): field 'kind'.*allowed: forward"):
        manifest.load(path)
