"""Transformers models warmed ONLY from ``graphcache manifest`` for their
config (issues 26 and 32): no recording, the model traced from its config,
then served through each route (``sdpa`` under ``graphcache.torch.patch()``,
and the ``graphcache`` attention backend). The CPU stand-in compiler
executes every graph. The families read before, and (issue 32) at least one
case of every architecture outside them; the whole table, every case on
both routes, is scripts/bench/bench_hf_models.py --from-config's."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from tests import hf_models  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

NEW_TOKENS = 8
SMALL = ("--max-batch", "4", "--max-seq", "256")


@pytest.fixture(autouse=True)
def fresh_runtime():
    gt.reset()
    yield
    gt.reset()


@pytest.mark.parametrize(
    ("name", "route"),
    # One route each, the two alternating (the suite's 15-minute budget; every
    # family on both routes is scripts/bench/bench_hf_models.py --from-config's table,
    # and each family is served on both routes from a recording in
    # tests/test_hf_models.py and tests/test_hf_sdpa_route.py).
    [
        ("llama", "sdpa"),  # padded: bias graphs, decode folded to the GQA decode step
        ("bart", "graphcache"),  # padded: ragged graphs, cross-attention
        ("mistral", "graphcache"),  # the window on ragged graphs
        ("t5", "sdpa"),  # its relative position bias on every call: bias graphs only, on either route
    ],
)
def test_a_model_warmed_only_from_its_config_serves_prompts_and_beams(tmp_path, name, route):
    compiler = CpuGraphCompiler()
    # The suite's small sizes (classes up to 256); the full lengths (up to 1024) are the bench's.
    found, builds = hf_models.served(name, route, tmp_path, compiler, hf_models.SMALL_SERVE, NEW_TOKENS, SMALL)
    assert builds == 0, "served from what the manifest warmed"
    by_name = {case.name: case for case in found}
    for case in ("other prompt lengths, b=1", "2-beam search"):
        result = by_name[case]
        assert result.calls and result.hits == result.calls, result
        assert result.equal, result
    # Route graphcache: ragged graphs; route sdpa: bias graphs (the decode
    # steps' as the GQA decode step the drop-in folds transformers' packed rows into).
    padded = by_name["padded batch of 4"]
    assert padded.fraction >= 0.95, padded


# Issue 32: architectures outside the families, at the test suite's small
# sizes, the routes alternating (Falcon on sdpa here: its backend route depends
# on the installed transformers, the test after this one). One of each kind of
# attention code: a BERT-style encoder, ModernBERT's own, a mixture of experts,
# multi-query Falcon, GPT-NeoX's rotary decoder and a Marian encoder-decoder;
# every architecture of hf_models.ARCHITECTURES, each case on both routes, is
# scripts/bench/bench_hf_models.py --from-config's table (the suite's time budget).
SUITE_ARCHITECTURES = ("bert", "modernbert", "qwen3_moe", "falcon", "gpt_neox", "marian")
OUTSIDE = [
    (
        name,
        "sdpa" if name == "falcon" or i % 2 else "graphcache",
        "2-beam search" if i % 3 == 2 else "padded batch of 4",
    )
    for i, name in enumerate(SUITE_ARCHITECTURES)
]
assert set(SUITE_ARCHITECTURES) <= set(hf_models.ARCHITECTURES)


@pytest.mark.parametrize(("name", "route", "case"), OUTSIDE)
def test_an_architecture_outside_the_families_is_served_from_its_traced_manifest(tmp_path, name, route, case):
    if name in hf_models.ENCODERS:
        case = "padded batch of 4" if case == "2-beam search" else "other prompt lengths, b=1"
    compiler = CpuGraphCompiler()
    found, builds = hf_models.served(name, route, tmp_path, compiler, hf_models.SMALL_SERVE, 3, SMALL, only=[case])
    (result,) = found
    assert builds == 0 and compiler.loads > 0
    assert result.calls and result.fraction >= 0.95, result
    assert result.equal or result.tie, result


def test_falcon_is_served_on_the_backend_route_where_transformers_dispatches_it(tmp_path):
    # transformers 5.25 sends Falcon's attention through its AttentionInterface
    # (5.24 did not: tests/test_models_trace.py checks that refusal).
    if not hf_models.dispatches("falcon"):
        pytest.skip(f"transformers {transformers.__version__} does not dispatch Falcon's attention to a backend")
    compiler = CpuGraphCompiler()
    only = ["padded batch of 4"]
    found, builds = hf_models.served("falcon", "graphcache", tmp_path, compiler, hf_models.SMALL_SERVE, 3, SMALL, only)
    (result,) = found
    assert builds == 0 and compiler.loads > 0
    assert result.calls and result.fraction >= 0.95, result
    assert result.equal or result.tie, result


def _serve(model, cache, route, run):  # noqa: ANN001, ANN202
    """``run()`` through ``route`` from ``cache`` (misses run torch): its result and the drop-in's counters."""
    import contextlib

    model.set_attn_implementation("sdpa" if route == "sdpa" else "graphcache")
    gt.reset()
    gt.configure(cache, device="cpu", on_miss="torch")
    with gt.patch() if route == "sdpa" else contextlib.nullcontext():
        got = run()
    stats = gt.stats()
    model.set_attn_implementation("sdpa")
    gt.reset()
    return got, stats


@pytest.mark.parametrize("route", ["sdpa", "graphcache"])
def test_static_cache_generate_is_served_from_the_default_manifest(tmp_path, route):
    """generate(cache_implementation="static") after prompts of two lengths
    and for a left-padded batch of 3, warmed from the default manifest of the
    config alone: the prefill reads the cache's slots in place and every step
    shares its shape (padding lengths, or a bias for the padded batch)."""
    compiler = CpuGraphCompiler()
    cache = hf_models.warmed_from_config("llama", route, tmp_path, compiler, SMALL)
    builds = compiler.builds
    model = hf_models.build("llama", "sdpa")
    runs = [(20,), (140,), (140, 60, 17)]

    def run():  # noqa: ANN202
        return [hf_models.generate(model, p, 3, cache_implementation="static") for p in runs]

    want = run()  # unpatched torch
    got, stats = _serve(model, cache, route, run)
    assert stats["calls"] == 2 * 3 * len(runs), stats  # 2 layers, 3 forwards a generate
    assert stats["hits"] >= 0.95 * stats["calls"] and stats["built_here"] == 0, stats
    assert compiler.builds == builds
    assert stats["copies"] == 0, stats["copied"]  # the cache read where it lies
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)


@pytest.mark.parametrize(("route", "fullgraph"), [("sdpa", False), ("graphcache", True)])
def test_a_compiled_model_is_served_from_the_default_manifest(tmp_path, route, fullgraph):
    """torch.compile(model) forward and generate's own compiled decode on a
    static cache, warmed from the default manifest of the config alone,
    which traces what compiled code hands attention too (under patch(): a
    prompt's k and v on an empty cache in the projection's layout, a masked
    GQA decode step's key and value heads repeated; through the backend: no
    host read, so fullgraph=True holds): outputs those of the same program
    compiled on plain torch."""
    from transformers import CompileConfig

    compiler = CpuGraphCompiler()
    cache = hf_models.warmed_from_config("llama", route, tmp_path, compiler, SMALL)
    model = hf_models.build("llama", "sdpa")
    compiled = torch.compile(model, fullgraph=fullgraph)
    ids, _ = hf_models.batch((20,), left=True)
    auto = CompileConfig(fullgraph=fullgraph)
    auto._compile_all_devices = True  # generate compiles its decode steps on CUDA only, unless told

    def run():  # noqa: ANN202
        with torch.no_grad():
            logits = compiled(ids).logits  # no padding mask: is_causal, on a fresh DynamicCache
        return logits, hf_models.generate(model, (20,), 2, cache_implementation="static", compile_config=auto)

    want = run()  # compiled, plain torch
    got, stats = _serve(model, cache, route, run)
    assert stats["calls"] == 2 * 3, stats  # a forward, generate's prefill and its one compiled decode step
    assert stats["hits"] == stats["calls"] and stats["built_here"] == 0, stats
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(got[1], want[1])
