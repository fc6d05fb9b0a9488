from __future__ import annotations

import pytest

from graphcache import GraphSpec, UidMap, UnsupportedSpec
from graphcache.compilers.cudnn import build_graph, payload_bytes, payload_for_frontend
from graphcache.errors import BuildError
from graphcache.spec import layouts
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
    cudnn = pytest.importorskip("cudnn")
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


def _frontend_1_32():
    cudnn = pytest.importorskip("cudnn")
    if tuple(int(x) for x in cudnn.__version__.split(".")[:2]) < (1, 32):
        pytest.skip(f"the SDPA graph analyzer and lowering on CPU need frontend 1.32+, found {cudnn.__version__}")
    return cudnn


def _mask_from_flash_window(args: dict, seq_q: int, seq_kv: int):
    """The mask flash-attention's (is_causal, window_size, causal_bottom_right)
    means: key j is visible to query i iff i + off - left <= j <= i + off + right,
    off = seq_kv - seq_q when bottom-right aligned, -1 meaning unbounded and a
    causal mask bounding the right at 0."""
    import torch

    left, right = args["window_size"]
    if right < 0 and args["is_causal"]:
        right = 0
    off = seq_kv - seq_q if args["causal_bottom_right"] else 0
    i = torch.arange(seq_q).unsqueeze(1)
    j = torch.arange(seq_kv).unsqueeze(0)
    allowed = torch.ones(seq_q, seq_kv, dtype=torch.bool)
    if left >= 0:
        allowed &= j >= i + off - left
    if right >= 0:
        allowed &= j <= i + off + right
    return allowed


ORACLE_MASKS = [
    *MASKS,
    {"mask": "causal_bottom_right", "seq_q": 64, "seq_kv": 200},
    {"mask": "sliding_window", "window_left": 1},
    {"mask": "sliding_window", "window_left": 0, "window_right": 0},
    {"mask": "sliding_window", "window_left": 200, "window_right": 3, "seq_kv": 256},
]


@pytest.mark.torch
@pytest.mark.cudnn
@pytest.mark.parametrize("dialect_name", ["diagonal_band", "diagonal_band_is_inference", "causal_flags"])
@pytest.mark.parametrize("mask", ORACLE_MASKS, ids=lambda m: "-".join(map(str, m.values())))
def test_real_frontend_analyzer_reads_back_the_spec_mask(mask, dialect_name):
    """The oracle is 1.32's own SDPA graph analyzer (cudnn/sdpa/graph_analyzer.py),
    which resolves the keywords a graph was built with to the facts its Python
    engines run (causal, bottom_right, window_left, right_bound) and to
    flash-attention's window vocabulary; that window must mean the spec's mask
    as the torch reference computes it (torch_sdpa.allowed_mask)."""
    cudnn = _frontend_1_32()
    from cudnn.sdpa.graph_analyzer import adapter_mask_args, analyze

    from graphcache.compilers.cudnn import DIALECTS
    from graphcache.compilers.torch_sdpa import allowed_mask

    spec = make(**mask)
    dialect = next(d for d in DIALECTS if d.name == dialect_name)
    if dialect.kwargs(cudnn, spec) is None:
        assert dialect_name == "causal_flags" and spec.window_right  # the one mask it cannot express
        return
    built = build_graph(cudnn, spec, lower=False, dialects=(dialect,))
    node = built.graph.nodes() if callable(built.graph.nodes) else built.graph.nodes
    assert node[0].params["attn_scale"] == spec.attn_scale
    facts = analyze(built.graph)
    assert facts is not None and facts.invalid is None, facts
    sliding = spec.mask == "sliding_window"
    assert facts.bottom_right == (spec.mask == "causal_bottom_right")
    assert facts.window_left == (spec.window_left if sliding else None)
    assert facts.right_bound == (spec.window_right if sliding else None if spec.mask == "none" else 0)
    assert facts.causal == (spec.mask != "none" and not (sliding and spec.window_right))
    assert (facts.s_q, facts.s_kv) == (spec.seq_q, spec.seq_kv)
    seen = _mask_from_flash_window(adapter_mask_args(facts), spec.seq_q, spec.seq_kv)
    assert bool((seen == allowed_mask(spec)).all())


def _has_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# Issue 40: the tensor layouts real modules hand torch (tests/test_torch_layouts.py).
LAYOUTS = {
    "mha-sbhd": dict(layout="sbhd"),
    "vit-fused": dict(layout="bs[3]hd"),
    "neox-fused": dict(layout="bsh[3]d", mask="causal"),
    "hf-prefill": dict(layout="bhsd", layout_q="bshd", heads_kv=2, mask="causal"),
    "bigcode-mqa": dict(layout="bshd", layout_q="bs[+2]hd", heads_kv=1, mask="causal"),
    "modernbert-v": dict(layout="bshd", layout_v="bs[3]hd", padding=True),
    "class": dict(layout="sbhd", shapes="class", dtype="bfloat16"),
}


@pytest.mark.cudnn
@pytest.mark.parametrize("changes", list(LAYOUTS.values()), ids=list(LAYOUTS))
def test_real_frontend_takes_every_tensor_in_its_own_layout(changes):
    """The graph declares each tensor with its layout's strides; 1.32's own
    SDPA analyzer reads them back as a dense layout it takes (head dim
    contiguous, no broadcast, no aliasing: sdpa/graph_analyzer.py dense_layout_ok)."""
    cudnn = _frontend_1_32()
    from cudnn.sdpa.graph_analyzer import analyze

    spec = make(**changes)
    built = build_graph(cudnn, spec, lower=False)
    for role in ("q", "k", "v", "o"):
        t = built.tensors[role]
        assert list(t.get_dim()) == list(spec.dims(role)) and list(t.get_stride()) == list(spec.strides(role)), role
    built.graph.build_operation_graph()
    facts = analyze(built.graph)
    assert facts.dense_layout
    # Its stricter fact, what THD kernels need: every tensor in b, s, h, d order (groups allowed).
    assert facts.bshd_layout == all(layouts.layout(spec, r).order == "bshd" for r in ("q", "k", "v", "o"))


@pytest.mark.cudnn
@pytest.mark.skipif(_has_driver(), reason="records what 1.32 does on a machine without an NVIDIA driver")
@pytest.mark.parametrize("changes", MATRIX, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_real_frontend_lowers_to_the_operation_graph_on_cpu(changes):
    """1.32 on a machine with no GPU: validate() and build_operation_graph() run
    (SDPA is validated in Python and lowered to C++ only when planning); every
    later step needs the driver (docs/frontends.md records what each raises)."""
    cudnn = _frontend_1_32()
    spec = make(**changes)
    graph = build_graph(cudnn, spec, lower=False).graph
    graph.build_operation_graph()
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="NVIDIA driver"):
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    # The "not supported" above is the backend failing to load the driver, which
    # 1.32 reports as a decline; the graph keeps the backend's own error.
    declined = getattr(graph, "_backend_declined", None)
    assert isinstance(declined, RuntimeError) and not isinstance(declined, cudnn.cudnnGraphNotSupportedError)


@pytest.mark.cudnn
def test_standin_1_32_table_matches_the_installed_frontend():
    import re

    cudnn = _frontend_1_32()
    doc = cudnn._compiled_module.backend_graph.sdpa.__doc__
    params = re.search(r"sdpa\((.*?)\)\s*->", doc, re.S).group(1)
    names = [p.split(":")[0].strip() for p in re.split(r",\s*(?=\w+:)", params)]
    release = fe.RELEASES["1.32.0"]
    assert tuple(n for n in names if n != "self") == release.sdpa_keywords
    assert {a for a in fe.WATCHED if hasattr(cudnn, a)} == set(release.attrs)
    from cudnn import _plan_serdes

    assert issubclass(_plan_serdes._Unserializable, TypeError)  # why fe._Unserializable is one


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
        (fe.fe_1_24, "diagonal_band"),
        (fe.fe_1_27, "diagonal_band"),
        (fe.fe_1_32, "diagonal_band"),
        (fe.fe_1_27_lazy_old_keywords, "diagonal_band_is_inference"),
        (fe.fe_1_32_lazy_old_keywords, "diagonal_band_is_inference"),
    ],
    ids=lambda f: getattr(f, "__name__", f),
)
@pytest.mark.parametrize("mask", MASKS[:4], ids=lambda m: m["mask"])
def test_each_frontend_gets_its_dialect_and_keeps_the_mask(frontend, dialect, mask):
    cudnn = frontend()
    spec = make(**mask)
    built = build_graph(cudnn, spec)
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


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(map(str, m.values())))
def test_frontend_without_diagonal_alignment_declines_the_band_dialects(mask):
    # Defect 1: 1.5-1.9 have no cudnn.diagonal_alignment (new in 1.10). Reading it
    # raised AttributeError out of the chain on every build, masked or not.
    cudnn = fe.fe_1_7()
    assert not hasattr(cudnn, "diagonal_alignment")
    spec = make(**mask)
    if mask.get("window_right"):
        with pytest.raises(UnsupportedSpec, match="has no cudnn.diagonal_alignment"):
            build_graph(cudnn, spec)
        return
    built = build_graph(cudnn, spec)
    assert built.dialect == "causal_flags"
    assert [s.split(" ")[0] for s in built.skipped] == ["diagonal_band", "diagonal_band_is_inference"]
    assert all("cudnn-frontend 1.7.0 has no cudnn.diagonal_alignment" in s for s in built.skipped)


def test_a_dialect_reading_a_name_the_frontend_lacks_declines_instead_of_crashing():
    from graphcache.compilers.cudnn import DIALECTS, Dialect

    def reads_a_missing_name(cudnn, spec):  # noqa: ANN001
        return {"score_mod": cudnn.score_mod_kind.NONE}  # no release has cudnn.score_mod_kind

    chain = (Dialect("hypothetical", "2.0+", reads_a_missing_name), *DIALECTS)
    built = build_graph(fe.fe_1_12(), make(mask="causal"), dialects=chain)
    assert built.dialect == "diagonal_band_is_inference"
    assert built.skipped[0].startswith("hypothetical (cudnn-frontend 1.12.0 lacks a name it needs")


@pytest.mark.parametrize("frontend", [fe.fe_1_27_lazy_old_keywords, fe.fe_1_32_lazy_old_keywords])
def test_lazy_frontend_falls_back_only_after_lowering_fails(frontend):
    cudnn = frontend()
    built = build_graph(cudnn, make(mask="causal"))
    # sdpa() accepted the newest keywords; lowering (validate() on 1.27-1.30,
    # create_execution_plans() on 1.31+) refused them; the next dialect built.
    assert "generate_stats" in cudnn.calls[0] and "generate_stats" not in cudnn.lowered[0]
    assert len(cudnn.calls) == 2 and len(cudnn.lowered) == 1
    assert built.dialect == "diagonal_band_is_inference"
    assert built.skipped == [
        "diagonal_band: sdpa(): incompatible function arguments. The following argument types are supported:"
    ]


def test_lazy_refusal_after_validate_is_not_seen_without_lowering():
    # 1.31+ lower SDPA only at create_execution_plans(): a CPU build that stops
    # after validate() cannot tell whether the newest dialect would be refused.
    cudnn = fe.fe_1_32_lazy_old_keywords()
    built = build_graph(cudnn, make(mask="causal"), lower=False)
    assert built.dialect == "diagonal_band" and cudnn.lowered == []


NOT_REFUSALS = [
    # 1.32's cudnn._plan_serdes._Unserializable: a TypeError about a plan, not keywords.
    fe._Unserializable("plan.knobs[0] holds a builtins.object, which a serialized plan cannot represent"),
    # pybind's overload failure for another function (a wrong argument type).
    TypeError("set_stride(): incompatible function arguments. The following argument types are supported:"),
]


@pytest.mark.parametrize("error", NOT_REFUSALS, ids=["unserializable", "other-pybind-call"])
@pytest.mark.parametrize("step", ["validate", "create_execution_plans"])
def test_a_type_error_that_is_not_a_keyword_refusal_stops_the_chain_unrecorded(step, error):
    # Only pybind's "sdpa(): incompatible function arguments" means a dialect was
    # refused; any other TypeError must not send the chain on to the next dialect,
    # nor end as a negative entry for the target.
    from graphcache import GraphCacheError

    cudnn = fe.fe_1_32()

    def broken(self, *args):  # noqa: ANN001
        raise error

    setattr(cudnn.pygraph, step, broken)
    with pytest.raises(GraphCacheError) as info:
        build_graph(cudnn, make(mask="causal"))
    assert not isinstance(info.value, UnsupportedSpec)
    assert str(error).splitlines()[0] in str(info.value)
    assert len(cudnn.calls) == 1  # no other dialect was tried


def test_stats_survive_every_dialect():
    for frontend in (fe.fe_1_7, fe.fe_1_12, fe.fe_1_24, fe.fe_1_27, fe.fe_1_32):
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
    cudnn = pytest.importorskip("cudnn")
    built = build_graph(cudnn, make(mask="causal", dropout=0.1), lower=False)
    uids = UidMap.default()
    assert built.tensors["dropout_seed"].get_uid() == uids["dropout_seed"]
    assert built.tensors["dropout_offset"].get_uid() == uids["dropout_offset"]


def test_a_dialect_failing_on_graphcaches_own_mistake_is_a_build_error_not_a_verdict():
    """An AttributeError that is not the frontend lacking a name (a bug in a
    dialect) must not become an UnsupportedSpec stored for the whole target."""
    from graphcache.compilers.cudnn import DIALECTS, Dialect

    def buggy(cudnn, spec):  # noqa: ANN001
        return {"window": spec.no_such_field}

    chain = (Dialect("buggy", "2.0+", buggy), *DIALECTS)
    with pytest.raises(BuildError, match="dialect buggy failed") as err:
        build_graph(fe.fe_1_12(), make(mask="causal"), dialects=chain)
    assert not isinstance(err.value, UnsupportedSpec)


@pytest.mark.parametrize("version", list(fe.RELEASES))
def test_deserialize_into_calls_each_release_as_it_takes_it(version):
    """deserialize_into's table (handle from 1.14, enforce_precompiled from
    1.26) against the stand-ins, whose deserialize signatures
    tests/test_frontend_versions.py checks against each real binding."""
    from graphcache.compilers.cudnn import deserialize_into

    cudnn = fe.standin(version)
    graph = cudnn.pygraph()
    deserialize_into(graph, object(), b"standin-plan", version)  # a refused form raises TypeError
