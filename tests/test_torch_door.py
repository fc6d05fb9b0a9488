"""graphcache.torch.install(): graphcache's kernels at PyTorch's own door,
``aten::_scaled_dot_product_cudnn_attention`` and its backward (issue 42,
items 1 and 4), on this CPU: ``dispatch_key="CPU"``, where only direct
callers of the op reach it (torch's SDPA never picks cuDNN on a CPU), with
the reference compiler's graphs.

Checked against truths graphcache did not write: torch's own meta kernel for
the op (the outputs' shapes, dtypes and strides torch.compile's fake tensors
have), torch's math SDPA and its autograd (outputs, logsumexp, gradients),
torch.compile (aot_eager: inductor compiles C++ for minutes here).
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")

import torch.nn.functional as F  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, Target  # noqa: E402
from graphcache.ops import deploy  # noqa: E402
from graphcache.ops import manifest as manifests  # noqa: E402
from graphcache.reference.measure import TOLERANCE, lse_difference, relative_error  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from graphcache.torch import aten  # noqa: E402
from graphcache.torch.core import doors  # noqa: E402
from tests.docs_examples import example  # noqa: E402
from tests.test_docs_examples import last_dict, run  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

OP = torch.ops.aten._scaled_dot_product_cudnn_attention
BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def fresh():
    gt.reset()
    yield
    gt.uninstall()
    gt.reset()


def bshd(b: int, h: int, s: int, d: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    """A (b, h, s, d) view of a contiguous (b, s, h, d) tensor, as models make them."""
    return torch.randn(b, s, h, d, dtype=dtype).transpose(1, 2)


def math_reference(q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """torch's math SDPA in float32, and the logsumexp of its scaled, masked scores."""
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=True)
    kk = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q.float() @ kk.transpose(-2, -1)) / q.shape[-1] ** 0.5
    if causal:
        allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    return out, scores.logsumexp(-1, keepdim=True)


class XDiTAttention(torch.nn.Module):
    """An xDiT-style attention: separate projections, (b, h, s, d) views of
    them, and the cuDNN op called directly (xfuser's attention_backend does
    so; diffusers' _native_cudnn too), as on a GPU whichever backend torch would pick."""

    def __init__(self) -> None:
        super().__init__()
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(256, 256, dtype=BF16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, 4, 64).transpose(1, 2) for p in (self.to_q, self.to_k, self.to_v))
        out = OP(q, k, v, None, False, 0.0, False, False)[0]
        return out.transpose(1, 2).reshape(b, s, 256)


def direct_calls() -> list[tuple[tuple[torch.Tensor, ...], bool, bool]]:
    """(q, k, v), is_causal, compute_log_sumexp: causal and not, GQA, with and without logsumexp."""
    torch.manual_seed(0)
    mha = (bshd(1, 8, 128, 64), bshd(1, 8, 128, 64), bshd(1, 8, 128, 64))
    gqa = (bshd(2, 8, 96, 64), bshd(2, 2, 96, 64), bshd(2, 2, 96, 64))
    return [(mha, True, False), (mha, False, True), (gqa, True, True), (gqa, False, False)]


def run_all(model: XDiTAttention, rounds: int = 5) -> list[tuple]:
    results = []
    with torch.no_grad():
        for _ in range(rounds):
            for (q, k, v), causal, lse in direct_calls():
                results.append(((q, k, v), causal, lse, OP(q, k, v, None, lse, 0.0, causal, False)))
            for seq in (100, 200):  # two sequence lengths: two pow2 classes
                model(torch.randn(1, seq, 256, dtype=BF16))
    return results


# -- install --------------------------------------------------------------------------


def test_install_counts_uninstalls_exactly_and_works_as_a_context_manager():
    q = bshd(1, 2, 16, 64)
    with pytest.raises(NotImplementedError):  # torch 2.13 has no CPU kernel for the op
        OP(q, q, q, None, False)
    first = gt.install(dispatch_key="CPU")
    second = gt.install(dispatch_key="CPU")  # harmless: counted, nothing registered twice
    assert gt.kernels() == {"CPU": "graphcache"}
    OP(q, q, q, None, False)
    second.uninstall()
    second.uninstall()  # a handle gives back once
    OP(q, q, q, None, False)
    first.uninstall()
    with pytest.raises(NotImplementedError):  # exactly what was there before
        OP(q, q, q, None, False)
    with gt.install(dispatch_key="CPU") as handle:
        assert handle.active and gt.kernels() == {"CPU": "graphcache"}
    assert gt.kernels() == {} and not handle.active
    gt.install(dispatch_key="CPU")
    gt.install(dispatch_key="CPU")
    gt.uninstall()  # every installation, whatever handles are held
    assert gt.kernels() == {}
    with pytest.raises(ValueError, match="'CUDA' or 'CPU'"):
        gt.install(dispatch_key="XLA")


@pytest.mark.parametrize("layout", [bshd, lambda b, h, s, d: torch.randn(b, h, s, d, dtype=BF16)])
@pytest.mark.parametrize("lse", [False, True])
def test_the_nine_outputs_are_the_meta_kernels(layout, lse, tmp_path):
    gt.configure(GraphCache(DiskStore(tmp_path), "reference"), device="cpu", on_miss="build")
    gt.install(dispatch_key="CPU")
    shapes = [((1, 8, 16, 64), (1, 2, 32, 64), (1, 2, 32, 64)), ((2, 4, 1, 64), (2, 4, 40, 64), (2, 4, 40, 128))]
    for sq, sk, sv in shapes:
        q, k, v = layout(*sq), layout(*sk), layout(*sv)
        got = OP(q, k, v, None, lse, 0.0, True, False)
        metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (q, k, v)]
        want = OP(*metas, None, lse, 0.0, True, False)
        assert len(got) == len(want) == 9
        for mine, theirs in zip(got, want, strict=True):
            if isinstance(theirs, torch.Tensor):
                assert (mine.shape, mine.dtype, mine.stride()) == (theirs.shape, theirs.dtype, theirs.stride())
            else:
                assert mine == theirs  # None for cum_seq_q/k and the debug mask; s_q and s_kv
        torch.library.opcheck(OP.default, (q, k, v, None, lse, 0.0, True, False), test_utils=("test_faketensor",))
    aten_door = gt.stats()["doors"]["aten"]  # opcheck's calls are counted too; built on the spot, no hit
    assert (aten_door["hits"], aten_door["built_here"]) == (0, 2 * len(shapes))


# -- the Done-when: served from a recording made at this door ----------------------------


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A reference store warmed from a manifest recorded at the aten door, as
    a training step records it (``backward=True``: each call's backward graph too)."""
    root = tmp_path_factory.mktemp("door")
    gt.reset()
    model = XDiTAttention().eval()
    with gt.install(dispatch_key="CPU"), gt.record(root / "m.yaml", shape_classes="pow2", backward=True) as recorder:
        run_all(model, rounds=1)
    assert recorder.calls() == 6 and not recorder.ineligible and len(recorder.backwards) == 6
    store = DiskStore(root / "store")
    rows = deploy.warm(manifests.load(root / "m.yaml"), GraphCache(store, "reference"))
    assert {r.status for r in rows} == {"built"}
    gt.reset()
    return store, model


def test_direct_calls_and_an_xdit_module_are_served_from_the_recording(warmed):
    store, model = warmed
    gt.configure(GraphCache(store, "reference"), device="cpu")  # on a miss: torch (GRAPHCACHE_SDPA_ON_MISS)
    with gt.install(dispatch_key="CPU"):
        results = run_all(model)
    stats = gt.stats()
    assert stats["calls"] == stats["doors"]["aten"]["calls"] == 30
    assert stats["hits"] / stats["calls"] >= 0.95, stats
    for (q, k, v), causal, lse, got in results:
        out, ref_lse = math_reference(q, k, v, causal)
        assert relative_error(got[0], out) <= TOLERANCE["bfloat16"]
        if lse:
            assert lse_difference(got[1], ref_lse) <= 1e-3


def test_autograd_reaches_the_backward_kernel_and_matches_the_math_gradients(warmed):
    store, _ = warmed
    gt.configure(GraphCache(store, "reference"), device="cpu")
    (q, k, v), causal, _ = direct_calls()[2]  # GQA, causal
    mine = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    grad = torch.randn(q.shape, dtype=BF16)
    with gt.install(dispatch_key="CPU"):
        # compute_log_sumexp=False, but the inputs need grad: the door serves the stats graph all the same
        # (warmed: this GQA causal shape was recorded with logsumexp only), whose logsumexp the backward reads.
        out, lse = OP(*mine, None, False, 0.0, causal, False)[:2]
        out.backward(grad)
    F.scaled_dot_product_attention(*theirs, is_causal=causal, enable_gqa=True).backward(grad.float())
    doors_seen = gt.stats()["doors"]
    assert doors_seen["aten"]["hits"] == 1  # the forward was served, with stats
    assert lse_difference(lse, math_reference(q, k, v, causal)[1]) <= 1e-3
    assert doors_seen["aten_backward"]["hits"] == 1  # graphcache's backward kernel, served by a backward graph
    for a, b in zip(mine, theirs, strict=True):
        assert a.grad.stride() == a.stride()  # empty_like's strides, as the meta kernel gives
        assert relative_error(a.grad, b.grad) <= TOLERANCE["bfloat16"]


def test_the_same_calls_inside_torch_compile_are_served(warmed):
    store, model = warmed
    gt.configure(GraphCache(store, "reference"), device="cpu")
    torch._dynamo.reset()
    x = torch.randn(1, 200, 256, dtype=BF16)
    with gt.install(dispatch_key="CPU"), torch.no_grad():
        want = model(x)
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want)
    assert gt.stats()["doors"]["aten"] == {"calls": 2, "hits": 2, "built_here": 0, "relayed": 0, "fallbacks": {}}


def test_eight_threads_calling_one_shape_load_one_graph(warmed):
    store, _ = warmed
    cache = GraphCache(store, "reference")
    gt.configure(cache, device="cpu")
    (q, k, v), causal, lse = direct_calls()[0]
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(5):
                OP(q, k, v, None, lse, 0.0, causal, False)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with gt.install(dispatch_key="CPU"):
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    stats = gt.stats()
    assert (stats["hits"], stats["graphs_loaded"]) == (40, 1)
    assert cache.stats()["hits"] == 1 and cache.stats()["builds"] == 0  # one store read for the eight threads


# -- what goes to torch ---------------------------------------------------------------------


def test_what_the_door_does_not_serve_runs_torchs_math_under_a_named_reason(tmp_path):
    gt.configure(GraphCache(DiskStore(tmp_path), "reference"), device="cpu")  # nothing stored: a miss
    q, k, v = bshd(1, 4, 32, 64), bshd(1, 4, 32, 64), bshd(1, 4, 32, 64)
    bias = torch.randn(1, 1, 32, 32, dtype=BF16)
    with gt.install(dispatch_key="CPU"):
        missed = OP(q, k, v, None, True, 0.0, True, False)
        biased = OP(q, k, v, bias, False, 0.0, False, False)
        OP(q, k, v, None, False, 0.0, False, True)  # return_debug_mask
        OP(q.float(), k.float(), v.float(), None, False, 0.0, False, False)
        with pytest.raises(NotImplementedError, match="dropout_p > 0 on a CPU"):
            OP(q, k, v, None, False, 0.1, False, False)
    fallbacks = gt.stats()["doors"]["aten"]["fallbacks"]
    assert fallbacks == {"miss": 1, "attn_bias": 1, "debug_mask": 1, "dtype": 1}  # a call that raised is not counted
    out, lse = math_reference(q, k, v, True)
    assert relative_error(missed[0], out) <= TOLERANCE["bfloat16"] and lse_difference(missed[1], lse) <= 1e-3
    with_bias = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=bias.float())
    assert relative_error(biased[0], with_bias) <= TOLERANCE["bfloat16"]


def test_a_known_bad_window_is_a_named_fallback_at_this_door(tmp_path):
    b200 = Target.parse("b200-sm100-cudnn9.20.0-fe1.32.0")
    compiler = CpuGraphCompiler(b200)
    gt.configure(GraphCache(DiskStore(tmp_path), compiler), device="cpu", on_miss="build")
    decode = (bshd(1, 8, 1, 64), bshd(1, 2, 300, 64), bshd(1, 2, 300, 64))
    prefill = (bshd(1, 8, 64, 64), bshd(1, 2, 64, 64), bshd(1, 2, 64, 64))
    with gt.install(dispatch_key="CPU"):
        OP(*decode, None, False, 0.0, False, False)
        OP(*prefill, None, False, 0.0, True, False)
    assert gt.stats()["doors"]["aten"]["fallbacks"] == {"known_bad": 1}
    assert gt.stats()["doors"]["aten"]["built_here"] == 1 and compiler.builds == 1  # the decode was never built


def test_a_backward_miss_under_on_miss_error_raises_as_a_forward_miss_does(tmp_path):
    from graphcache.errors import NotFound

    cache = GraphCache(DiskStore(tmp_path), "reference")
    q, k, v = (bshd(1, 4, 64, 64).requires_grad_() for _ in range(3))
    with gt.install(dispatch_key="CPU"):
        gt.configure(cache, device="cpu", on_miss="build")
        OP(q, k, v, None, True, 0.0, True, False)  # the forward (stats) graph is built; no backward asked
        gt.configure(cache, device="cpu", on_miss="error")
        out = OP(q, k, v, None, True, 0.0, True, False)[0]  # a hit
        with pytest.raises(NotFound, match="backward"):
            out.sum().backward()


# -- CUDA graph capture (item 4) --------------------------------------------------------------


def test_under_capture_a_miss_builds_nothing_and_runs_torch(tmp_path, monkeypatch):
    cache = GraphCache(DiskStore(tmp_path), "reference")
    gt.configure(cache, device="cpu", on_miss="build")
    served = (bshd(1, 4, 64, 64), bshd(1, 4, 64, 64), bshd(1, 4, 64, 64))
    cold = (bshd(1, 2, 32, 64), bshd(1, 2, 32, 64), bshd(1, 2, 32, 64))  # another graph
    with gt.install(dispatch_key="CPU"):
        OP(*served, None, False, 0.0, True, False)  # planned (and built) before the capture
        # Stand-ins for torch's capture query (torch.cuda.is_current_stream_capturing): this CPU
        # build of torch has no CUDA, so no stream can capture; these say one does.
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        assert doors.capturing()
        OP(*served, None, False, 0.0, True, False)  # a memo hit: the loaded graph runs
        OP(*cold, None, False, 0.0, True, False)  # a miss: torch's kernel, nothing built or read
        builds = cache.stats()["builds"]
        monkeypatch.undo()
        OP(*cold, None, False, 0.0, True, False)  # after the capture: planned (built) now, not remembered as torch's
    assert builds == 1 and cache.stats()["builds"] == 2
    aten_door = gt.stats()["doors"]["aten"]
    assert aten_door["fallbacks"] == {"capture": 1} and aten_door["built_here"] == 3 and aten_door["hits"] == 0


@pytest.mark.gpu
def test_a_real_cuda_graph_capture_serves_a_warmed_shape_and_runs_torch_for_a_cold_one(tmp_path):
    """Ran on an H200 (2026-12-04) and failed with ``execute_failed: 2``: the
    reference compiler's graph called torch's cuDNN kernel, which install()
    serves, and came back here; fixed (``torch_sdpa.not_cudnn``), not yet
    rerun on a GPU."""
    gt.configure(GraphCache(DiskStore(tmp_path), "reference"), device="cuda", on_miss="build")
    q = torch.randn(1, 64, 8, 64, dtype=BF16, device="cuda").transpose(1, 2)
    cold = torch.randn(1, 48, 8, 64, dtype=BF16, device="cuda").transpose(1, 2)
    with gt.install(dispatch_key="CUDA"):
        want = OP(q, q, q, None, False, 0.0, True, False)[0].clone()  # planned, built and loaded eagerly
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            got = OP(q, q, q, None, False, 0.0, True, False)[0]
            OP(cold, cold, cold, None, False, 0.0, True, False)
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(got, want)
    assert gt.stats()["doors"]["aten"]["fallbacks"] == {"capture": 1}


# -- the sdpa door hands its fallbacks to this one, counted once --------------------------------


def test_a_call_the_sdpa_door_gives_torch_is_decided_and_counted_once_at_the_aten_door(warmed, monkeypatch):
    store, _ = warmed
    gt.configure(GraphCache(store, "reference"), device="cpu")
    (q, k, v), causal, lse = direct_calls()[1]
    assert lse  # a call that needs grad asks for logsumexp: its stats graph was warmed

    def cudnn_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):  # noqa: ANN001
        # Stands in for torch's SDPA dispatcher picking cuDNN (sdp_utils.cpp check_prefer_cudnn_attention,
        # H100 / H200 / B200): it calls the aten op, as torch 2.13 does there.
        need = torch.is_grad_enabled() and query.requires_grad
        return OP(query, key, value, attn_mask, need, dropout_p, is_causal, False, scale=scale)[0]

    monkeypatch.setattr(doors, "TORCH_SDPA", cudnn_sdpa)
    grads = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with gt.install(dispatch_key="CPU"), gt.patch():
        F.scaled_dot_product_attention(*grads, is_causal=causal).sum().backward()  # sdpa door: autograd
    stats = gt.stats()
    assert stats["calls"] == 1 and stats["hits"] == 1 and stats["fallbacks"] == {}
    assert stats["doors"]["sdpa"] == {"calls": 1, "hits": 0, "built_here": 0, "relayed": 1, "fallbacks": {}}
    assert stats["doors"]["aten"]["hits"] == 1 and stats["doors"]["aten_backward"]["hits"] == 1


def test_the_math_fallback_is_torchs_math():
    q, k, v = bshd(2, 8, 40, 64), bshd(2, 2, 56, 64), bshd(2, 2, 56, 64)
    grad = torch.randn(2, 8, 40, 64, dtype=BF16)
    out, lse = aten.aten_math.forward(q, k, v, None, 0.0, True, 0.2)
    refs = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*refs, is_causal=True, scale=0.2, enable_gqa=True)
    want.backward(grad.float())
    assert relative_error(out, want) <= TOLERANCE["bfloat16"]
    for mine, ref in zip(aten.aten_math.backward(grad, q, k, v, None, 0.0, True, 0.2), refs, strict=True):
        assert relative_error(mine, ref.grad) <= TOLERANCE["bfloat16"]


def test_the_two_doors_page_example_serves_its_call_at_the_aten_door(tmp_path):
    doors_seen = last_dict(run(example("two-doors"), tmp_path).stdout)
    # An empty store: the graph was built on the spot, so the call is built_here, not a hit.
    assert doors_seen == {"aten": {"calls": 1, "hits": 0, "built_here": 1, "relayed": 0, "fallbacks": {}}}
