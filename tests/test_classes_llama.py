"""Issue 18's "done when", through the public API on the CPU: a small Hugging
Face Llama's generate() recorded on three prompt lengths needs at most 8
class graphs; after warm, generation on other prompt lengths is served from
them (TorchSdpaGraph executing, via the CPU stand-in compiler) on >= 95 % of
its SDPA calls, with the tokens of unpatched torch.

16 new tokens per prompt (it was 64, on prompts of 37, 200 and 513): the
middle prompt is 250 tokens so that its decode still crosses from the 256 to
the 512 class mid-generation, as 200 + 64 did; the same 7 classes are
recorded and served, at a quarter of the decode steps, and 48 call shapes
still meet at most 8 graphs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest, ops  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

NEW_TOKENS = 16


@pytest.fixture(autouse=True)
def fresh_runtime():
    gt.reset()
    yield
    gt.reset()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,  # GQA 8/2, head_dim 8
        max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)


def generate(model, prompt: int) -> torch.Tensor:  # noqa: ANN001
    # No token 0 (the pad token) in the prompt: generate() would then infer a
    # padding mask, a tensor mask no cached graph takes.
    ids = torch.randint(1, 128, (1, prompt), generator=torch.Generator().manual_seed(prompt))
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )


def test_llama_generate_records_few_class_graphs_and_warm_serves_other_prompt_lengths(tmp_path, model):
    path = tmp_path / "llama.yaml"
    with gt.record(path) as recorder:
        for prompt in (37, 250, 513):  # 250 + 16 tokens: decode crosses from class 256 into 512
            generate(model, prompt)
    specs = manifest.load(path)
    assert len(recorder.specs) == 3 * NEW_TOKENS  # what an exact-shape manifest would need
    assert len(specs) <= 8 and all(s.is_class for s in specs), [s.summary() for s in specs]
    assert {(s.seq_q, s.seq_kv) for s in specs if s.seq_q == 1} == {(1, 128), (1, 256), (1, 512), (1, 1024)}
    text = path.read_text()
    # Each class with the exact shapes it serves and their calls: the 37-token
    # prompt's 15 decode steps (kv 38..52), once per layer, fall in one class.
    steps = NEW_TOKENS - 1
    assert f"serves {steps} exact shape(s) (calls each):\n#       b1 q1 kv38-{37 + steps} x2\n" in text

    compiler = CpuGraphCompiler()
    cache = GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes="pow2")
    rows = ops.warm(specs, cache)
    assert {r.status for r in rows} == {"built"} and compiler.builds == len(specs)

    prompts = (50, 300, 700)
    want = [generate(model, p) for p in prompts]  # unpatched torch
    gt.reset()  # the recording's calls went through the drop-in too: count the serving run alone
    gt.configure(cache, device="cpu", on_miss="torch")
    with gt.patch():
        got = [generate(model, p) for p in prompts]
    stats = gt.stats()
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
    assert stats["calls"] == 2 * NEW_TOKENS * len(prompts)
    assert stats["hits"] >= 0.95 * stats["calls"], stats
    assert compiler.executions == stats["hits"]
    assert stats["graphs_loaded"] <= len(specs)
    # every prefill and decode step of every prompt is its own call shape (48), served by <= 8 graphs
    assert stats["shapes_served"] == len(prompts) * NEW_TOKENS
    assert compiler.builds == len(specs), "served from the warmed graphs: nothing was built"
