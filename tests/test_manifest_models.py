"""A transformers model warmed only from ``graphcache manifest`` for its
config, then run through ``graphcache.torch.patch()`` on its ``sdpa``
attention (issue 26): every call at batch 1 is served, prompts of lengths no
recording saw included, with the tokens of unpatched torch. Padded batches
and beam search on this route need bias graphs (issue 25), tested there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest, ops  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.clirun import cli  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

NEW_TOKENS = 8


@pytest.fixture(autouse=True)
def fresh_runtime():
    gt.reset()
    yield
    gt.reset()


def llama():  # noqa: ANN201
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    return transformers.LlamaForCausalLM(config), config


def bart():  # noqa: ANN201
    torch.manual_seed(0)
    config = transformers.BartConfig(
        vocab_size=128,
        d_model=256,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_position_embeddings=1024,
    )
    return transformers.BartForConditionalGeneration(config), config


def generate(model, prompt: int) -> torch.Tensor:  # noqa: ANN001
    ids = torch.randint(3, 128, (1, prompt), generator=torch.Generator().manual_seed(prompt))
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            num_beams=1,
            pad_token_id=1,
        )


@pytest.mark.parametrize("make", [llama, bart], ids=["llama", "bart"])
def test_a_model_warmed_from_its_config_serves_every_call_at_batch_1(tmp_path, make):
    model, config = make()
    model = model.eval().to(torch.bfloat16)
    model.set_attn_implementation("sdpa")
    config.save_pretrained(tmp_path / "model")  # config.json, as a model folder holds it
    out = tmp_path / "m.yaml"
    run = cli("manifest", str(tmp_path / "model"), "--max-batch", "8", "--max-seq", "1024", "-o", str(out))
    assert run.returncode == 0, run.stderr
    specs = manifest.load(out)
    compiler = CpuGraphCompiler()
    ops.warm(specs, GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes="pow2"))

    prompts = (50, 300, 700)
    want = [generate(model, p) for p in prompts]  # unpatched torch
    compiler = CpuGraphCompiler()
    gt.configure(GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes="pow2"), device="cpu")
    with gt.patch():
        got = [generate(model, p) for p in prompts]
    stats = gt.stats()
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w, g)
    assert stats["calls"] > 0 and stats["hits"] == stats["calls"], stats
    assert compiler.builds == 0, "served from what the manifest warmed"
