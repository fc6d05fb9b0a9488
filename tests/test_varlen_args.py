"""A ragged / paged graph's per-call index tensors (graphcache.compilers.varlen_args):
their values, their descriptors, and that computing them never reads a
tensor's value on the host (the hot path of a cached graph on a GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="needs torch")

from graphcache import ExecutionError, GraphSpec  # noqa: E402
from graphcache.compilers.varlen_args import check_call, graph_inputs  # noqa: E402
from graphcache.spec.ragged import descriptors  # noqa: E402

RAGGED = GraphSpec(
    batch=4, heads_q=8, heads_kv=2, seq_q=128, head_dim=64, dtype="bfloat16", layout="thd",
    mask="causal_bottom_right", generate_stats=True,
)  # fmt: skip
PAGED = GraphSpec(
    batch=4, heads_q=8, heads_kv=2, seq_q=1, head_dim=64, dtype="bfloat16", layout="thd",
    mask="causal_bottom_right", page_size=16, num_pages=32, pages_per_seq=8,
)  # fmt: skip


@pytest.fixture
def no_host_reads(monkeypatch):
    """Make every way of reading a tensor's value on the host raise."""

    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("a tensor's value was read on the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__index__", "__float__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    yield


def _ragged_call():
    cu_q = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 6, 16], dtype=torch.int32)
    q = torch.zeros(9, 8, 64, dtype=torch.bfloat16)
    k = torch.zeros(16, 2, 64, dtype=torch.bfloat16)
    return q, k, cu_q, cu_k


def test_ragged_offsets_are_element_offsets_padded_to_the_class_batch(no_host_reads):
    q, k, cu_q, cu_k = _ragged_call()
    assert check_call(RAGGED, q, k, k, cu_q, cu_k) == 3
    got = graph_inputs(RAGGED, cu_q, cu_k)
    for role, (dims, strides, dtype) in descriptors(RAGGED).items():
        if role in got:
            t = got[role]
            assert tuple(t.shape) == dims and tuple(t.stride()) == strides and str(t.dtype) == f"torch.{dtype}", role


def test_ragged_offset_values():
    q, k, cu_q, cu_k = _ragged_call()
    got = graph_inputs(RAGGED, cu_q, cu_k)
    assert got["ragged_q"].flatten().tolist() == [0, 3 * 512, 4 * 512, 9 * 512, 9 * 512]  # H_q * D = 512
    assert got["ragged_k"].flatten().tolist() == [0, 5 * 128, 6 * 128, 16 * 128, 16 * 128]
    assert got["ragged_stats"].flatten().tolist() == [0, 24, 32, 72, 72]  # token-major (T, H_q) stats
    assert got["seq_len_q"].flatten().tolist() == [3, 1, 5, 0]  # the missing 4th sequence has no tokens
    assert got["seq_len_kv"].flatten().tolist() == [5, 1, 10, 0]
    used = graph_inputs(RAGGED, cu_q, cu_k, seqused_k=torch.tensor([2, 1, 4], dtype=torch.int32))
    assert used["seq_len_kv"].flatten().tolist() == [2, 1, 4, 0] and used["ragged_k"].equal(got["ragged_k"])


def test_paged_tables_and_lengths_pad_without_host_reads(no_host_reads):
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    used = torch.tensor([17, 3], dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    q = torch.zeros(2, 8, 64, dtype=torch.bfloat16)
    pool = torch.zeros(32, 16, 2, 64, dtype=torch.bfloat16)
    assert check_call(PAGED, q, pool, pool, cu_q, None, used, table) == 2
    got = graph_inputs(PAGED, cu_q, None, used, table)
    for role, (dims, strides, dtype) in descriptors(PAGED).items():
        if role in got:
            t = got[role]
            assert tuple(t.shape) == dims and tuple(t.stride()) == strides and str(t.dtype) == f"torch.{dtype}", role
    assert got["page_table_k"] is got["page_table_v"]


def test_paged_values():
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    got = graph_inputs(PAGED, torch.tensor([0, 1, 2]), None, torch.tensor([17, 3]), table)
    assert got["seq_len_kv"].flatten().tolist() == [17, 3, 0, 0]
    assert got["page_table_k"][:2].view(2, 8).equal(table) and not got["page_table_k"][2:].any()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("width", "table width is part of the graph"),
        ("pool", "key has shape"),
        ("batch", "serves 1 to 4"),
        ("dtype", "takes torch.bfloat16"),
    ],
)
def test_a_call_the_graph_does_not_serve_is_an_execution_error_naming_it(change, words):
    table = torch.zeros(2, 8, dtype=torch.int32)
    pool = torch.zeros(32, 16, 2, 64, dtype=torch.bfloat16)
    q = torch.zeros(2, 8, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    used = torch.tensor([1, 1], dtype=torch.int32)
    if change == "width":
        table = torch.zeros(2, 9, dtype=torch.int32)
    elif change == "pool":
        pool = torch.zeros(64, 16, 2, 64, dtype=torch.bfloat16)
    elif change == "batch":
        cu, used = torch.arange(6, dtype=torch.int32), torch.ones(5, dtype=torch.int32)
        table = torch.zeros(5, 8, dtype=torch.int32)
    else:
        q = q.half()
    with pytest.raises(ExecutionError, match=words):
        check_call(PAGED, q, pool, pool, cu, None, used, table)


def test_execute_on_a_thd_graph_says_to_use_run_varlen():
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph

    q = torch.zeros(4, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ExecutionError, match="run_varlen"):
        TorchSdpaGraph(RAGGED).execute(q, q, q)
