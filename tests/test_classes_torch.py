"""Class graphs with torch on the CPU: TorchSdpaGraph serves every shape of
its class with the exact graph's output, and refuses shapes outside it
(issue 18, item 5)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.torch
try:
    import torch
except ImportError:  # the torch marker skips every test here (tests/conftest.py)
    torch = None

from graphcache import ExecutionError, GraphSpec  # noqa: E402
from graphcache.compilers.classgraph import bind  # noqa: E402
from graphcache.compilers.torch_sdpa import TorchSdpaGraph, random_inputs  # noqa: E402
from graphcache.spec.classes import class_of  # noqa: E402


def exact(**fields) -> GraphSpec:  # noqa: ANN003
    base = dict(batch=3, heads_q=4, heads_kv=2, seq_q=37, seq_kv=37, head_dim=16, dtype="bfloat16", mask="causal")
    return GraphSpec(**{**base, **fields})


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"layout": "bhsd"},
        {"seq_q": 1, "seq_kv": 200, "mask": "none"},
        {"seq_q": 5, "seq_kv": 150, "mask": "causal_bottom_right"},
        {"mask": "sliding_window", "window_left": 4},
        {"padding": True, "generate_stats": True},
    ],
    ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()) or "causal",
)
def test_a_class_graph_gives_the_exact_graphs_output_at_a_real_shape(fields):
    spec = exact(**fields)
    klass = class_of(spec, "pow2")
    assert klass != spec
    inputs = random_inputs(spec, "cpu", seed=3)
    want = TorchSdpaGraph(spec).execute(**inputs)
    got = TorchSdpaGraph(klass).execute(**inputs)
    bound = bind(TorchSdpaGraph(klass), spec).execute(**inputs)
    for result in (got, bound):
        if spec.generate_stats:
            assert torch.equal(result[0], want[0]) and torch.equal(result[1], want[1])
        else:
            assert result.shape == spec.storage_shape("o") and torch.equal(result, want)


def test_a_class_graph_serves_many_shapes_and_refuses_one_outside_it():
    klass = class_of(exact(batch=1, seq_q=1, seq_kv=100, mask="none"), "pow2")  # b1 q1 kv128
    graph = TorchSdpaGraph(klass)
    for skv in (1, 33, 127, 128):
        spec = exact(batch=1, seq_q=1, seq_kv=skv, mask="none")
        inputs = random_inputs(spec, "cpu", seed=skv)
        assert torch.equal(graph.execute(**inputs), TorchSdpaGraph(spec).execute(**inputs))
    too_long = random_inputs(exact(batch=1, seq_q=1, seq_kv=129, mask="none"), "cpu")
    with pytest.raises(ExecutionError, match=r"outside the class .*seq_kv <= 128"):
        graph.execute(**too_long)
    prefill = random_inputs(exact(batch=1, seq_q=2, seq_kv=100, mask="none"), "cpu")
    with pytest.raises(ExecutionError, match="seq_q == 1"):
        graph.execute(**prefill)
    other_heads = random_inputs(exact(batch=1, seq_q=1, seq_kv=100, mask="none", heads_kv=4), "cpu")
    with pytest.raises(ExecutionError, match=r"k has shape \(1, 100, 4, 16\).*needs \(1, 100, 2, 16\)"):
        graph.execute(**other_heads)
    with pytest.raises(ExecutionError, match="batch <= 1"):
        bind(graph, exact(batch=2, seq_q=1, seq_kv=100, mask="none"))


def test_the_drop_in_loads_a_class_graph_once_and_binds_it_to_each_new_call_shape(tmp_path):
    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.stores import DiskStore
    from tests.torch_standins import CpuGraphCompiler

    compiler = CpuGraphCompiler()
    cache = GraphCache(DiskStore(tmp_path), compiler, shape_classes="pow2")
    q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
    steps = [torch.randn(1, 2, n, 64, dtype=torch.bfloat16) for n in (38, 39, 40, 90, 128)]
    cache.get(class_of(gt.spec_for(q, steps[0], steps[0], enable_gqa=True), "pow2"))  # warmed, as warm does
    gt.reset()
    gt.configure(cache, device="cpu", on_miss="error")
    try:
        for k in steps:
            got = gt.scaled_dot_product_attention(q, k, k, enable_gqa=True)
            want = torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True)
            assert torch.equal(got, want)
        stats = gt.stats()
        assert (stats["hits"], stats["graphs_loaded"], stats["shapes_served"]) == (5, 1, 5)
        assert compiler.loads == 1, "a new decode length binds the loaded class graph: no store read, no load"
        assert compiler.executions == 5
    finally:
        gt.reset()


def test_the_memo_of_class_bound_call_shapes_is_bounded(tmp_path, monkeypatch):
    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.stores import DiskStore
    from graphcache.torch.core import memo
    from tests.torch_standins import CpuGraphCompiler

    monkeypatch.setattr(memo, "MEMO_LIMIT", 8)
    cache = GraphCache(DiskStore(tmp_path), CpuGraphCompiler(), shape_classes="pow2")
    gt.reset()
    gt.configure(cache, device="cpu", on_miss="build")
    q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
    try:
        for n in range(130, 160):  # 30 decode lengths, one class (kv256)
            k = torch.randn(1, 2, n, 64, dtype=torch.bfloat16)
            assert torch.equal(
                gt.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True),
            )
            assert len(gt.RUNTIME._memo) <= 8
        stats = gt.stats()
        assert stats["built_here"] == 30 and stats["graphs_loaded"] == 1 and stats["shapes_served"] == 30
    finally:
        gt.reset()


def test_the_memo_stays_bounded_when_the_class_is_not_stored_and_calls_fall_back(tmp_path, monkeypatch):
    # Every decode length is a call shape; one whose class was never warmed
    # (a miss, on_miss=torch) or that carries a tensor mask runs torch's SDPA,
    # and that plan is memoized per shape too: a server's lifetime of them must
    # not grow the memo past MEMO_LIMIT.
    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.stores import DiskStore
    from graphcache.torch.core import memo
    from tests.torch_standins import CpuGraphCompiler

    monkeypatch.setattr(memo, "MEMO_LIMIT", 8)
    gt.reset()
    gt.configure(GraphCache(DiskStore(tmp_path), CpuGraphCompiler(), shape_classes="pow2"), device="cpu")
    q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
    try:
        for n in range(130, 160):
            k = torch.randn(1, 2, n, 64, dtype=torch.bfloat16)
            mask = torch.ones(1, 1, 1, n, dtype=torch.bool)
            for attn_mask in (None, mask):
                assert torch.equal(
                    gt.scaled_dot_product_attention(q, k, k, attn_mask=attn_mask, enable_gqa=True),
                    torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=attn_mask, enable_gqa=True),
                )
                assert len(gt.RUNTIME._memo) <= 8
        stats = gt.stats()  # a masked call is a bias spec, whose class was never warmed either: a miss
        assert stats["calls"] == 60 and stats["hits"] == 0 and stats["misses"] == 60
    finally:
        gt.reset()


def test_a_class_whose_build_failed_is_not_rebuilt_for_every_new_call_shape(tmp_path):
    # A class build that fails (BuildError: cuDNN's output disagreed at the
    # canary shape, say) is no negative entry; the exact graphs serve instead,
    # and the next decode length must not pay for the class's build again.
    import graphcache.torch as gt
    from graphcache import BuildError, GraphCache
    from graphcache.stores import DiskStore
    from tests.torch_standins import CpuGraphCompiler

    class NoClassBuilds(CpuGraphCompiler):
        class_builds = 0

        def build(self, spec, target, uids=None):  # noqa: ANN001, ANN201
            if spec.is_class:
                self.class_builds += 1
                raise BuildError(f"stand-in: {spec.summary()} disagrees with the reference")
            return super().build(spec, target, uids)

    compiler = NoClassBuilds()
    gt.reset()
    gt.configure(GraphCache(DiskStore(tmp_path), compiler, shape_classes="pow2"), device="cpu", on_miss="build")
    q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
    try:
        for n in range(40, 45):
            k = torch.randn(1, 2, n, 64, dtype=torch.bfloat16)
            assert torch.equal(
                gt.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=True),
            )
        assert gt.stats()["built_here"] == 5, "the exact graphs served"
        assert compiler.class_builds == 1, "the failed class was tried once, not once per decode length"
    finally:
        gt.reset()
