"""Ragged (thd) and paged specs: their rules, and a key that covers every
property of every tensor descriptor their graphs are built with."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest

from graphcache import GraphSpec, SpecError, Target, UidMap, key_for
from graphcache.recipe import RECIPE_VERSION
from graphcache.spec.ragged import descriptors

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
RAGGED = dict(batch=4, heads_q=8, heads_kv=2, seq_q=256, seq_kv=512, head_dim=128, dtype="bfloat16", layout="thd")
PAGED = dict(
    batch=8, heads_q=8, heads_kv=2, seq_q=1, head_dim=128, dtype="bfloat16", layout="thd",
    page_size=16, num_pages=1024, pages_per_seq=256, mask="causal_bottom_right",
)  # fmt: skip


def test_a_paged_spec_reaches_as_far_as_its_table_and_thd_always_pads():
    spec = GraphSpec(**PAGED)
    assert spec.seq_kv == 256 * 16 and spec.padding
    assert spec.dims("k") == (1024, 2, 16, 128)  # (num_pages, heads_kv, page_size, d): NHD pages declared by strides
    assert spec.strides("k") == (16 * 2 * 128, 128, 2 * 128, 1)
    assert spec.dims("page_table_k") == (8, 1, 256, 1) and spec.dims("ragged_q") == (9, 1, 1, 1)
    assert GraphSpec.from_dict(json.loads(spec.canonical_json())) == spec


def test_page_size_must_be_a_power_of_two_named_in_the_error():
    with pytest.raises(SpecError) as info:
        GraphSpec(**{**PAGED, "page_size": 528, "pages_per_seq": 8})
    assert info.value.field == "page_size" and "power of two" in str(info.value) and "512" in str(info.value)


def test_a_table_width_that_disagrees_with_the_longest_kv_is_refused_before_any_gpu_step():
    with pytest.raises(SpecError) as info:
        GraphSpec(**{**PAGED, "seq_kv": 4096, "pages_per_seq": 300})
    assert info.value.field == "pages_per_seq" and "256" in str(info.value)
    assert GraphSpec(**{**PAGED, "seq_kv": 4090}).pages_per_seq == 256  # ceil(4090 / 16)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"page_size": None}, "page_size"),
        ({"num_pages": 0}, "num_pages"),
        ({"layout": "bshd"}, "layout"),
        ({"mask": "causal"}, "mask"),  # top-left: varlen_attn's masks are bottom-right
        ({"mask": "sliding_window", "window_left": 4}, "mask"),
        ({"mask": "sliding_window_bottom_right"}, "window_left"),  # unbounded both ways is causal_bottom_right
        ({"mask": "sliding_window_bottom_right", "window_left": -2}, "window_left"),
    ],
)
def test_bad_ragged_fields_name_the_field(changes, field):
    with pytest.raises(SpecError) as info:
        GraphSpec(**{**PAGED, **changes})
    assert info.value.field == field


def test_bottom_right_windows_belong_to_thd_and_a_left_bound_may_be_unbounded():
    spec = GraphSpec(**RAGGED, mask="sliding_window_bottom_right", window_right=3)
    assert (spec.window_left, spec.window_right) == (None, 3)
    with pytest.raises(SpecError) as info:
        GraphSpec(batch=1, heads_q=8, seq_q=64, head_dim=64, mask="sliding_window_bottom_right", window_left=3)
    assert info.value.field == "mask"


def test_dense_specs_keep_their_canonical_form_and_uid_map():
    dense = GraphSpec(batch=1, heads_q=32, seq_q=4096, head_dim=128)
    for name in ("page_size", "num_pages", "pages_per_seq"):
        assert name not in dense.to_dict()
    assert UidMap.default().for_spec(dense).to_dict() == UidMap.default().to_dict()
    ragged_uids = UidMap.default().for_spec(GraphSpec(**RAGGED)).to_dict()
    assert {"ragged_q", "ragged_k", "page_table_k"} <= set(ragged_uids)
    assert len(set(ragged_uids.values())) == len(ragged_uids)


def _variants() -> list[GraphSpec]:
    """Specs that differ from a ragged and a paged base in one property each
    (and some in several)."""
    out = []
    for base in (RAGGED, PAGED):
        out.append(GraphSpec(**base))
        for changes in (
            {"batch": base["batch"] * 2},
            {"heads_q": 16},
            {"heads_kv": 8},
            {"seq_q": 128} if base is RAGGED else {"seq_q": 2},
            {"head_dim": 64},
            {"head_dim_v": 64},
            {"dtype": "float16"},
            {"attn_scale": 0.5},
            {"generate_stats": True},
            {"mask": "none" if base is PAGED else "causal_bottom_right"},
            {"mask": "sliding_window_bottom_right", "window_left": 128},
            {"mask": "sliding_window_bottom_right", "window_left": 127},
            {"mask": "sliding_window_bottom_right", "window_left": 128, "window_right": 1},
        ):
            out.append(GraphSpec(**{**base, **changes}))
    out.append(GraphSpec(**{**RAGGED, "seq_kv": 1024}))
    out.append(GraphSpec(**{**PAGED, "num_pages": 2048}))  # the pool size
    out.append(GraphSpec(**{**PAGED, "page_size": 32, "pages_per_seq": 128}))  # same reach, other pages
    out.append(GraphSpec(**{**PAGED, "pages_per_seq": 512}))  # the table width
    out.append(GraphSpec(**{**PAGED, "seq_kv": 4090}))  # max_seq_len_kv, same table
    out.append(GraphSpec(**{**PAGED, "seq_q": 64}))  # chunked prefill over the pages
    return out


def _static(spec: GraphSpec) -> str:
    """Everything the graph is built with: each descriptor's dims, strides
    and dtype, and the node's scalar settings."""
    node = {
        name: getattr(spec, name)
        for name in ("attn_scale", "mask", "window_left", "window_right", "generate_stats", "seq_kv", "shapes")
    }
    return json.dumps({"descriptors": descriptors(spec), "node": node}, sort_keys=True)


def test_specs_whose_graphs_differ_in_any_descriptor_property_have_different_keys():
    specs = _variants()
    assert len({_static(s) for s in specs}) == len(specs)  # each variant changes what is built
    keys = {key_for(s, TARGET): s for s in specs}
    assert len(keys) == len(specs)
    for a, b in itertools.combinations(specs, 2):
        if _static(a) != _static(b):
            assert key_for(a, TARGET) != key_for(b, TARGET), (a.summary(), b.summary())


def test_every_descriptor_property_moves_between_some_variants():
    """The variants exercise dims, strides and dtypes of data, of offsets and
    of tables, the table width, the pool size and the page size: each moves."""
    specs = _variants()
    seen: dict[str, set[str]] = {}
    for spec in specs:
        for role, (dims, strides, dtype) in descriptors(spec).items():
            seen.setdefault(f"{role}.dims", set()).add(str(dims))
            seen.setdefault(f"{role}.strides", set()).add(str(strides))
            seen.setdefault(f"{role}.dtype", set()).add(dtype)
    for prop in ("q.dims", "k.dims", "k.strides", "q.dtype", "page_table_k.dims", "ragged_q.dims", "stats.dims"):
        assert len(seen[prop]) > 1, prop
    assert seen["ragged_q.dtype"] == {"int64"} and seen["page_table_k.dtype"] == {"int32"}


# Offsets and tables have one dtype each, fixed by the recipe (the key covers
# RECIPE_VERSION): this digest pins what a recipe declares. If it changes,
# the graph a spec turns into changed: bump graphcache/recipe.py and this.
DESCRIPTORS_DIGEST = {2: "31461750ec943ac31edb3742c60284b4f2955e099aee146731e256f1e530770f"}


def test_descriptors_are_pinned_to_the_recipe_version():
    text = json.dumps([descriptors(s) for s in _variants()], sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert DESCRIPTORS_DIGEST.get(RECIPE_VERSION) == digest, (
        f"the descriptors of recipe {RECIPE_VERSION} changed (digest {digest}): bump RECIPE_VERSION "
        "in graphcache/recipe.py, then record the new digest here"
    )


def test_a_thd_graph_serves_many_lengths_through_its_offsets_and_rounds_under_pow2():
    from graphcache.spec.classes import declared

    paged = declared(GraphSpec(**{**PAGED, "batch": 5, "seq_q": 3}), "pow2")
    assert (paged.batch, paged.seq_q, paged.seq_kv, paged.pages_per_seq) == (8, 128, 4096, 256)
    ragged = declared(GraphSpec(**{**RAGGED, "batch": 3, "seq_q": 200, "seq_kv": 300}), "pow2")
    assert (ragged.batch, ragged.seq_q, ragged.seq_kv) == (4, 256, 512) and not ragged.is_class
    decode = GraphSpec(**{**PAGED, "batch": 3})
    assert declared(decode, "pow2").seq_q == 1 and declared(decode, "exact") == decode
