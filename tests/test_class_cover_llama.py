"""Issue 26's "done when", through the drop-in on the CPU: a small Hugging
Face Llama recorded at batch 1 on prompts of 37, 200 and 513 tokens with 32
new tokens stores the 128, 256 and 1024 classes (prefill and decode); a
300-token prompt, whose own classes (512) were never recorded, is then served
by the 1024 classes on every call, with the tokens of unpatched torch.

Here 4 new tokens, not the issue's 32: no prompt crosses a class boundary
with either (37+32 and 37+4 are both in 128, 200+n in 256, 513+n and 300+n
in 1024), so the same classes are recorded and served, at an eighth of the
decode steps (the whole suite must run in under 15 minutes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest, ops  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests import hf_models  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

NEW_TOKENS = 4


def test_a_300_token_prompt_is_served_by_the_recorded_1024_classes(tmp_path):
    model = hf_models.build("llama", "sdpa")
    path = tmp_path / "llama.yaml"
    gt.reset()
    try:
        with gt.record(path, shape_classes="pow2"):
            for prompt in (37, 200, 513):
                hf_models.generate(model, (prompt,), NEW_TOKENS)
        specs = manifest.load(path)
        sizes = sorted((s.seq_q, s.seq_kv) for s in specs)
        assert sizes == [(1, 128), (1, 256), (1, 1024), (128, 128), (256, 256), (1024, 1024)]
        ops.warm(specs, GraphCache(DiskStore(tmp_path / "store"), CpuGraphCompiler(), shape_classes="pow2"))

        want = hf_models.generate(model, (300,), NEW_TOKENS)  # unpatched torch
        compiler = CpuGraphCompiler()
        cache = GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes="pow2")  # a new process
        gt.reset()
        gt.configure(cache, device="cpu", on_miss="torch")
        with gt.patch():
            got = hf_models.generate(model, (300,), NEW_TOKENS)
        stats = gt.stats()
        assert torch.equal(want, got)
        assert stats["calls"] == 2 * NEW_TOKENS
        assert stats["hits"] == stats["calls"] == stats["served_by_larger"], stats
        assert {g.spec.seq_kv for g in gt.RUNTIME._graphs.values()} == {1024}
        assert compiler.builds == 0
        assert stats["declared_to_real"] > 1
    finally:
        gt.reset()
