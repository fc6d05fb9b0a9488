"""The spec field ``bias`` (graphcache.spec.bias): which dims an additive
score bias has, validated, in the key only where it is set."""

from __future__ import annotations

import json

import pytest

from graphcache import GraphSpec, SpecError, UidMap, manifest
from graphcache.key import key_for
from tests.fakes import TARGET

BASE = {"batch": 4, "heads_q": 8, "heads_kv": 2, "seq_q": 128, "seq_kv": 256, "head_dim": 64, "dtype": "bfloat16"}


def make(**changes) -> GraphSpec:  # noqa: ANN003
    return GraphSpec.from_dict({**BASE, **changes})


def test_no_bias_is_the_default_and_leaves_the_canonical_form_and_key_unchanged():
    plain = make()
    assert plain.bias is None
    assert "bias" not in json.loads(plain.canonical_json())
    assert make(bias=None).canonical_json() == plain.canonical_json()
    assert key_for(make(bias=None), TARGET) == key_for(plain, TARGET)
    assert "bias" not in UidMap.default().for_spec(plain).to_dict()


@pytest.mark.parametrize(
    "bias, dims",
    [("bhss", (4, 8, 128, 256)), ("b1ss", (4, 1, 128, 256)), ("1hss", (1, 8, 128, 256)), ("11ss", (1, 1, 128, 256))],
)
def test_each_bias_names_its_dims_and_the_key_covers_it(bias, dims):
    spec = make(bias=bias)
    assert spec.dims("bias") == dims
    assert spec.storage_shape("bias") == dims
    b, h, s, k = dims
    assert spec.strides("bias") == (h * s * k, s * k, k, 1)  # packed, whatever the layout of q/k/v
    assert json.loads(spec.canonical_json())["bias"] == bias
    assert GraphSpec.from_dict(json.loads(spec.canonical_json())) == spec
    assert key_for(spec, TARGET) != key_for(make(), TARGET)
    assert f"bias({bias})" in spec.summary()
    assert UidMap.default().for_spec(spec)["bias"] == 17


def test_keys_of_different_biases_differ():
    keys = {key_for(make(bias=b), TARGET) for b in ("bhss", "b1ss", "1hss", "11ss")}
    assert len(keys) == 4


@pytest.mark.parametrize("bad", ["bhqk", "BHSS", "b1s", 1, True, ["b", "1"]])
def test_a_bad_bias_names_the_field_and_the_allowed_values(bad):
    with pytest.raises(SpecError) as info:
        make(bias=bad)
    assert info.value.field == "bias"
    assert "bhss" in str(info.value) and "11ss" in str(info.value)


def test_a_ragged_spec_takes_no_bias():
    with pytest.raises(SpecError) as info:
        GraphSpec(batch=4, heads_q=8, seq_q=128, head_dim=64, layout="thd", bias="b1ss")
    assert info.value.field == "bias" and "thd" in str(info.value)


def test_a_class_covers_only_specs_with_its_bias_and_takes_their_shape():
    klass = make(bias="b1ss", shapes="class")
    assert klass.covers(make(bias="b1ss", batch=3, seq_q=100, seq_kv=200))
    assert not klass.covers(make(bias="bhss", batch=3, seq_q=100, seq_kv=200))
    assert not klass.covers(make(batch=3, seq_q=100, seq_kv=200))
    assert klass.at(3, 100, 200).dims("bias") == (3, 1, 100, 200)


def test_manifests_accept_the_field(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "defaults: {dtype: bfloat16, heads_q: 8, head_dim: 64}\n"
        "graphs:\n  - {name: padded, batch: 4, seq_q: 1, seq_kv: 300, bias: b1ss}\n"
        "  - {name: t5, batch: 1, seq_q: 64, bias: 1hss}\n"
    )
    specs = manifest.load(path)
    assert [s.bias for s in specs] == ["b1ss", "1hss"]


def test_the_json_schema_lists_the_values():
    schema = GraphSpec.json_schema()["properties"]["bias"]
    assert set(schema["enum"]) == {"bhss", "b1ss", "1hss", "11ss", None}


@pytest.mark.parametrize("bias", ["bhss", "b1ss", "1hss", "11ss"])
def test_bias_dtype_leaves_every_bias_specs_key_as_it_was_and_float32_is_a_spec_of_its_own(bias):
    spec = make(bias=bias)
    assert spec.bias_dtype is None and "bias_dtype" not in json.loads(spec.canonical_json())
    assert key_for(make(bias=bias, bias_dtype=None), TARGET) == key_for(spec, TARGET)
    wide = make(bias=bias, bias_dtype="float32")
    assert json.loads(wide.canonical_json())["bias_dtype"] == "float32"
    assert GraphSpec.from_dict(json.loads(wide.canonical_json())) == wide
    assert key_for(wide, TARGET) != key_for(spec, TARGET)
    assert f"bias({bias},fp32)" in wide.summary() and wide.dims("bias") == spec.dims("bias")
    assert UidMap.default().for_spec(wide)["bias"] == 17
    klass = make(bias=bias, bias_dtype="float32", shapes="class")
    assert klass.covers(make(bias=bias, bias_dtype="float32", batch=3)) and not klass.covers(make(bias=bias, batch=3))


@pytest.mark.parametrize(
    "changes",
    [
        {"bias": "1hss", "bias_dtype": "float16"},
        {"bias": "1hss", "bias_dtype": "fp32"},
        {"bias": "1hss", "bias_dtype": True},
    ],
)
def test_a_bad_bias_dtype_or_one_without_a_bias_names_the_field(changes):
    for bad in (changes, {"bias_dtype": "float32"}):
        with pytest.raises(SpecError) as info:
            make(**bad)
        assert info.value.field == "bias_dtype" and "float32" in str(info.value)


def test_the_json_schema_lists_the_bias_dtypes():
    assert set(GraphSpec.json_schema()["properties"]["bias_dtype"]["enum"]) == {"float32", None}
