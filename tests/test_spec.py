from __future__ import annotations

import math

import pytest

from graphcache import GraphSpec, SpecError

BASE = {"batch": 2, "heads_q": 32, "seq_q": 512, "head_dim": 128}


def make(**changes):
    return GraphSpec.from_dict({**BASE, **changes})


def test_defaults_are_resolved_and_written_out():
    spec = make()
    assert spec.heads_kv == 32 and spec.seq_kv == 512 and spec.head_dim_v == 128
    assert spec.attn_scale == 1 / math.sqrt(128)
    data = spec.to_dict()
    assert data["heads_kv"] == 32 and data["dtype"] == "float16" and data["mask"] == "none"
    assert data["window_left"] is None and data["dropout"] == 0.0


def test_canonical_round_trip_and_equality_of_explicit_defaults():
    spec = make(mask="sliding_window", window_left=127, dtype="bfloat16", heads_kv=8)
    again = GraphSpec.from_dict(__import__("json").loads(spec.canonical_json()))
    assert again == spec
    assert again.canonical_json() == spec.canonical_json()
    explicit = make(heads_kv=32, seq_kv=512, head_dim_v=128, attn_scale=1 / math.sqrt(128))
    assert explicit.canonical_json() == make().canonical_json()


def test_canonical_json_is_sorted_and_compact():
    text = make().canonical_json()
    assert " " not in text
    keys = list(__import__("json").loads(text))
    assert keys == sorted(keys)


def test_spec_is_immutable():
    spec = make()
    with pytest.raises(AttributeError):
        spec.batch = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"batch": 0}, "batch", "integer > 0"),
        ({"seq_q": -1}, "seq_q", "integer > 0"),
        ({"heads_q": 1.5}, "heads_q", "integer > 0"),
        ({"batch": True}, "batch", "integer > 0"),
        ({"heads_kv": 0}, "heads_kv", "integer > 0"),
        ({"heads_kv": 5}, "heads_q", "divisible"),
        ({"head_dim": 100}, "head_dim", "multiple of 8"),
        ({"head_dim": 264}, "head_dim", "at most 256"),
        ({"head_dim_v": 12}, "head_dim_v", "multiple of 8"),
        ({"dtype": "float32"}, "dtype", "float16, bfloat16"),
        ({"layout": "bsd"}, "layout", "each of b, h, s, d once with d (the head dim) last"),
        ({"layout": "bsdh"}, "layout", "d (the head dim) last"),
        ({"layout": "[3]bshd"}, "layout", "write bshd"),
        ({"layout": "bs[1]hd"}, "layout", "N >= 2"),
        ({"layout": "bs[+0]hd"}, "layout", "N >= 1"),
        ({"layout_q": "bshd[2]"}, "layout_q", "head dim must be innermost"),
        ({"layout_o": "bs[3]hd"}, "layout_o", "o is the graph's own output"),
        ({"layout": "thd", "layout_v": "bshd"}, "layout_v", "remove it"),
        ({"mask": "causal_top_left"}, "mask", "none, causal"),
        ({"mask": "sliding_window"}, "window_left", "missing"),
        ({"mask": "causal", "window_left": 4}, "window_left", "only to mask 'sliding_window'"),
        ({"window_right": 0}, "window_right", "only to mask 'sliding_window'"),
        ({"mask": "sliding_window", "window_left": -1}, "window_left", ">= 0"),
        ({"mask": "sliding_window", "window_left": 4, "window_right": -2}, "window_right", ">= 0"),
        ({"attn_scale": float("nan")}, "attn_scale", "finite number > 0"),
        ({"attn_scale": float("inf")}, "attn_scale", "finite number > 0"),
        ({"attn_scale": 0}, "attn_scale", "finite number > 0"),
        ({"attn_scale": -0.1}, "attn_scale", "finite number > 0"),
        ({"dropout": 1.0}, "dropout", "[0, 1)"),
        ({"dropout": -0.1}, "dropout", "[0, 1)"),
        ({"generate_stats": "yes"}, "generate_stats", "true or false"),
        ({"padding": 1}, "padding", "true or false"),
        ({"heads": 32}, "heads", "unknown field"),
    ],
)
def test_invalid_specs_name_the_field_value_and_what_is_allowed(changes, field, words):
    with pytest.raises(SpecError) as info:
        make(**changes)
    assert info.value.field == field
    assert field in str(info.value)
    assert words in str(info.value)


def test_typo_suggests_the_field_meant():
    with pytest.raises(SpecError, match="did you mean 'head_dim'"):
        make(head_dims=64)


def test_missing_required_field():
    with pytest.raises(SpecError, match="seq_q is missing"):
        GraphSpec.from_dict({"batch": 1, "heads_q": 8, "head_dim": 64})


def test_from_dict_refuses_non_mappings():
    with pytest.raises(SpecError, match="mapping"):
        GraphSpec.from_dict([1, 2])


def test_gqa_mqa_and_sliding_window_are_valid():
    assert make(heads_kv=8).heads_kv == 8
    assert make(heads_kv=1).heads_kv == 1
    window = make(mask="sliding_window", window_left=0)
    assert window.window_right == 0


def test_layout_fixes_strides():
    bshd = make(layout="bshd")
    bhsd = make(layout="bhsd")
    assert bshd.dims("q") == bhsd.dims("q") == (2, 32, 512, 128)
    assert bshd.strides("q") == (512 * 32 * 128, 128, 32 * 128, 1)
    assert bhsd.strides("q") == (32 * 512 * 128, 512 * 128, 128, 1)
    assert bshd.storage_shape("q") == (2, 512, 32, 128)
    gqa = make(heads_kv=8, head_dim_v=64)
    assert gqa.dims("k") == (2, 8, 512, 128) and gqa.dims("v") == (2, 8, 512, 64)
    assert gqa.dims("o") == (2, 32, 512, 64)


def test_summary_is_short_and_distinguishes_specs():
    spec = make(dtype="bfloat16", heads_kv=8, mask="causal")
    assert spec.summary() == "b2 h32/8 s512 d128 bf16 bshd causal"
    assert make().summary() != make(padding=True).summary()
