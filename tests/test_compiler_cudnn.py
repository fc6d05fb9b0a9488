from __future__ import annotations

import pytest

from graphcache import GraphSpec, UidMap, UnsupportedSpec
from graphcache.compilers.cudnn import build_graph, payload_bytes, payload_for_frontend
from tests import cudnn_standins as fe

MASKS = [
    {"mask": "none"},
    {"mask": "causal"},
    {"mask": "causal_bottom_right", "seq_q": 64},
    {"mask": "sliding_window", "window_left": 32},
    {"mask": "sliding_window", "window_left": 32, "window_right": 8},
]


def make(**changes) -> GraphSpec:
    return GraphSpec.from_dict({"batch": 2, "heads_q": 8, "seq_q": 128, "head_dim": 64, **changes})


# -- the real frontend on this CPU (1.32: graph construction and validate()) ---------

MATRIX = [
    dict(dtype=dtype, layout=layout, **mask, **extra)
    for dtype in ("float16", "bfloat16")
    for layout in ("bshd", "bhsd")
    for mask in MASKS
    for extra in ({}, {"heads_kv": 2, "generate_stats": True}, {"padding": True, "head_dim_v": 32})
]


@pytest.mark.cudnn
@pytest.mark.parametrize("changes", MATRIX, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_real_frontend_constructs_and_validates(changes):
    import cudnn

    major_minor = tuple(int(x) for x in cudnn.__version__.split(".")[:2])
    if major_minor < (1, 32):
        pytest.skip(f"validate() without a GPU needs frontend 1.32+, found {cudnn.__version__}")
    spec = make(**changes)
    uids = UidMap.default()
    built = build_graph(cudnn, spec, uids, lower=False)
    assert built.dialect == "diagonal_band"
    assert set(built.timings) == {"validate"}
    for role in ("q", "k", "v", "o"):
        t = built.tensors[role]
        assert list(t.get_dim()) == list(spec.dims(role)), role
        assert list(t.get_stride()) == list(spec.strides(role)), role
        assert t.get_uid() == uids[role], role
    if spec.generate_stats:
        assert built.tensors["stats"].get_uid() == uids["stats"]
        assert list(built.tensors["stats"].get_dim()) == list(spec.dims("stats"))
    else:
        assert "stats" not in built.tensors
    if spec.padding:
        assert built.tensors["seq_len_q"].get_uid() == uids["seq_len_q"]
        assert built.tensors["seq_len_kv"].get_uid() == uids["seq_len_kv"]


@pytest.mark.cudnn
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(map(str, m.values())))
def test_real_frontend_graph_carries_the_mask_and_scale(mask):
    import cudnn

    spec = make(**mask)
    built = build_graph(cudnn, spec, lower=False)
    nodes = built.graph.nodes() if callable(built.graph.nodes) else built.graph.nodes
    params = nodes[0].params
    assert params["attn_scale"] == spec.attn_scale
    words = {k: (v.name if hasattr(v, "name") else v) for k, v in params.items() if k.startswith("diagonal")}
    assert words == EXPECTED["diagonal_band"][spec.mask] | (
        {"diagonal_band_right_bound": 8} if mask.get("window_right") else {}
    )


# -- the dialect chain against stand-ins for older frontends ----------------------------

EXPECTED = {
    # dialect -> mask -> the keywords that must reach sdpa()
    "diagonal_band": {
        "none": {},
        "causal": {"diagonal_alignment": "TOP_LEFT", "diagonal_band_right_bound": 0},
        "causal_bottom_right": {"diagonal_alignment": "BOTTOM_RIGHT", "diagonal_band_right_bound": 0},
        "sliding_window": {
            "diagonal_alignment": "TOP_LEFT",
            "diagonal_band_left_bound": 33,
            "diagonal_band_right_bound": 0,
        },
    },
    "causal_flags": {
        "none": {},
        "causal": {"use_causal_mask": True},
        "causal_bottom_right": {"use_causal_mask_bottom_right": True},
        "sliding_window": {"use_causal_mask": True, "sliding_window_length": 33},
    },
}
EXPECTED["diagonal_band_is_inference"] = EXPECTED["diagonal_band"]


@pytest.mark.parametrize(
    "frontend, dialect",
    [
        (fe.fe_1_7, "causal_flags"),
        (fe.fe_1_12, "diagonal_band_is_inference"),
        (fe.fe_1_27_lazy_old_keywords, "diagonal_band_is_inference"),
        (fe.fe_1_27, "diagonal_band"),
    ],
)
@pytest.mark.parametrize("mask", MASKS[:4], ids=lambda m: m["mask"])
def test_each_frontend_gets_its_dialect_and_keeps_the_mask(frontend, dialect, mask):
    cudnn = frontend()
    spec = make(**mask)
    built = build_graph(cudnn, spec)
    if spec.mask == "none" and dialect == "causal_flags":
        dialect = "diagonal_band_is_inference"  # no mask words: 1.7 accepts the 1.10 keyword set
    assert built.dialect == dialect
    received = cudnn.lowered[-1]
    mask_words = {k: v for k, v in received.items() if k.startswith(("diagonal", "use_causal", "sliding"))}
    assert mask_words == EXPECTED[dialect][spec.mask]
    assert set(built.timings) >= {
        "validate",
        "build_operation_graph",
        "create_execution_plans",
        "check_support",
        "build_plans",
    }
    if dialect == "diagonal_band":
        assert received["generate_stats"] is False and "is_inference" not in received
    else:
        assert received["is_inference"] is True and "generate_stats" not in received


def test_lazy_frontend_falls_back_only_after_lowering_fails():
    cudnn = fe.fe_1_27_lazy_old_keywords()
    built = build_graph(cudnn, make(mask="causal"))
    # sdpa() accepted the newest keywords; lowering refused them; the next dialect built.
    assert "generate_stats" in cudnn.calls[0] and "generate_stats" not in cudnn.lowered[0]
    assert built.dialect == "diagonal_band_is_inference"
    assert any("at lowering" in s for s in built.skipped)


def test_stats_survive_every_dialect():
    for frontend in (fe.fe_1_7, fe.fe_1_12, fe.fe_1_27):
        cudnn = frontend()
        built = build_graph(cudnn, make(generate_stats=True, mask="causal"))
        assert built.tensors["stats"].attrs["uid"] == UidMap.default()["stats"]


def test_window_looking_right_is_never_built_without_its_right_bound():
    # The oldest dialect only has causal windows: it must decline, not drop window_right.
    with pytest.raises(UnsupportedSpec) as info:
        build_graph(fe.fe_1_7(), make(mask="sliding_window", window_left=32, window_right=8))
    text = str(info.value)
    assert "1.7.0" in text and "sliding_window" in text and "cannot express mask" in text


def test_bottom_right_on_a_frontend_without_it_raises_naming_version_and_mask():
    cudnn = fe.fe_1_3()
    with pytest.raises(UnsupportedSpec, match=r"cudnn-frontend 1\.3\.0 cannot express mask 'causal_bottom_right'"):
        build_graph(cudnn, make(mask="causal_bottom_right", seq_q=64))
    assert cudnn.lowered == []  # nothing was built with the mask dropped


def test_causal_on_the_oldest_frontend_uses_the_causal_flag():
    cudnn = fe.fe_1_3()
    assert build_graph(cudnn, make(mask="causal")).dialect == "causal_flags"
    assert cudnn.lowered[-1]["use_causal_mask"] is True


def test_payload_forms_normalise_to_bytes():
    assert payload_bytes([1, 2, 255]) == b"\x01\x02\xff"
    assert payload_bytes(bytearray(b"ab")) == b"ab"
    assert payload_bytes(b"ab") == b"ab"
    assert payload_for_frontend(b"ab", "1.32.0") == b"ab"
    assert payload_for_frontend(b"ab", "1.23.0") == [97, 98]


@pytest.mark.cudnn
def test_real_frontend_dropout_gets_seed_and_offset_tensors_with_their_uids():
    import cudnn

    built = build_graph(cudnn, make(mask="causal", dropout=0.1), lower=False)
    uids = UidMap.default()
    assert built.tensors["dropout_seed"].get_uid() == uids["dropout_seed"]
    assert built.tensors["dropout_offset"].get_uid() == uids["dropout_offset"]
