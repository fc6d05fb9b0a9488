"""graphcache.torch: the SDPA drop-in, its spec derivation, memo and miss policy (CPU)."""

from __future__ import annotations

import math
import threading

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")

import torch.nn.functional as F  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, GraphSpec, ManifestError, NotFound, UnsupportedSpec  # noqa: E402
from graphcache.settings import SettingsError  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

SDPA = torch._C._nn.scaled_dot_product_attention  # torch's own, whatever is patched


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    monkeypatch.delenv("GRAPHCACHE_SDPA_ON_MISS", raising=False)
    gt.reset()
    yield
    gt.reset()
    assert not gt.enabled()


def bhsd(b, h, s, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, s, d, generator=g).to(dtype)


def bshd_view(b, h, s, d, dtype=torch.bfloat16, seed=0):
    """A (b, h, s, d) view of a contiguous (b, s, h, d) tensor, as models make."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, h, d, generator=g).to(dtype).transpose(1, 2)


# -- spec_for ---------------------------------------------------------------------------


def test_layout_comes_from_strides():
    q, k, v = (bshd_view(2, 8, 64, 64, seed=i) for i in range(3))
    assert gt.spec_for(q, k, v).layout == "bshd"
    q, k, v = (bhsd(2, 8, 64, 64, seed=i) for i in range(3))
    spec = gt.spec_for(q, k, v)
    assert spec == GraphSpec(batch=2, heads_q=8, seq_q=64, head_dim=64, dtype="bfloat16", layout="bhsd")


def test_is_causal_is_top_left_causal_also_for_unequal_lengths_and_gqa_gives_heads_kv():
    q = bhsd(1, 8, 16, 128, torch.float16)
    k, v = bhsd(1, 2, 48, 128, torch.float16, 1), bhsd(1, 2, 48, 128, torch.float16, 2)
    spec = gt.spec_for(q, k, v, is_causal=True, enable_gqa=True)
    assert (spec.mask, spec.seq_q, spec.seq_kv, spec.heads_q, spec.heads_kv, spec.dtype) == (
        "causal",
        16,
        48,
        8,
        2,
        "float16",
    )


def test_an_explicit_default_scale_is_the_same_spec_as_none():
    q, k, v = (bhsd(1, 4, 8, 32, seed=i) for i in range(3))
    assert gt.spec_for(q, k, v, scale=32**-0.5) == gt.spec_for(q, k, v)
    assert gt.spec_for(q, k, v, scale=0.5).attn_scale == 0.5


def test_decode_query_of_one_token_fits_any_layout_of_the_cache():
    q = bshd_view(1, 8, 1, 64)
    k, v = bhsd(1, 8, 128, 64, seed=1), bhsd(1, 8, 128, 64, seed=2)
    assert gt.spec_for(q, k, v).layout == "bhsd"


@pytest.mark.parametrize(
    "make, words, reason",
    [
        # heads 3 in a mask of a 4-head call: no bias spec (batch and heads each the call's or 1)
        (lambda: dict(q=bhsd(1, 4, 8, 64), attn_mask=torch.ones(3, 8, 8, dtype=torch.bool)), "attn_mask", "mask"),
        (
            lambda: dict(
                q=bhsd(1, 4, 8, 64, torch.float32),
                k=bhsd(1, 4, 8, 64, torch.float32),
                v=bhsd(1, 4, 8, 64, torch.float32),
            ),
            "float32.*use float16 or bfloat16",
            "dtype",
        ),
        (lambda: dict(k=bhsd(1, 4, 8, 64, torch.float16)), "differ in dtype", "invalid"),
        (lambda: dict(q=bhsd(1, 4, 8, 60), k=bhsd(1, 4, 8, 60), v=bhsd(1, 4, 8, 60)), "head_dim=60", "head_dim"),
        (lambda: dict(q=bhsd(1, 4, 8, 64)[0], k=bhsd(1, 4, 8, 64)[0], v=bhsd(1, 4, 8, 64)[0]), "4-D", "not_4d"),
    ],
)
def test_calls_that_cannot_be_cudnn_graphs_say_why(make, words, reason):
    args = {"q": bhsd(1, 4, 8, 64), "k": bhsd(1, 4, 8, 64, seed=1), "v": bhsd(1, 4, 8, 64, seed=2), **make()}
    with pytest.raises(UnsupportedSpec, match=words) as raised:
        gt.spec_for(args["q"], args["k"], args["v"], attn_mask=args.get("attn_mask"))
    assert isinstance(raised.value, gt.UnsupportedCall) and raised.value.reason == reason


# -- the drop-in: same result as torch --------------------------------------------------


CALLS = [
    dict(q=(2, 8, 16, 64), kv=(2, 8, 16, 64)),
    dict(q=(2, 8, 16, 64), kv=(2, 8, 40, 64), is_causal=True),
    dict(q=(1, 8, 4, 64), kv=(1, 2, 32, 64), enable_gqa=True, is_causal=True),
    dict(q=(1, 4, 8, 64), kv=(1, 4, 8, 64), scale=0.3),
    dict(q=(1, 4, 8, 64), kv=(1, 4, 8, 64), mask=True),
    dict(q=(1, 4, 8, 60), kv=(1, 4, 8, 60)),
]


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drop_in_returns_torchs_result(call, dtype):
    q = bhsd(*call["q"], dtype=dtype)
    k, v = bhsd(*call["kv"], dtype=dtype, seed=1), bhsd(*call["kv"], dtype=dtype, seed=2)
    kwargs = {name: call[name] for name in ("is_causal", "enable_gqa", "scale") if name in call}
    if call.get("mask"):
        kwargs["attn_mask"] = torch.rand(call["q"][2], call["kv"][2]) > 0.3
    want = F.scaled_dot_product_attention(q, k, v, **kwargs)
    got = gt.scaled_dot_product_attention(q, k, v, **kwargs)
    assert torch.equal(got, want)
    assert gt.stats()["calls"] == 1


def test_fallbacks_are_counted_by_reason():
    q = bhsd(1, 4, 8, 64)
    gt.scaled_dot_product_attention(q, q, q)  # eligible, but CPU tensors and no cache for the CPU
    gt.scaled_dot_product_attention(q.float(), q.float(), q.float())
    gt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))  # a bias spec: device
    qg = q.clone().requires_grad_()
    gt.scaled_dot_product_attention(qg, q, q).sum().backward()  # autograd still works: torch ran it
    assert qg.grad is not None
    s = gt.stats()
    assert s["fallbacks"] == {"device": 2, "dtype": 1, "autograd": 1}
    assert (s["calls"], s["hits"], s["misses"], s["graphs_loaded"]) == (4, 0, 0, 0)


def test_a_masked_call_shape_is_judged_once(monkeypatch):
    """Masked calls (most HF calls with padding): like any call shape, the
    verdict is reached once per mask shape, not re-derived on every call or
    for every mask value (here a fallback: no cache serves the CPU)."""
    import graphcache.torch.core.runtime as runtime

    derived = []
    real = runtime._derive
    monkeypatch.setattr(runtime, "_derive", lambda args: derived.append(1) or real(args))
    q = bhsd(1, 4, 8, 64)
    for seed in range(5):
        mask = torch.rand(8, 8, generator=torch.Generator().manual_seed(seed)) > 0.3
        assert torch.equal(gt.scaled_dot_product_attention(q, q, q, attn_mask=mask), SDPA(q, q, q, attn_mask=mask))
    assert len(derived) == 1
    assert gt.stats()["fallbacks"] == {"device": 5}


# -- the cache behind it (a CPU stand-in for the cuDNN compiler) ---------------------------


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path / "store")


def configure(store, on_miss=None):
    compiler = CpuGraphCompiler()
    cache = GraphCache(store, compiler, shape_classes="exact")  # exact shapes here: classes in test_classes_torch.py
    gt.configure(cache, device="cpu", on_miss=on_miss)
    return cache, compiler


def test_a_hit_loads_the_graph_once_and_returns_torchs_result(store):
    cache, compiler = configure(store)
    q, k, v = (bshd_view(2, 8, 32, 64, seed=i) for i in range(3))
    cache.get(gt.spec_for(q, k, v, is_causal=True))  # warmed, as graphcache warm does
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for _ in range(5):
        got = gt.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(got, want)
    assert got.shape == want.shape
    s = gt.stats()
    assert (s["calls"], s["hits"], s["misses"], s["graphs_loaded"], s["fallbacks"]) == (5, 5, 0, 1, {})
    assert compiler.loads == 1 and compiler.executions == 5


@pytest.mark.parametrize("on_miss", ["torch", "build"])
def test_a_first_hit_reads_and_verifies_the_artifact_once(store, monkeypatch, on_miss):
    """The first call of a shape fetches its artifact once (one store read,
    one SHA-256 of the plan), whatever happens on a miss."""
    from graphcache import artifact as artifact_module

    cache, compiler = configure(store, on_miss=on_miss)
    q, k, v = (bhsd(1, 8, 8, 64, seed=i) for i in range(3))
    cache.get(gt.spec_for(q, k, v))
    decodes = []
    real = artifact_module.Artifact.decode.__func__
    monkeypatch.setattr(
        artifact_module.Artifact, "decode", classmethod(lambda cls, *a, **kw: decodes.append(1) or real(cls, *a, **kw))
    )
    gt.scaled_dot_product_attention(q, k, v)
    assert len(decodes) == 1 and compiler.loads == 1
    assert gt.stats()["hits"] == 1


def test_calls_that_need_grad_run_torch_even_with_a_cached_graph(store):
    cache, compiler = configure(store)
    q, k, v = (bhsd(1, 8, 8, 64, seed=i) for i in range(3))
    cache.get(gt.spec_for(q, k, v))
    qg = q.clone().requires_grad_()
    gt.scaled_dot_product_attention(qg, k, v).float().sum().backward()
    assert qg.grad is not None and compiler.executions == 0
    assert gt.stats()["fallbacks"] == {"autograd": 1}
    with torch.no_grad():
        gt.scaled_dot_product_attention(qg, k, v)
    assert compiler.executions == 1


def test_one_key_value_head_broadcast_over_the_query_heads_is_multi_query_attention(store):
    """Falcon's multi-query attention hands torch k/v of one head and no
    enable_gqa (torch broadcasts the head dim): an MQA graph, torch's answer."""
    cache, compiler = configure(store)
    q, k, v = bhsd(2, 8, 16, 64), bhsd(2, 1, 16, 64, seed=1), bhsd(2, 1, 16, 64, seed=2)
    spec = gt.spec_for(q, k, v, is_causal=True)
    assert (spec.heads_q, spec.heads_kv) == (8, 1)
    cache.get(spec)
    got = gt.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch's broadcast kernel and its enable_gqa one round bf16 differently (one ulp).
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert gt.stats()["hits"] == 1 and compiler.executions == 1


def test_value_as_a_view_of_a_fused_qkv_projection_is_copied_into_the_keys_layout(store):
    """ModernBERT: one (b, s, 3, h, d) projection; rotary embedding makes q
    and k new (b, s, h, d) tensors, v stays a view with the fused stride."""
    cache, compiler = configure(store)
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 24, 3, 4, 32, generator=g).to(torch.bfloat16)
    q, k = (qkv[:, :, i].contiguous().transpose(1, 2) for i in (0, 1))
    v = qkv[:, :, 2].transpose(1, 2)
    assert not gt.derive.layouts_of(v)
    spec = gt.spec_for(q, k, v)
    assert spec.layout == "bshd"
    cache.get(spec)
    got = gt.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v))
    assert gt.stats()["hits"] == 1 and compiler.executions == 1


@pytest.mark.parametrize("cache_layout", ["bhsd", "bshd"])
def test_prefill_query_in_another_layout_than_the_cache_still_hits(store, cache_layout):
    cache, compiler = configure(store)
    if cache_layout == "bhsd":  # Hugging Face's prefill: q a projection view, k/v the contiguous cache
        q = bshd_view(1, 8, 16, 64)
        k, v = bhsd(1, 2, 16, 64, seed=1), bhsd(1, 2, 16, 64, seed=2)
    else:
        q = bhsd(1, 8, 16, 64)
        k, v = bshd_view(1, 2, 16, 64, seed=1), bshd_view(1, 2, 16, 64, seed=2)
    spec = gt.spec_for(q, k, v, is_causal=True, enable_gqa=True)
    assert spec.layout == cache_layout
    cache.get(spec)
    got = gt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    assert gt.stats()["hits"] == 1


def test_a_miss_runs_torch_and_is_remembered(store):
    cache, compiler = configure(store)
    q, k, v = (bhsd(1, 8, 1, 64, seed=i) for i in range(3))
    spec = gt.spec_for(q, k, v)
    for _ in range(3):
        assert torch.equal(gt.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    cache.get(spec)  # warmed after the process saw the miss: the miss stays remembered
    gt.scaled_dot_product_attention(q, k, v)
    s = gt.stats()
    assert (s["misses"], s["hits"], s["fallbacks"]) == (4, 0, {"miss": 4})
    assert s["missed_specs"] == [{"spec": spec.to_dict(), "calls": 4}]
    assert compiler.loads == 0 and compiler.builds == 1


def test_on_miss_build_builds_stores_and_uses(store, monkeypatch):
    monkeypatch.setenv("GRAPHCACHE_SDPA_ON_MISS", "build")
    cache, compiler = configure(store)
    q, k, v = (bhsd(1, 8, 4, 64, seed=i) for i in range(3))
    for _ in range(3):
        torch.testing.assert_close(gt.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    assert compiler.builds == 1 and compiler.loads == 1
    assert store.exists(cache.key(gt.spec_for(q, k, v)))
    # Served by a graph built on the spot: a cold start, no hit (issue 39).
    s = gt.stats()
    assert (s["calls"], s["built_here"], s["hits"], s["served_from_store"], s["misses"]) == (3, 3, 0, 0, 3), s
    built = gt.spec_for(q, k, v).summary()
    assert s["built_graphs"] == [built] and s["fallbacks"] == {}
    assert (
        gt.summary()
        == f"3 calls: 0 served from the store, 3 by graphs built here (1 built: {built}), 0 fell back to torch"
    )
    # The next process finds what this one stored: every call a hit from the store.
    gt.reset()
    configure(store)
    for _ in range(3):
        gt.scaled_dot_product_attention(q, k, v)
    s = gt.stats()
    assert (s["hits"], s["served_from_store"], s["built_here"], s["misses"], s["built_graphs"]) == (3, 3, 0, 0, []), s


def test_on_miss_error_raises_and_stores_nothing(store, monkeypatch):
    monkeypatch.setenv("GRAPHCACHE_SDPA_ON_MISS", "error")
    cache, compiler = configure(store)
    q = bhsd(1, 8, 4, 64)
    with pytest.raises(NotFound, match="GRAPHCACHE_SDPA_ON_MISS=torch"):
        gt.scaled_dot_product_attention(q, q, q)
    assert list(store.keys()) == [] and compiler.builds == 0
    assert (gt.stats()["calls"], gt.stats()["misses"]) == (1, 1)  # a call that raised is still a call
    cache.get(gt.spec_for(q, q, q))  # once warmed, the same process hits
    gt.scaled_dot_product_attention(q, q, q)
    assert gt.stats()["hits"] == 1


def test_a_bad_on_miss_value_names_the_variable_and_the_choices(store, monkeypatch):
    monkeypatch.setenv("GRAPHCACHE_SDPA_ON_MISS", "later")
    configure(store)
    q = bhsd(1, 8, 4, 64)
    with pytest.raises(SettingsError, match="GRAPHCACHE_SDPA_ON_MISS='later'.*torch, build, error"):
        gt.scaled_dot_product_attention(q, q, q)
    with pytest.raises(SettingsError, match="GRAPHCACHE_SDPA_ON_MISS='later'"):
        with gt.patch():  # at patch time, not at the first miss (which may never come on a CPU host)
            pass
    assert not gt.enabled()
    with pytest.raises(ValueError, match="on_miss='later' is not one of torch, build, error"):
        gt.configure(on_miss="later")
    with pytest.raises(ValueError, match="needs device="):
        gt.configure(GraphCache(store, CpuGraphCompiler()))


def test_a_spec_cudnn_refuses_is_a_fallback_remembered_per_target(store):
    compiler = CpuGraphCompiler(unsupported={"causal"})
    gt.configure(GraphCache(store, compiler, shape_classes="exact"), device="cpu", on_miss="build")
    q = bhsd(1, 8, 4, 64)
    for _ in range(3):
        gt.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert gt.stats()["fallbacks"] == {"unsupported": 3} and compiler.builds == 1


def test_threads_share_one_load(store):
    cache, compiler = configure(store)
    q = bhsd(1, 8, 8, 64)
    cache.get(gt.spec_for(q, q, q))
    want = F.scaled_dot_product_attention(q, q, q)
    errors = []

    def worker():
        try:
            for _ in range(50):
                torch.testing.assert_close(gt.scaled_dot_product_attention(q, q, q), want)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and compiler.loads == 1 and gt.stats()["hits"] == 400


# -- bad input -----------------------------------------------------------------------------


BAD = [
    ("dtypes differ", lambda: (bhsd(1, 4, 8, 64), bhsd(1, 4, 8, 64, torch.float16), bhsd(1, 4, 8, 64)), {}),
    ("heads without gqa", lambda: (bhsd(1, 8, 8, 64), bhsd(1, 2, 8, 64), bhsd(1, 2, 8, 64)), {}),
    ("q/k head dims differ", lambda: (bhsd(1, 4, 8, 64), bhsd(1, 4, 8, 32), bhsd(1, 4, 8, 64)), {}),
    ("devices differ", lambda: (bhsd(1, 4, 8, 64), bhsd(1, 4, 8, 64).to("meta"), bhsd(1, 4, 8, 64)), {}),
    ("dropout out of range", lambda: (bhsd(1, 4, 8, 64),) * 3, {"dropout_p": 1.5}),
]


@pytest.mark.parametrize("name, make, kwargs", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_torchs_own_error_and_stores_nothing(store, tmp_path, name, make, kwargs):
    cache, compiler = configure(store, on_miss="build")
    q, k, v = make()
    with pytest.raises(Exception) as theirs:
        SDPA(q, k, v, **kwargs)
    manifest = tmp_path / "m.yaml"
    with pytest.raises(ManifestError, match="no scaled_dot_product_attention call was made"):
        with gt.record(manifest):
            with pytest.raises(type(theirs.value)) as ours:
                gt.scaled_dot_product_attention(q, k, v, **kwargs)
    assert str(ours.value) == str(theirs.value)
    assert list(store.keys()) == [] and compiler.builds == 0
    assert gt.stats()["calls"] == 0 and not manifest.exists()


def test_scale_normalisation_is_exact_only_for_the_default():
    assert math.isclose(64**-0.5, 1 / math.sqrt(64))
    q = bhsd(1, 4, 8, 64)
    assert gt.spec_for(q, q, q, scale=0.125 * (1 + 1e-6)).attn_scale != gt.spec_for(q, q, q).attn_scale


def test_a_subclass_in_any_argument_falls_back_and_a_parameter_is_plain(store):
    """Only plain tensors (a Parameter is one) reach a cached graph; a tensor
    subclass as key or value, with a plain query of the same shape, does not
    share the plain call's memo entry."""

    class Tagged(torch.Tensor):
        pass

    cache, compiler = configure(store)
    q, k, v = (bhsd(1, 8, 8, 64, seed=i) for i in range(3))
    cache.get(gt.spec_for(q, k, v))
    gt.scaled_dot_product_attention(q, k, v)
    assert compiler.executions == 1
    gt.scaled_dot_product_attention(q, k.as_subclass(Tagged), v)
    assert compiler.executions == 1 and gt.stats()["fallbacks"] == {"tensor_subclass": 1}
    with torch.no_grad():
        gt.scaled_dot_product_attention(torch.nn.Parameter(q), k, v)
    assert compiler.executions == 2
