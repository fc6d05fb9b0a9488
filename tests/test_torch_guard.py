"""graphcache.torch's guarded execute (issue 33, item 4): a cached graph
that raises at execute on a hit never raises into the model. The call falls
back (to the exact graph where a class graph raised, then to torch's own
SDPA, varlen op or transformers' sdpa), counted under ``execute_failed``,
logged once, and that (graph, call shape) pair is not tried again in the
process. The failing plans are tests/torch_standins.FailingCompiler's."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache  # noqa: E402
from graphcache.spec.classes import class_of  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from graphcache.torch.core import memo  # noqa: E402
from tests.torch_standins import FailingCompiler  # noqa: E402

SDPA = torch._C._nn.scaled_dot_product_attention  # torch's own, whatever is patched


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    monkeypatch.delenv("GRAPHCACHE_SDPA_ON_MISS", raising=False)
    monkeypatch.delenv("GRAPHCACHE_SHAPE_CLASSES", raising=False)
    gt.reset()
    yield
    gt.reset()


def serve(tmp_path, fails, classes="exact", on_miss="build"):  # noqa: ANN001, ANN201
    compiler = FailingCompiler(fails)
    cache = GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes=classes)
    gt.configure(cache, device="cpu", on_miss=on_miss)
    return cache, compiler


def qkv(b=1, h=8, sq=1, skv=40, d=64, seed=0):  # noqa: ANN001, ANN201
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=g).to(torch.bfloat16) for s in (sq, skv, skv))


def test_a_hit_whose_execute_raises_returns_torchs_output_and_is_not_tried_again(tmp_path, caplog):
    cache, compiler = serve(tmp_path, fails=lambda spec, shape: True)
    q, k, v = qkv()
    cache.get(gt.spec_for(q, k, v))  # warmed: the first call is a hit on a graph that raises
    with caplog.at_level(logging.WARNING, logger="graphcache.torch"):
        for _ in range(3):
            assert torch.equal(gt.scaled_dot_product_attention(q, k, v), SDPA(q, k, v))
    assert compiler.attempts == 1, "the (graph, call shape) pair is tried once in the process"
    stats = gt.stats()
    assert stats["fallbacks"] == {"execute_failed": 3} and stats["hits"] == 0 and stats["calls"] == 3
    assert stats["execute_failures"] == 1
    warned = [r for r in caplog.records if "raised at execute" in r.getMessage()]
    assert len(warned) == 1 and "INVALID_DYNAMIC_SHAPE" in warned[0].getMessage()


def test_a_class_graph_that_raises_at_one_shape_gives_way_to_the_exact_graph_there_only(tmp_path):
    klass_fails = lambda spec, shape: spec.is_class and shape == (1, 8, 1, 64)  # noqa: E731
    cache, compiler = serve(tmp_path, fails=klass_fails, classes="pow2")
    q = qkv()[0]
    k40, k41 = qkv(skv=40)[1], qkv(skv=41)[1]
    cache.get(class_of(gt.spec_for(q, k40, k40), "pow2"))
    cache.get(gt.spec_for(q, k40, k40))  # the exact graph of one shape is stored too
    for _ in range(2):
        assert torch.equal(gt.scaled_dot_product_attention(q, k40, k40), SDPA(q, k40, k40))
    assert compiler.attempts == 1
    assert gt.stats()["hits"] == 2 and gt.stats()["fallbacks"] == {}, "the exact graph served both calls"
    assert [s.is_class for s in gt.RUNTIME._graphs] == [True, False]
    compiler.fails = lambda spec, shape: False  # the class still serves its other shapes
    executions = compiler.executions
    assert torch.equal(gt.scaled_dot_product_attention(q, k41, k41), SDPA(q, k41, k41))
    assert compiler.executions == executions + 1 and gt.stats()["hits"] == 3


def test_when_the_exact_graph_raises_too_torch_runs_and_neither_is_tried_again(tmp_path):
    cache, compiler = serve(tmp_path, fails=lambda spec, shape: True, classes="pow2", on_miss="error")
    q, k, v = qkv()
    cache.get(class_of(gt.spec_for(q, k, v), "pow2"))
    cache.get(gt.spec_for(q, k, v))
    for _ in range(3):
        assert torch.equal(gt.scaled_dot_product_attention(q, k, v), SDPA(q, k, v))
    assert compiler.attempts == 2, "the class graph once, then the exact one once"
    assert gt.stats()["fallbacks"] == {"execute_failed": 3} and gt.stats()["execute_failures"] == 2


def test_without_the_exact_graph_a_failed_class_falls_back_even_under_on_miss_error(tmp_path):
    # on_miss=error raises for a miss; a class graph that raised is no miss,
    # and its exact graph's absence must not raise into the model either.
    cache, compiler = serve(tmp_path, fails=lambda spec, shape: True, classes="pow2", on_miss="error")
    q, k, v = qkv()
    cache.get(class_of(gt.spec_for(q, k, v), "pow2"))
    assert torch.equal(gt.scaled_dot_product_attention(q, k, v), SDPA(q, k, v))
    assert gt.stats()["fallbacks"] == {"execute_failed": 1} and compiler.builds == 1


def test_a_failed_pair_is_not_tried_again_after_the_memo_forgets_its_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(memo, "MEMO_LIMIT", 4)
    cache, compiler = serve(tmp_path, fails=lambda spec, shape: spec.is_class, classes="pow2", on_miss="torch")
    q = qkv()[0]
    cache.get(class_of(gt.spec_for(q, *qkv(skv=40)[1:]), "pow2"))
    for _ in range(2):
        for n in range(33, 41):  # eight decode lengths of one class: the memo is emptied on the way
            k = qkv(skv=n)[1]
            assert torch.equal(gt.scaled_dot_product_attention(q, k, k), SDPA(q, k, k))
    assert compiler.attempts == 8, "each (class graph, call shape) pair raised once"
    assert gt.stats()["fallbacks"] == {"execute_failed": 16}


def test_a_masked_hit_whose_bias_graph_raises_returns_torchs_output(tmp_path):
    cache, compiler = serve(tmp_path, fails=lambda spec, shape: True)
    q, k, v = qkv(b=2, sq=16, skv=24)
    mask = torch.rand(2, 1, 16, 24, generator=torch.Generator().manual_seed(1)) > 0.3
    for _ in range(2):
        assert torch.equal(gt.scaled_dot_product_attention(q, k, v, attn_mask=mask), SDPA(q, k, v, attn_mask=mask))
    assert compiler.attempts == 1 and gt.stats()["fallbacks"] == {"execute_failed": 2}


def test_a_varlen_hit_whose_graph_raises_runs_the_fallback_and_is_not_tried_again(tmp_path):
    from graphcache.torch.varlen import fallback

    serve(tmp_path, fails=lambda spec, shape: True, classes="pow2")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(30, 8, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 12, 30], dtype=torch.int32)
    args = (q, k, v, cu, cu, 18, 18)
    for _ in range(2):
        got = gt.varlen_attn(*args, window_size=(-1, 0))
        want, _ = fallback((*args, False, None, (-1, 0), False), (None, None, None))
        assert torch.equal(got, want)
    compiler = gt.RUNTIME._cache.compiler
    assert compiler.attempts == 2, "the declared graph once, then the exact thd graph once"
    assert gt.stats()["fallbacks"] == {"execute_failed": 2}


def test_a_padded_prompt_through_the_hf_backend_whose_graph_raises_gets_transformers_answer(tmp_path):
    pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    from graphcache.hf.backend import attention
    from graphcache.hf.masks import padding_mask

    _, compiler = serve(tmp_path, fails=lambda spec, shape: True)

    class Layer(torch.nn.Module):
        is_causal, num_key_value_groups, head_dim = True, 1, 64

    pad = torch.ones(2, 16, dtype=torch.bool)
    pad[1, 9:] = False  # right padding: a padded dense graph
    q, k, v = qkv(b=2, sq=16, skv=16)
    for _ in range(2):
        got = attention(Layer(), q, k, v, padding_mask(2, 16, 16, 0, 0, causal_mask_function, pad))[0]
        mask = sdpa_mask(2, 16, 16, 0, 0, causal_mask_function, pad, allow_is_causal_skip=False)
        assert torch.equal(got, sdpa_attention_forward(Layer(), q, k, v, mask)[0])
    assert compiler.attempts == 1 and gt.stats()["fallbacks"] == {"execute_failed": 2}


def test_out_of_memory_at_execute_falls_back_for_that_call_only(tmp_path, caplog):
    """A failure of the moment is no verdict on the graph: torch's SDPA
    serves that call (and raises torch's own error if memory is still
    short), and the next call of the shape tries the graph again."""
    short = [True]

    def fails(spec, shape):  # noqa: ANN001, ANN202
        if short[0]:
            short[0] = False
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB (stand-in)")
        return False

    cache, compiler = serve(tmp_path, fails=fails)
    q, k, v = qkv()
    cache.get(gt.spec_for(q, k, v))
    with caplog.at_level(logging.WARNING, logger="graphcache.torch"):
        for _ in range(2):
            assert torch.equal(gt.scaled_dot_product_attention(q, k, v), SDPA(q, k, v))
    stats = gt.stats()
    assert stats["fallbacks"] == {"execute_failed": 1} and stats["hits"] == 1 and stats["execute_failures"] == 0
    assert compiler.executions == 1 and "tried again" in caplog.text
