"""graphcache.torch.patch(): routing torch's SDPA (and nn.MultiheadAttention's
fused fast path) through graphcache, restoring exactly, and torch.compile."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")

import torch.nn.functional as F  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

ORIGINAL = F.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def fresh_runtime():
    gt.reset()
    yield
    gt.reset()
    assert F.scaled_dot_product_attention is ORIGINAL and not gt.enabled()


def test_patch_routes_restores_exactly_and_nests():
    fastpath = torch.backends.mha.get_fastpath_enabled()
    with gt.patch():
        assert F.scaled_dot_product_attention is gt.scaled_dot_product_attention
        assert torch.backends.mha.get_fastpath_enabled() is False
        with gt.patch():
            assert F.scaled_dot_product_attention is gt.scaled_dot_product_attention
        assert F.scaled_dot_product_attention is gt.scaled_dot_product_attention  # inner exit keeps the outer
    assert F.scaled_dot_product_attention is ORIGINAL
    assert torch.backends.mha.get_fastpath_enabled() is fastpath


def test_patch_restores_whatever_was_there_and_the_fast_path_setting():
    def someone_elses(*args, **kwargs):  # noqa: ANN002, ANN003
        return ORIGINAL(*args, **kwargs)

    F.scaled_dot_product_attention = someone_elses
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with gt.patch():
            assert F.scaled_dot_product_attention is gt.scaled_dot_product_attention
        assert F.scaled_dot_product_attention is someone_elses
        assert torch.backends.mha.get_fastpath_enabled() is False
    finally:
        F.scaled_dot_product_attention = ORIGINAL
        torch.backends.mha.set_fastpath_enabled(True)


def test_patch_restores_on_an_exception():
    with pytest.raises(KeyError), gt.patch():
        raise KeyError("boom")
    assert F.scaled_dot_product_attention is ORIGINAL and torch.backends.mha.get_fastpath_enabled()


def test_enable_disable_count_and_extra_disable_is_harmless():
    gt.enable()
    gt.enable()
    gt.disable()
    assert F.scaled_dot_product_attention is gt.scaled_dot_product_attention
    gt.disable()
    gt.disable()
    assert F.scaled_dot_product_attention is ORIGINAL


def test_patch_from_many_threads_ends_restored():
    q = torch.randn(1, 4, 8, 64)
    want = ORIGINAL(q, q, q)
    barrier = threading.Barrier(8)
    errors = []

    def worker():
        barrier.wait()
        try:
            for _ in range(100):
                with gt.patch():
                    torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q), want)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert F.scaled_dot_product_attention is ORIGINAL and torch.backends.mha.get_fastpath_enabled()


# -- nn.MultiheadAttention and nn.TransformerEncoderLayer in inference --------------------


def models():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(256, 4, batch_first=True).eval()
    tel = torch.nn.TransformerEncoderLayer(256, 4, 512, batch_first=True).eval()
    return mha, tel


def test_fused_inference_fast_paths_reach_graphcache_and_agree_with_torch():
    mha, tel = models()
    x = torch.randn(1, 16, 256)
    with torch.no_grad():
        want_mha = mha(x, x, x, need_weights=False)[0]  # torch's fused fast path
        want_tel = tel(x)
        with gt.patch():
            got_mha = mha(x, x, x, need_weights=False)[0]
            got_tel = tel(x)
    torch.testing.assert_close(got_mha, want_mha)
    torch.testing.assert_close(got_tel, want_tel)
    assert gt.stats()["calls"] == 2
    assert torch.backends.mha.get_fastpath_enabled()


def test_multihead_attention_hits_a_cached_graph(tmp_path):
    mha, tel = models()
    mha, tel = mha.to(torch.bfloat16), tel.to(torch.bfloat16)
    compiler = CpuGraphCompiler()
    gt.configure(GraphCache(DiskStore(tmp_path / "store"), compiler), device="cpu", on_miss="build")
    x = torch.randn(1, 16, 256, dtype=torch.bfloat16)
    with torch.no_grad():
        want = (mha(x, x, x, need_weights=False)[0], tel(x))
        with gt.patch():
            got = (mha(x, x, x, need_weights=False)[0], tel(x))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-2, rtol=2e-2)
    s = gt.stats()
    assert (s["built_here"], s["graphs_loaded"]) == (2, 1) and compiler.executions == 2


# -- torch.compile ---------------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(256, 768)

    def forward(self, x):  # noqa: ANN001
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 64).unbind(2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2).reshape(b, s, 256)


def test_torch_compile_fullgraph_traces_the_custom_op_without_a_break():
    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):  # noqa: ANN001
        graphs.append(gm)
        return gm.forward

    model = Block().eval()
    x = torch.randn(2, 16, 256)
    with torch.no_grad():
        want = model(x)
        with gt.patch():
            compiled = torch.compile(model, fullgraph=True, backend=capture)
            got = compiled(x)
    torch.testing.assert_close(got, want)
    assert len(graphs) == 1
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert torch.ops.graphcache.sdpa.default in targets or torch.ops.graphcache.sdpa in targets
    assert gt.stats()["calls"] == 1  # the compiled graph ran the op, which ran the drop-in
    torch._dynamo.reset()


def test_torch_compile_through_aot_autograd_runs_the_op():
    # aot_eager traces the op with its fake impl and functionalizes the graph,
    # as inductor does; inductor itself compiles C++ for about 40 s on this
    # CPU, so it is run by hand, not in CI.
    torch._dynamo.reset()
    model = Block().eval()
    x = torch.randn(2, 16, 256)
    with torch.no_grad():
        want = model(x)
        with gt.patch():
            got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(got, want)
    assert gt.stats()["calls"] == 1
    torch._dynamo.reset()


def test_custom_op_fake_and_real_agree():
    q = torch.randn(1, 8, 16, 64, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 32, 64, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 32, 128, dtype=torch.bfloat16)
    torch.library.opcheck(
        torch.ops.graphcache.sdpa.default,
        (q, k, v, None, 0.0, True, None, True),
        test_utils=("test_schema", "test_faketensor"),
    )
