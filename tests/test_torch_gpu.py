"""graphcache.torch on a real GPU: patched models against unpatched torch.

Skipped, with the reason, where there is no CUDA GPU with cuDNN (this
repository's CI has none; not yet run on a GPU: see docs/gpu-results.md).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="needs torch with CUDA")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache  # noqa: E402
from graphcache.compilers.torch_sdpa import TOLERANCE, relative_error  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402


@pytest.fixture
def cached(tmp_path):
    from graphcache.compilers.cudnn import CudnnCompiler

    gt.reset()
    gt.configure(GraphCache(DiskStore(tmp_path / "store"), CudnnCompiler()), on_miss="build")
    yield
    gt.reset()


def test_patched_llama_prefill_and_decode_match_torch(cached):
    transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=1024,
        intermediate_size=2048,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 512, (1, 64), device="cuda")

    def run():
        first = model(ids, use_cache=True)
        token = first.logits[:, -1:].argmax(-1)
        second = model(token, past_key_values=first.past_key_values, use_cache=True)
        return first.logits, second.logits

    with torch.no_grad():
        want = run()
        with gt.patch():
            got = run()
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) < TOLERANCE["bfloat16"]
    stats = gt.stats()
    assert stats["built_here"] == 4 and stats["fallbacks"] == {}, stats  # 2 layers x (prefill, decode)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_patched_torch_modules_match_their_fused_fast_path(cached, dtype):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(512, 8, batch_first=True).to("cuda", dtype).eval()
    tel = torch.nn.TransformerEncoderLayer(512, 8, 1024, batch_first=True).to("cuda", dtype).eval()
    x = torch.randn(1, 128, 512, device="cuda", dtype=dtype)
    with torch.no_grad():
        want = (mha(x, x, x, need_weights=False)[0], tel(x))
        with gt.patch():
            got = (mha(x, x, x, need_weights=False)[0], tel(x))
    name = "float16" if dtype == torch.float16 else "bfloat16"
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) < TOLERANCE[name]
    assert gt.stats()["built_here"] == 2


def test_compiled_model_under_patch_matches_torch(cached):
    torch._dynamo.reset()

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(512, 1536)

        def forward(self, x):  # noqa: ANN001
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 8, 64).unbind(2)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            return out.transpose(1, 2).reshape(b, s, 512)

    model = Block().to("cuda", torch.bfloat16).eval()
    x = torch.randn(2, 128, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        with gt.patch():
            got = torch.compile(model, fullgraph=True)(x)
    assert relative_error(got, want) < TOLERANCE["bfloat16"]
    assert gt.stats()["built_here"] == 1
    torch._dynamo.reset()


def masked_hit_without_sync(q, k, v, mask):  # noqa: ANN001, ANN201
    """The second masked call's answer: the first builds, checks and loads
    the bias graph; the second runs under sync_debug_mode('error')."""
    gt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return gt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("float_mask", [False, True], ids=["bool", "float"])
def test_masked_calls_are_bias_graph_hits_with_torchs_answer_and_no_host_sync(cached, float_mask):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, s, 64, device="cuda", dtype=torch.bfloat16, generator=g) for s in (96, 160, 160))
    mask = torch.rand(2, 1, 96, 160, device="cuda", generator=g) > 0.3
    mask[1, :, :, :80] = False  # left padding: the first 64-key tile hidden from every row
    mask[0, :, 5] = False  # a row that sees no key: torch's answer is 0
    if float_mask:
        mask = torch.where(mask, 0.0, float("-inf")).to(torch.bfloat16)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = masked_hit_without_sync(q, k, v, mask)
    assert gt.stats()["built_here"] == 2 and gt.stats()["fallbacks"] == {}, gt.stats()
    assert not got.isnan().any() and (got[0, :, 5] == 0).all()
    assert relative_error(got, want) < TOLERANCE["bfloat16"]
