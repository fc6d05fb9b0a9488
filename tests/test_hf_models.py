"""Issue 25's measure through attn_implementation="graphcache", on models
built from configs (tests/hf_models.py): recorded, warmed, then served on
other prompt lengths, a padded batch of 4 and 2-beam search. Greedy tokens
must equal unpatched torch's, or differ only where torch's own choice was a
near tie (a one-ulp logit gap of a random model, which the float32
reference that executes the ragged graphs here may break the other way)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="graphcache.hf needs torch (pip install '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from tests.hf_models import SMALL, measure  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_runtime():
    gt.reset()
    yield
    gt.reset()


# T5's relative position bias reaches the graphs through the SDPA drop-in's bias graphs.
@pytest.mark.parametrize("name", ["llama", "bart", "mistral", "gemma3", "t5"])
def test_recorded_and_warmed_model_is_served_by_graphs_with_torchs_tokens(tmp_path, name):
    compiler = CpuGraphCompiler()
    cases = measure(name, compiler, tmp_path, SMALL, new_tokens=3)
    for case in cases:
        assert case.calls > 0, case
        assert case.fraction >= 0.95, case
        assert case.equal or case.tie, case
    assert compiler.executions > 0


def test_gpt_oss_attention_sinks_are_served_by_sink_graphs_with_eagers_tokens(tmp_path):
    """gpt-oss (s_aux sinks on both layers, a 64-token window on one): its
    prompts, decode steps (past the window too) and beams are dense ``sinks``
    graphs, compared with transformers' eager (its sdpa refuses sinks); a
    left-padded batch still falls back to eager, named ``sinks``."""
    pytest.importorskip("transformers.models.gpt_oss")
    compiler = CpuGraphCompiler()
    cases = measure("gpt_oss", compiler, tmp_path, SMALL, new_tokens=3, baseline="eager")
    by_name = {case.name: case for case in cases}
    for name in ("other prompt lengths, b=1", "2-beam search"):
        case = by_name[name]
        assert case.calls > 0 and case.fraction >= 0.95 and (case.equal or case.tie), case
    padded = by_name["padded batch of 4"]
    assert padded.fallbacks.get("sinks", 0) > 0 and (padded.equal or padded.tie), padded
    assert compiler.executions > 0
    assert "sinks: true" in (tmp_path / "gpt_oss-graphcache.yaml").read_text()  # the recording writes the field


@pytest.mark.parametrize(("name", "route"), [("llama", "graphcache"), ("llama", "sdpa"), ("bart", "graphcache")])
def test_a_batch_1_recording_widened_to_max_batch_serves_a_padded_batch(tmp_path, name, route):
    """graphcache record --max-batch (issue 32, item 4): each call shape seen
    at batch 1 is written for every batch class up to 4, unpadded and padded,
    so a left-padded batch of 4 of other lengths is served from graphs."""
    import contextlib

    from graphcache import GraphCache, manifest, ops
    from graphcache.stores import DiskStore
    from tests import hf_models

    model = hf_models.build(name, route)
    path = tmp_path / "m.yaml"
    with gt.patch() if route == "sdpa" else contextlib.nullcontext():
        with gt.record(path, shape_classes="pow2", max_batch=4):
            for p in SMALL.record:
                hf_models.generate(model, (p,), 3)
    assert "# Widened to batches up to 4" in path.read_text()
    cache = GraphCache(DiskStore(tmp_path / "store"), CpuGraphCompiler(), shape_classes="pow2")
    ops.warm(manifest.load(path), cache)
    model.set_attn_implementation("sdpa")
    want = hf_models.generate(model, SMALL.serve_batch, 3)
    model.set_attn_implementation(route)
    gt.reset()
    gt.configure(cache, device="cpu", on_miss="torch")
    with gt.patch() if route == "sdpa" else contextlib.nullcontext():
        got = hf_models.generate(model, SMALL.serve_batch, 3)
    stats = gt.stats()
    assert stats["calls"] and stats["hits"] >= 0.95 * stats["calls"], stats
    assert torch.equal(want, got)
