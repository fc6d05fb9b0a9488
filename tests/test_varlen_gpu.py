"""graphcache.torch.varlen_attn on a real GPU: each path (ragged prefill,
paged decode, ragged q over a paged cache) built by cuDNN, stored, loaded and
run, against torch's own varlen_attn (flash-attention) on the same tensors,
called the way the installed torch takes it (graphcache.torch.varlen_torch:
torch 2.11's op takes 10 arguments and no paged KV; the paged comparisons
skip there, saying so).

Skipped, with the reason, where there is no CUDA GPU with cuDNN (this
repository's CI has none). An H200 with torch 2.11 ran the ragged and paged
cases on 2026-12-04 against the 14-argument call, which 2.11 refused.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="needs torch with CUDA")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache  # noqa: E402
from graphcache.compilers.torch_sdpa import TOLERANCE, relative_error  # noqa: E402
from graphcache.compilers.varlen_ref import defined_rows  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from graphcache.torch.varlen import TORCH_VARLEN  # noqa: E402

if TORCH_VARLEN.op is None:  # the calls below take torch's AuxRequest and compare with its kernel
    pytest.skip(TORCH_VARLEN.why_none, allow_module_level=True)


@pytest.fixture
def cached(tmp_path):
    from graphcache.compilers.cudnn import CudnnCompiler

    gt.reset()
    gt.configure(GraphCache(DiskStore(tmp_path / "store"), CudnnCompiler()), on_miss="build")
    yield
    gt.reset()


def needs_torchs(used=None, table=None) -> None:  # noqa: ANN001
    why = TORCH_VARLEN.lacks(used, table)
    if why:
        pytest.skip(f"no kernel of torch's to compare with: {why}")


def torchs(q, k, v, cu_q, cu_k, max_q, max_k, window, used=None, table=None):  # noqa: ANN001
    """torch's own kernel on the call (GQA: enable_gqa where the op has it)."""
    needs_torchs(used, table)
    return TORCH_VARLEN(q, k, v, cu_q, cu_k, max_q, max_k, window_size=window, enable_gqa=True, seqused_k=used,
                        block_table=table)  # fmt: skip


def compare(got, want, cu_q, cu_k, window, used, dtype):  # noqa: ANN001
    (out, lse), (ref, ref_lse) = got, want
    rows = defined_rows(cu_q.cpu(), None if cu_k is None else cu_k.cpu(), window, None if used is None else used.cpu(),
                        out.shape[0]).to(out.device)  # fmt: skip
    assert relative_error(out[rows], ref[rows]) <= TOLERANCE[dtype]
    assert (lse[:, rows] - ref_lse[:, rows]).abs().max() <= 1e-2


def lengths(values):  # noqa: ANN001
    return torch.tensor([0, *torch.tensor(values).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (64, 0)])
def test_ragged_prefill_matches_torchs_varlen_attn(cached, dtype, window):
    from torch.nn.attention.varlen import AuxRequest

    dt = getattr(torch, dtype)
    lens_q, lens_k = [100, 1, 37, 0, 129], [100, 70, 37, 5, 200]
    q = torch.randn(sum(lens_q), 32, 128, device="cuda", dtype=dt)
    k = torch.randn(sum(lens_k), 8, 128, device="cuda", dtype=dt)
    v = torch.randn(sum(lens_k), 8, 128, device="cuda", dtype=dt)
    cu_q, cu_k = lengths(lens_q), lengths(lens_k)
    got = gt.varlen_attn(q, k, v, cu_q, cu_k, 129, 200, window_size=window, enable_gqa=True,
                         return_aux=AuxRequest(lse=True))  # fmt: skip
    compare(got, torchs(q, k, v, cu_q, cu_k, 129, 200, window), cu_q, cu_k, window, None, dtype)
    assert gt.stats()["built_here"] == 1


@pytest.mark.parametrize("max_q", [1, 16])  # decode, and chunked prefill over the pages
def test_paged_matches_torchs_varlen_attn(cached, max_q):
    from torch.nn.attention.varlen import AuxRequest

    needs_torchs(used=1, table=1)  # before any build: torch 2.11's op takes no paged KV
    # 256-token pages: torch's flash-attention 2 takes paged KV only in multiples of 256
    page, pages, width = 256, 64, 2
    lens_q = [max_q, 1, max_q, 0] if max_q > 1 else [1, 1, 1, 1]
    used = torch.tensor([300, 17, 1, 0], dtype=torch.int32, device="cuda")
    pool_k = torch.randn(pages, page, 8, 128, device="cuda", dtype=torch.bfloat16)
    pool_v = torch.randn(pages, page, 8, 128, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(pages, device="cuda")[: 4 * width].view(4, width).to(torch.int32).contiguous()
    q = torch.randn(sum(lens_q), 32, 128, device="cuda", dtype=torch.bfloat16)
    cu_q = lengths(lens_q)
    got = gt.varlen_attn(q, pool_k, pool_v, cu_q, None, max_q, 300, window_size=(-1, 0), enable_gqa=True,
                         seqused_k=used, block_table=table, return_aux=AuxRequest(lse=True))  # fmt: skip
    want = torchs(q, pool_k, pool_v, cu_q, None, max_q, 300, (-1, 0), used, table)
    compare(got, want, cu_q, None, (-1, 0), used, "bfloat16")


def test_a_paged_call_no_graph_serves_runs_torchs_kernel_or_the_reference_with_the_same_answer(cached):
    """A left-only window has no cuDNN graph: torch's kernel runs it where
    its op takes paged KV (torch 2.13), graphcache's float32 reference where
    it does not (2.11, warned once); either way the answer is the reference's."""
    from graphcache.reference.varlen import varlen_reference

    page, pages, width = 256, 8, 2
    used = torch.tensor([300, 17], dtype=torch.int32, device="cuda")
    pool_k = torch.randn(pages, page, 2, 64, device="cuda", dtype=torch.bfloat16)
    pool_v = torch.randn(pages, page, 2, 64, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(pages, device="cuda")[: 2 * width].view(2, width).to(torch.int32).contiguous()
    q = torch.randn(2, 8, 64, device="cuda", dtype=torch.bfloat16)
    cu_q = lengths([1, 1])
    got = gt.varlen_attn(q, pool_k, pool_v, cu_q, None, 1, 300, window_size=(64, -1), enable_gqa=True,
                         seqused_k=used, block_table=table)  # fmt: skip
    want, _ = varlen_reference(q, pool_k, pool_v, cu_q, None, scale=64**-0.5, window=(64, -1), seqused_k=used,
                               block_table=table)  # fmt: skip
    print(f"torch {torch.__version__}: {TORCH_VARLEN.lacks(used, table) or 'torch_attn::_varlen_attn ran it'}")
    assert relative_error(got, want) <= TOLERANCE["bfloat16"]
    assert gt.stats()["fallbacks"] == {"window": 1}


def test_a_hit_never_synchronises_with_the_gpu(cached):
    lens = [5, 9, 1]
    q = torch.randn(sum(lens), 8, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16)
    cu = lengths(lens)
    gt.varlen_attn(q, kv, kv, cu, cu, 9, 9, window_size=(-1, 0), enable_gqa=True)  # builds, loads
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gt.varlen_attn(q, kv, kv, cu, cu, 9, 9, window_size=(-1, 0), enable_gqa=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert gt.stats()["built_here"] == 2


def test_continuous_batching_on_cached_cudnn_graphs_matches_per_sequence_float32(cached):
    from tests.test_varlen_dropin import continuous_batching
    from tests.varlen_engine import Engine

    engine = Engine(gt.varlen_attn, device="cuda", lse=True)  # 16-token pages: cuDNN takes them
    continuous_batching(engine, steps=30, seed=1)
    stats = gt.stats()
    assert stats["built_here"] == engine.calls and stats["fallbacks"] == {}
    assert engine.worst <= TOLERANCE["bfloat16"]
