"""Bias graphs in the cuDNN compiler on this CPU (issue 25, item 1): the
declaration against the real cudnn-frontend 1.32 (validate and
build_operation_graph run without a GPU), the override lists of a class
graph, the release table, and the float32 reference and torch fallback
they are checked against. Not yet run on a GPU."""

from __future__ import annotations

import pytest

from graphcache import GraphSpec, UidMap
from graphcache.compilers.cudnn import build_graph
from graphcache.compilers.cudnn.releases import BIAS, BIAS_OVERRIDE, available, missing

torch = pytest.importorskip("torch", reason="the reference checks run on torch tensors")

BIASES = ("bhss", "b1ss", "1hss", "11ss")


def make(**changes) -> GraphSpec:  # noqa: ANN003
    base = {"batch": 2, "heads_q": 8, "heads_kv": 2, "seq_q": 128, "seq_kv": 192, "head_dim": 64}
    return GraphSpec.from_dict({**base, "dtype": "bfloat16", **changes})


def _frontend_1_32():
    cudnn = pytest.importorskip("cudnn", reason="needs nvidia-cudnn-frontend (1.32 runs its graph code on a CPU)")
    if tuple(int(x) for x in cudnn.__version__.split(".")[:2]) < (1, 32):
        pytest.skip(f"validate() and lowering without a GPU need frontend 1.32+, found {cudnn.__version__}")
    return cudnn


def _has_driver() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.cudnn
@pytest.mark.skipif(_has_driver(), reason="records what 1.32 does on a machine without an NVIDIA driver")
@pytest.mark.parametrize("bias", BIASES)
@pytest.mark.parametrize(
    "extra", [{}, {"layout": "bhsd", "mask": "causal"}, {"shapes": "class", "generate_stats": True}]
)
def test_a_bias_graph_validates_and_lowers_with_the_bias_tensor_it_declares(bias, extra):
    cudnn = _frontend_1_32()
    spec = make(bias=bias, **extra)
    uids = UidMap.default()
    built = build_graph(cudnn, spec, uids, lower=False)
    t = built.tensors["bias"]
    assert list(t.get_dim()) == list(spec.dims("bias")) and list(t.get_stride()) == list(spec.strides("bias"))
    assert t.get_uid() == 17 == uids.for_spec(spec)["bias"]
    node = built.graph.nodes() if callable(built.graph.nodes) else built.graph.nodes
    assert node[0].inputs["bias"] is t  # the sdpa node reads it as its bias
    built.graph.build_operation_graph()
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="NVIDIA driver"):
        built.graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])


def test_a_graph_without_bias_declares_none():
    cudnn = _frontend_1_32()
    built = build_graph(cudnn, make(), UidMap.default(), lower=False)
    assert "bias" not in built.tensors


def test_the_release_table_says_who_takes_a_bias_and_a_bias_under_override():
    assert available(BIAS, "1.3.0", "9.0.0")
    assert available(BIAS_OVERRIDE, "1.32.0", "9.28.0")
    assert "cuDNN >= 9.21" in (missing(BIAS_OVERRIDE, "1.32.0", "9.20.0") or "")
    assert "cudnn-frontend >= 1.24" in (missing(BIAS_OVERRIDE, "1.23.0", "9.28.0") or "")
