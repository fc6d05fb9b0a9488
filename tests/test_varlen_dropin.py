"""graphcache.torch.varlen_attn on a CPU: ragged prefill, paged decode and
chunked prefill through cached graphs (executed by graphcache's reference,
tests/torch_standins.py), against an independent per-sequence float32
computation; patch() routing torch's varlen_attn; fallbacks by reason;
record -> warm -> a different request mix served from cached graphs."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch")

import torch.nn.attention.varlen as torch_varlen  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.clirun import cli  # noqa: E402
from tests.fakes import TARGET  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402
from tests.varlen_engine import Engine, oracle  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    monkeypatch.delenv("GRAPHCACHE_SDPA_ON_MISS", raising=False)
    monkeypatch.delenv("GRAPHCACHE_SHAPE_CLASSES", raising=False)
    gt.reset()
    yield
    gt.reset()
    assert not gt.enabled()


def configure(path, on_miss="build"):
    compiler = CpuGraphCompiler()
    cache = GraphCache(DiskStore(path), compiler)
    gt.configure(cache, device="cpu", on_miss=on_miss)
    return cache, compiler


def continuous_batching(engine: Engine, steps: int, seed: int, max_batch: int = 6) -> None:
    """Sequences join (prompts of 1..40 tokens), decode one token a step,
    sometimes send a chunk of prefill over their cache, and leave."""
    rng = random.Random(seed)
    live: dict[int, int] = {}  # id -> tokens it will still take
    next_id = 0
    for _ in range(steps):
        requests: dict[int, int] = {}
        for sid in list(live):
            if live[sid] <= 0:
                engine.leave(sid)
                del live[sid]
        while len(live) < max_batch and rng.random() < 0.4:
            requests[next_id] = rng.randint(1, 40)
            live[next_id] = rng.randint(2, 60)
            next_id += 1
        for sid in live:
            if sid in requests:
                continue
            n = rng.choice([1, 1, 1, 1, 5]) if rng.random() < 0.9 else 0  # most decode, some chunks, some idle
            if n and engine.seqs[sid]["len"] + n <= engine.width * engine.page:
                requests[sid] = n
                live[sid] -= n
            else:
                live[sid] = min(live[sid], 0)
        if requests:
            engine.step(requests)


def test_continuous_batching_through_cached_graphs_matches_per_sequence_float32(tmp_path):
    _, compiler = configure(tmp_path / "store")
    engine = Engine(gt.varlen_attn, seed=1, lse=True)
    continuous_batching(engine, steps=30, seed=1)
    stats = gt.stats()
    assert stats["calls"] == engine.calls and stats["built_here"] == engine.calls and stats["fallbacks"] == {}
    # a handful of graphs (batch and length classes; the pool and table fixed) for every call
    assert 2 <= stats["graphs_loaded"] <= 10 < engine.calls
    assert compiler.builds == stats["graphs_loaded"]


def test_prefill_over_ragged_kv_with_unequal_lengths_windows_and_zero_and_one_token_sequences(tmp_path):
    configure(tmp_path / "store")
    g = torch.Generator().manual_seed(5)
    lens_q, lens_k = [3, 1, 0, 7], [9, 1, 4, 7]
    q = torch.randn(sum(lens_q), 4, 32, generator=g).half()
    k = torch.randn(sum(lens_k), 2, 32, generator=g).half()
    v = torch.randn(sum(lens_k), 2, 32, generator=g).half()
    cq = torch.tensor([0, 3, 4, 4, 11], dtype=torch.int32)
    ck = torch.tensor([0, 9, 10, 14, 21], dtype=torch.int32)
    for window in [(-1, -1), (-1, 0), (2, 0), (3, 1), (-1, 2)]:
        out = gt.varlen_attn(q, k, v, cq, ck, 7, 9, window_size=window, enable_gqa=True, scale=0.4)
        for n in range(4):
            if not lens_q[n]:
                continue
            a, b, c, e = int(cq[n]), int(cq[n + 1]), int(ck[n]), int(ck[n + 1])
            want, _, rows = oracle(q[a:b], k[c:e], v[c:e], window, 0.4)
            torch.testing.assert_close(out[a:b].float()[rows], want[rows], atol=5e-3, rtol=5e-3)
    assert gt.stats()["built_here"] == 5


def test_patch_routes_torchs_varlen_attn_and_restores_it(tmp_path):
    configure(tmp_path / "store")
    original = torch_varlen.varlen_attn
    q = torch.randn(6, 2, 16).bfloat16()
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(NotImplementedError):
        original(q, q, q, cu, cu, 4, 4)  # torch has no CPU kernel for it
    with gt.patch():
        assert torch_varlen.varlen_attn is gt.varlen_attn
        out = torch_varlen.varlen_attn(q, q, q, cu, cu, 4, 4, window_size=(-1, 0))
    assert torch_varlen.varlen_attn is original
    assert out.shape == (6, 2, 16) and gt.stats()["built_here"] == 1


def test_calls_cudnn_cannot_serve_fall_back_counted_by_reason_with_the_same_results(tmp_path):
    configure(tmp_path / "store")
    g = torch.Generator().manual_seed(6)
    q = torch.randn(5, 4, 16, generator=g)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    want = gt.varlen_attn(q.bfloat16(), q.bfloat16(), q.bfloat16(), cu, cu, 3, 3, window_size=(-1, 0))
    split = gt.varlen_attn(q.bfloat16(), q.bfloat16(), q.bfloat16(), cu, cu, 3, 3, window_size=(-1, 0), num_splits=4)
    torch.testing.assert_close(split, want)
    gt.varlen_attn(q, q, q, cu, cu, 3, 3)  # float32
    odd = torch.randn(5, 4, 12, generator=g).half()
    gt.varlen_attn(odd, odd, odd, cu, cu, 3, 3)  # head dim 12
    grad = q.bfloat16().requires_grad_()
    gt.varlen_attn(grad, grad, grad, cu, cu, 3, 3)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        gt.varlen_attn(q, q[:, :2], q[:, :2], cu, cu, 3, 3)  # torch's own check, torch's own words
    stats = gt.stats()
    assert stats["built_here"] == 1
    assert stats["fallbacks"] == {"num_splits": 1, "dtype": 1, "head_dim": 1, "autograd": 1}


@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan")])
def test_a_scale_not_greater_than_0_is_refused_as_torch_2_15_refuses_it_on_every_torch(tmp_path, scale):
    cache, _ = configure(tmp_path / "store")
    q = torch.randn(5, 4, 16).bfloat16()
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"scale must be greater than 0, got .*pass a positive scale") as ours:
        gt.varlen_attn(q, q, q, cu, cu, 3, 3, scale=scale, window_size=(-1, 0))
    assert gt.stats()["built_here"] == 0 and gt.stats()["fallbacks"] == {}  # nothing built, run or counted
    assert list(cache.store.keys()) == []
    if hasattr(torch_varlen, "_validate_scale"):  # torch 2.15 and later: its own words lead ours
        with pytest.raises(ValueError) as theirs:
            torch_varlen.varlen_attn(q, q, q, cu, cu, 3, 3, scale=scale, window_size=(-1, 0))
        assert str(ours.value).startswith(str(theirs.value))
    out = gt.varlen_attn(q, q, q, cu, cu, 3, 3, scale=0.25, window_size=(-1, 0))  # a positive scale still serves
    assert out.shape == (5, 4, 16) and gt.stats()["built_here"] == 1 and list(cache.store.keys())


def test_a_call_outside_the_engines_table_is_not_served_by_a_wrong_graph(tmp_path):
    configure(tmp_path / "store")
    wide, narrow = Engine(gt.varlen_attn, pages_per_seq=8), Engine(gt.varlen_attn, pages_per_seq=4)
    wide.step({0: 5})
    wide.step({0: 1})
    narrow.step({0: 5})
    narrow.step({0: 1})  # same lengths, another table width: its own graph
    assert gt.stats()["graphs_loaded"] == 3  # one prefill class, two decode graphs (one per table width)


def test_recorded_manifest_warmed_serves_a_different_request_mix_from_cached_graphs(tmp_path):
    path = tmp_path / "engine.yaml"
    with gt.record(path) as recorder:
        continuous_batching(Engine(lambda *a, **k: torch_varlen.varlen_attn(*a, **k), check=False), 60, seed=10)
    assert recorder.ineligible == {}
    specs = manifest.load(path)
    assert specs and all(s.layout == "thd" for s in specs)
    assert {s.batch for s in specs} <= {1, 2, 4, 8} and {s.seq_q for s in specs} <= {1, 128}  # rounded: pow2
    store = ["--cache-dir", str(tmp_path / "store")]
    warm = cli("warm", str(path), "--compiler", "tests.torch_standins:CpuGraphCompiler", *store)
    assert warm.returncode == 0, warm.stderr
    check = cli("warm", str(path), "--check", "--target", str(TARGET), *store)
    assert check.returncode == 0, check.stdout + check.stderr
    gt.reset()
    configure(tmp_path / "store", on_miss="torch")
    engine = Engine(gt.varlen_attn, seed=20)
    continuous_batching(engine, 80, seed=20, max_batch=5)  # other prompts, joins and leaves
    stats = gt.stats()
    assert stats["calls"] == engine.calls > 50
    assert stats["hits"] >= 0.95 * stats["calls"], stats


def test_pages_cudnn_cannot_take_and_one_sided_windows_fall_back_with_flash_attentions_results(tmp_path):
    from tests.varlen_engine import oracle

    configure(tmp_path / "store")
    g = torch.Generator().manual_seed(7)
    pool = torch.randn(6, 24, 2, 16, generator=g).bfloat16()  # 24-token pages: not a power of two
    table = torch.tensor([[3, 1], [5, 0]], dtype=torch.int32)
    used = torch.tensor([30, 7], dtype=torch.int32)
    q = torch.randn(2, 4, 16, generator=g).bfloat16()
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    out = gt.varlen_attn(q, pool, pool, cu, None, 1, 30, window_size=(-1, 0), enable_gqa=True, seqused_k=used,
                         block_table=table)  # fmt: skip
    seq0 = torch.cat([pool[3], pool[1]])[:30]
    want, _, _ = oracle(q[:1], seq0, seq0, (-1, 0), 0.25)
    torch.testing.assert_close(out[:1].float(), want, atol=2e-2, rtol=2e-2)
    k = torch.randn(9, 2, 16, generator=g).bfloat16()
    cu_k = torch.tensor([0, 4, 9], dtype=torch.int32)
    q2 = torch.randn(9, 4, 16, generator=g).bfloat16()
    left_only = gt.varlen_attn(q2, k, k, cu_k, cu_k, 5, 5, window_size=(2, -1), enable_gqa=True)
    want, _, _ = oracle(q2[4:], k[4:], k[4:], (2, -1), 0.25)
    torch.testing.assert_close(left_only[4:].float(), want, atol=2e-2, rtol=2e-2)
    assert gt.stats()["fallbacks"] == {"page_size": 1, "window": 1} and gt.stats()["hits"] == 0


def test_the_memo_stays_bounded_as_prefill_lengths_keep_changing(tmp_path, monkeypatch):
    import graphcache.torch.varlen as varlen

    configure(tmp_path / "store")
    monkeypatch.setattr(varlen, "MEMO_LIMIT", 8)
    q = torch.randn(40, 2, 16).bfloat16()
    for n in range(1, 30):  # a new max_q (a new memo key) every call, all one graph
        cu = torch.tensor([0, n], dtype=torch.int32)
        gt.varlen_attn(q[:n], q[:n], q[:n], cu, cu, n, n, window_size=(-1, 0))
    assert len(gt.RUNTIME._memo) <= 8
    assert gt.stats()["built_here"] == 29 and gt.stats()["graphs_loaded"] == 2  # decode (n=1) and q128


def test_a_float32_cpu_run_records_the_bfloat16_specs_a_gpu_will_run(tmp_path):
    path = tmp_path / "engine.yaml"
    engine = Engine(lambda *a, **k: torch_varlen.varlen_attn(*a, **k), dtype=torch.float32)
    with gt.record(path, dtype="bfloat16") as recorder:
        continuous_batching(engine, 12, seed=3)
    assert recorder.ineligible == {} and recorder.calls() == engine.calls
    specs = manifest.load(path)
    assert specs and {s.dtype for s in specs} == {"bfloat16"} and all(s.layout == "thd" for s in specs)
    assert gt.stats()["fallbacks"] == {"dtype": engine.calls}  # float32 itself ran on the reference


def test_paged_decode_steps_share_a_memo_entry_as_the_longest_sequence_grows(tmp_path):
    configure(tmp_path / "store")
    engine = Engine(gt.varlen_attn, seed=4)
    engine.step({0: 5, 1: 9})  # prefill
    entries = None
    for _ in range(6):
        engine.step({0: 1, 1: 1})  # decode: max_k grows every step
        if entries is None:
            entries = len(gt.RUNTIME._memo)
    assert len(gt.RUNTIME._memo) == entries and gt.stats()["built_here"] == engine.calls
