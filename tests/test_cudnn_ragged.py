"""Ragged (thd), paged and ragged-over-paged cuDNN graphs on a CPU: the real
cudnn-frontend 1.32 constructs them, runs validate() and
build_operation_graph() (what runs without a GPU), and they hold exactly the
descriptors the key covers; the version gates; the build-time check
(graphcache.compilers.varlen_check) against graphs right and wrong.
The GPU halves are in tests/test_varlen_gpu.py."""

from __future__ import annotations

import pytest

from graphcache import GraphSpec, UidMap, UnsupportedSpec
from graphcache.spec.ragged import descriptors

torch = pytest.importorskip("torch", reason="the build-time check runs on torch tensors")

BASE = dict(batch=4, heads_q=8, heads_kv=2, head_dim=128, dtype="bfloat16", layout="thd")
SPECS = {
    "ragged": GraphSpec(**BASE, seq_q=256, seq_kv=512, mask="causal_bottom_right"),
    "ragged-stats-window": GraphSpec(
        **BASE, seq_q=256, seq_kv=512, mask="sliding_window_bottom_right", window_left=64, generate_stats=True
    ),
    "paged-decode": GraphSpec(
        **BASE, seq_q=1, mask="causal_bottom_right", page_size=16, num_pages=1024, pages_per_seq=256
    ),
    "ragged-over-paged": GraphSpec(
        **BASE,
        seq_q=128,
        mask="causal_bottom_right",
        page_size=64,
        num_pages=512,
        pages_per_seq=64,
        generate_stats=True,
    ),  # fmt: skip
}
_TYPES = {"bfloat16": "BFLOAT16", "float16": "HALF", "float32": "FLOAT", "int32": "INT32", "int64": "INT64"}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_real_frontend_validates_and_builds_the_operation_graph(cudnn, name):
    from graphcache.compilers.cudnn import build_graph

    spec = SPECS[name]
    built = build_graph(cudnn, spec, UidMap.default(), None, lower=False)  # validate()
    built.graph.build_operation_graph()
    uids = UidMap.default().for_spec(spec)
    want = descriptors(spec)
    assert sorted(built.tensors) == sorted(want)
    for role, (dims, strides, dtype) in want.items():
        t = built.tensors[role]
        got = (tuple(t.get_dim()), tuple(t.get_stride()), t.get_data_type(), t.get_uid())
        assert got == (dims, strides, getattr(cudnn.data_type, _TYPES[dtype]), uids[role]), role
    offsets = {role: built.tensors[role].ragged_offset for role in ("q", "k", "v", "o")}
    assert offsets["q"].get_uid() == uids["ragged_q"] and offsets["o"].get_uid() == uids["ragged_o"]
    if spec.page_size is None:
        assert offsets["k"].get_uid() == uids["ragged_k"] and offsets["v"].get_uid() == uids["ragged_v"]
    else:
        assert offsets["k"] is None and offsets["v"] is None  # pages are placed by the tables, not offsets
    if spec.generate_stats:
        assert built.tensors["stats"].ragged_offset.get_uid() == uids["ragged_stats"]


def test_validate_is_a_real_check_ragged_without_the_padding_mask_is_refused(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph, ragged

    real = ragged.declare

    def without_padding(cudnn_, spec, uids, handle, mask_kwargs):  # noqa: ANN001
        original = cudnn_.pygraph.sdpa

        def sdpa(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            kwargs["use_padding_mask"] = False
            kwargs.pop("seq_len_q")
            kwargs.pop("seq_len_kv")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cudnn_.pygraph, "sdpa", sdpa)
        return real(cudnn_, spec, uids, handle, mask_kwargs)

    monkeypatch.setattr(ragged, "declare", without_padding)
    with pytest.raises(UnsupportedSpec, match="padding_mask=True"):
        build_graph(cudnn, SPECS["ragged"], UidMap.default(), None, lower=False)


def test_bottom_right_windows_map_left_l_to_cudnns_left_bound_l_plus_1(cudnn):
    from graphcache.compilers.cudnn.dialects import DIALECTS

    band = DIALECTS[0].kwargs(cudnn, SPECS["ragged-stats-window"])
    assert band["diagonal_alignment"] == cudnn.diagonal_alignment.BOTTOM_RIGHT
    assert (band["diagonal_band_left_bound"], band["diagonal_band_right_bound"]) == (65, 0)
    right_only = GraphSpec(**BASE, seq_q=8, mask="sliding_window_bottom_right", window_right=3)
    assert DIALECTS[0].kwargs(cudnn, right_only) == {
        "generate_stats": False,
        "diagonal_alignment": cudnn.diagonal_alignment.BOTTOM_RIGHT,
        "diagonal_band_right_bound": 3,
    }
    assert DIALECTS[-1].kwargs(cudnn, right_only) is None  # 1.5-1.9 windows are top-left: declined, never dropped


@pytest.mark.parametrize(
    ("name", "cudnn_version", "cc", "needs"),
    [
        ("paged-decode", "9.4.0", "9.0", "cuDNN >= 9.5"),
        ("ragged-over-paged", "9.6.0", "9.0", "cuDNN >= 9.7"),
        ("ragged", "9.17.0", "8.0", "cuDNN >= 9.18.1"),
        ("ragged-over-paged", "9.10.0", "8.9", "cuDNN >= 9.18.1"),
    ],
)
def test_a_target_without_the_feature_is_unsupported_naming_what_is_needed(name, cudnn_version, cc, needs):
    from graphcache.compilers.cudnn.ragged import check_target

    with pytest.raises(UnsupportedSpec, match=needs.replace(".", r"\.")) as info:
        check_target(SPECS[name], "1.32.0", cudnn_version, cc)
    assert info.value.step == "preflight"


def test_targets_with_the_features_pass_the_gate():
    from graphcache.compilers.cudnn.ragged import check_target

    check_target(SPECS["ragged"], "1.32.0", "9.17.0", "9.0")  # no SM90 floor
    check_target(SPECS["ragged-over-paged"], "1.32.0", "9.18.1", "8.0")
    check_target(SPECS["paged-decode"], "1.32.0", "9.28.0", "10.0")


# -- the build-time check ------------------------------------------------------------


def small(**changes):
    return GraphSpec(**{**BASE, "heads_q": 4, "head_dim": 64, "batch": 6, "seq_q": 130, "seq_kv": 200, **changes})


CHECKED = {
    "ragged": small(mask="causal_bottom_right", generate_stats=True),
    "paged": small(seq_q=1, mask="causal_bottom_right", page_size=16, num_pages=96, pages_per_seq=13),
    "ragged-over-paged": small(mask="causal_bottom_right", page_size=16, num_pages=96, pages_per_seq=13),
}


def test_the_checks_call_has_unequal_lengths_with_1_and_0_tokens_and_off_tile_ones():
    from graphcache.compilers.varlen_check import lengths_for

    lens_q, lens_k = lengths_for(CHECKED["ragged"])
    assert 0 in lens_q and 1 in lens_q and {63, 65} <= set(lens_q) | set(lens_k)
    assert len(set(lens_k)) > 2


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_the_reference_graph_passes_the_check(name):
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph
    from graphcache.compilers.varlen_check import errors, inputs

    spec = CHECKED[name]
    error, lse_error = errors(spec, TorchSdpaGraph(spec), inputs(spec, "cpu"))
    assert error <= 1e-2 and (lse_error is None or lse_error <= 1e-6)


class ReadsSlack:
    """A wrong graph: each sequence also reads its next token (the slack of
    the last one is NaN), as a graph with lengths off by one would."""

    def __init__(self, spec):  # noqa: ANN001
        from graphcache.compilers.torch_sdpa import TorchSdpaGraph

        self.inner = TorchSdpaGraph(spec.replace(seq_q=spec.seq_q + 1, seq_kv=spec.seq_kv + 1))

    def run_varlen(self, q, k, v, cu_seq_q, cu_seq_k, seqused_k=None, block_table=None):  # noqa: ANN001
        more = cu_seq_k.clone()
        more[1:] += 1
        return self.inner.run_varlen(q, k, v, cu_seq_q, more, seqused_k, block_table)


class WrongGqaLse:
    """cudnn-frontend#1083's bug: on one-token rows only the first q head of
    each kv group gets its log-sum-exp; the output is right."""

    def __init__(self, spec):  # noqa: ANN001
        from graphcache.compilers.torch_sdpa import TorchSdpaGraph

        self.inner, self.spec = TorchSdpaGraph(spec), spec

    def run_varlen(self, q, k, v, cu_seq_q, cu_seq_k, seqused_k=None, block_table=None):  # noqa: ANN001
        out, lse = self.inner.run_varlen(q, k, v, cu_seq_q, cu_seq_k, seqused_k, block_table)
        group = self.spec.heads_q // self.spec.heads_kv
        for n in range(cu_seq_q.shape[0] - 1):
            a, b = int(cu_seq_q[n]), int(cu_seq_q[n + 1])
            if b - a == 1:
                lse[[h for h in range(self.spec.heads_q) if h % group], a] = 0.0
        return out, lse


def test_a_graph_that_reads_past_a_sequence_fails_the_check():
    from graphcache.compilers.varlen_check import errors, inputs

    spec = CHECKED["ragged"].replace(generate_stats=False)
    error, _ = errors(spec, ReadsSlack(spec), inputs(spec, "cpu"))
    assert error > 2e-2  # inf where it reached the NaN slack


def test_a_wrong_log_sum_exp_on_single_token_gqa_rows_fails_the_check_though_the_output_is_right():
    from graphcache.compilers.varlen_check import errors, inputs

    spec = CHECKED["ragged"]
    error, lse_error = errors(spec, WrongGqaLse(spec), inputs(spec, "cpu"))
    assert error <= 1e-2 and lse_error is not None and lse_error > 2e-2


def test_the_canary_of_a_thd_graph_is_its_checks_call_and_ignores_what_sees_no_key():
    from graphcache.compilers import canary
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph

    spec = CHECKED["ragged-over-paged"]
    graph = TorchSdpaGraph(spec)
    feed = canary.inputs(spec, "cpu")
    assert feed["block_table"] is not None  # the paged check's call: pool, table, seqused_k
    assert canary.input_digest(canary.inputs(spec, "cpu")) == canary.input_digest(feed)  # seeded: the same call
    out = graph.run_varlen(**feed)[0]
    record = canary.describe(spec, out, feed, deterministic=True)
    assert canary.comparable(record, canary.inputs(spec, "cpu"))
    assert canary.same_bits(spec, record, graph.run_varlen(**feed)[0], feed)
    slack = out.clone()
    slack[-1] = float("nan")  # past the last sequence: promised nothing
    assert canary.mismatch(spec, record, slack, feed) is None
    wrong = out.clone()
    wrong[0] += 1  # the first sequence's first row sees keys
    assert "deterministic" in canary.mismatch(spec, record, wrong, feed)
    loose = dict(record, deterministic=False)
    assert canary.mismatch(spec, loose, out * 1.001, feed) is None  # within bf16's tolerance
    assert canary.mismatch(spec, loose, out * 1.5, feed) is not None


class OnCpu:
    """A stand-in for a loaded CudnnGraph (cuDNN cannot run here): its
    ``run_varlen`` is another graph's, its device the CPU."""

    device = "cpu"

    def __init__(self, inner):  # noqa: ANN001
        self.run_varlen = inner.run_varlen


def _artifact(spec):  # noqa: ANN001
    from graphcache import Artifact
    from tests.fakes import TARGET

    return Artifact(spec=spec, target=TARGET, payload=b"plan", runtime={"engine": "stand-in"})


def test_the_compilers_ragged_check_records_the_canary_of_a_right_graph():
    from graphcache.compilers.cudnn.compiler import _checked_ragged
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph

    spec = CHECKED["ragged"]
    checked = _checked_ragged(_artifact(spec), OnCpu(TorchSdpaGraph(spec)))
    assert checked.validation_error <= 1e-2 and checked.canary["deterministic"] and checked.runtime["lse_error"] == 0


def test_a_wrong_lse_with_a_right_output_is_unsupported_on_the_target_and_a_wrong_output_a_build_error():
    from graphcache import BuildError
    from graphcache.compilers.cudnn.compiler import _checked_ragged

    spec = CHECKED["ragged"]
    with pytest.raises(UnsupportedSpec, match="1083") as info:
        _checked_ragged(_artifact(spec), OnCpu(WrongGqaLse(spec)))
    assert info.value.step == "check"
    plain = spec.replace(generate_stats=False)
    with pytest.raises(BuildError, match="differs from the float32 reference"):
        _checked_ragged(_artifact(plain), OnCpu(ReadsSlack(plain)))
