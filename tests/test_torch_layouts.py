"""The strides real code hands torch's SDPA, served where they lie (issue 40,
item 1): the real modules (nn.MultiheadAttention, nn.TransformerEncoder,
transformers' gpt_bigcode), and timm's ViT attention by the same tensor
operations as timm 1.0.31's ``Attention.forward`` (timm itself does not
import beside this suite's CPU torch: scripts/bench/bench_timm_vit.py runs the real
one). Each is recorded at batch 1 (``record(max_batch=4)``), warmed into a
store with the CPU stand-in compiler, and served at batch 4 under
``patch()``: every call a hit, no tensor copied (``stats()["copies"]``), the
output torch's. Falcon's stride-0 heads: tests/test_manifest_models.py."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")

import torch.nn.functional as F  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest, ops  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    monkeypatch.delenv("GRAPHCACHE_SDPA_ON_MISS", raising=False)
    gt.reset()
    yield
    gt.reset()


def recorded_then_served(tmp_path, record, serve):  # noqa: ANN001, ANN201
    """Record ``record()`` widened to batch 4, warm it, serve ``serve()``
    from that store only: (stats, output, unpatched torch's output)."""
    path = tmp_path / "m.yaml"
    with torch.no_grad(), gt.record(path, shape_classes="pow2", max_batch=4):
        record()
    compiler = CpuGraphCompiler()
    cache = GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes="pow2")
    ops.warm(manifest.load(path), cache)
    gt.reset()
    gt.configure(cache, device="cpu", on_miss="torch")
    with torch.no_grad(), gt.patch():
        got = serve()
    stats = gt.stats()
    gt.reset()
    with torch.no_grad():
        want = serve()
    assert compiler.builds == 0 or compiler.loads > 0
    return stats, got, want


def all_served_without_copies(stats) -> None:  # noqa: ANN001
    assert stats["calls"] and stats["hits"] == stats["calls"], stats
    assert stats["copies"] == 0 and stats["copied"] == {}, stats


def close(got, want, tolerance: float = 3e-2) -> None:  # noqa: ANN001
    # bf16 through every layer: relative to the output's largest magnitude (tests/hf_models.ENCODER_TOLERANCE)
    assert float((got.float() - want.float()).abs().max()) <= tolerance * float(want.float().abs().max())


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "key_padding_mask"])
def test_multihead_attention_recorded_at_batch_1_is_served_at_batch_4(tmp_path, batch_first, padded):
    """Its q/k/v are (s, b*h, d) views of the in-projection: sequence-first
    (sbhd) at every batch, which the batch-1 call's strides already say."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(256, 4, batch_first=batch_first).eval().to(BF16)

    def x(b: int, s: int) -> torch.Tensor:
        return torch.randn((b, s, 256) if batch_first else (s, b, 256), dtype=BF16)

    def mask(b: int, s: int) -> torch.Tensor | None:
        if not padded:
            return None
        m = torch.zeros(b, s, dtype=torch.bool)
        m[-1, s - 5 :] = True  # the last sequence is 5 tokens shorter
        return m

    one, four, masks = x(1, 20), x(4, 30), (mask(1, 20), mask(4, 30))
    stats, got, want = recorded_then_served(
        tmp_path,
        lambda: mha(one, one, one, need_weights=False, key_padding_mask=masks[0]),
        lambda: mha(four, four, four, need_weights=False, key_padding_mask=masks[1])[0],
    )
    all_served_without_copies(stats)
    close(got, want)


def test_a_transformer_encoder_recorded_at_batch_1_is_served_at_batch_4(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 512, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval().to(BF16)
    one, four = torch.randn(1, 20, 256, dtype=BF16), torch.randn(4, 30, 256, dtype=BF16)
    stats, got, want = recorded_then_served(tmp_path, lambda: encoder(one), lambda: encoder(four))
    assert stats["calls"] == 2
    all_served_without_copies(stats)
    close(got, want)


class VitAttention(torch.nn.Module):
    """timm 1.0.31's ``timm.layers.attention.Attention.forward`` (fused_attn,
    no q/k norm, no gate), op for op."""

    def __init__(self, dim: int = 192, num_heads: int = 3) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = torch.nn.Linear(dim, dim * 3)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape  # noqa: N806 - timm's names
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


def test_timms_vit_attention_reads_q_k_v_from_the_fused_projection(tmp_path):
    torch.manual_seed(0)
    blocks = torch.nn.Sequential(VitAttention(), VitAttention()).eval().to(BF16)
    one, four = torch.randn(1, 197, 192, dtype=BF16), torch.randn(4, 197, 192, dtype=BF16)
    spec = gt.spec_for(*torch.randn(3, 4, 3, 197, 64, dtype=BF16).unbind(0))
    assert spec.layout == "bhsd"  # a contiguous (3, b, h, s, d) stack is not timm's: timm's is below
    stats, got, want = recorded_then_served(tmp_path, lambda: blocks(one), lambda: blocks(four))
    all_served_without_copies(stats)
    close(got, want)
    x = torch.randn(2, 197, 3 * 192, dtype=BF16).reshape(2, 197, 3, 3, 64).permute(2, 0, 3, 1, 4)
    assert gt.spec_for(*x.unbind(0)).layout == "bs[3]hd"


def test_gpt_bigcode_padded_batch_of_4_reads_its_fused_row_and_one_expanded_head(tmp_path):
    """StarCoder 1 (multi-query): q is a view of the fused c_attn row
    (bs[+2]hd: q's heads, then one key and one value head), k/v expanded
    over the heads with stride 0 in a padded batch: one real head (MQA)."""
    pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")
    from tests import hf_models

    found, builds = hf_models.served(
        "gpt_bigcode",
        "sdpa",
        tmp_path,
        CpuGraphCompiler(),
        hf_models.SMALL_SERVE,
        3,
        ("--max-batch", "4", "--max-seq", "256"),
        only=["padded batch of 4"],
    )
    (case,) = found
    assert builds == 0 and case.calls and case.hits == case.calls, case
    assert case.equal and case.copied == {}, case


def test_stride_0_heads_are_one_head_and_what_no_graph_reads_is_copied_and_counted(tmp_path):
    """Expanded k/v (Falcon's and gpt_bigcode's repeat over heads) are MQA;
    a head dim that is not contiguous (cuDNN's frontend takes stride 1 only)
    is copied once per call, counted by tensor and reason, never a fallback."""
    compiler = CpuGraphCompiler()
    cache = GraphCache(DiskStore(tmp_path / "store"), compiler)
    gt.configure(cache, device="cpu")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 9, 8, 32, generator=g).to(BF16).transpose(1, 2)
    one = torch.randn(2, 1, 9, 32, generator=g).to(BF16)
    k, v = one.expand(2, 8, 9, 32), (one + 1).expand(2, 8, 9, 32)
    derived = gt.derive.derive(q, k, v)
    assert derived.expanded and (derived.spec.heads_kv, derived.spec.layout) == (1, "bshd")
    cache.get(derived.spec)
    # torch's broadcast kernel and its one-head reading round bf16 differently (one ulp)
    ulp = dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gt.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), **ulp)
    wide = torch.randn(2, 8, 32, 9, generator=g).to(BF16).transpose(2, 3)  # (b, h, s, d) with d strided
    k = k.contiguous()
    spec = gt.spec_for(q, k, wide)
    assert (spec.layout, spec.layout_q, spec.layout_v) == ("bhsd", "bshd", None), "v is copied into k's layout"
    cache.get(spec)
    torch.testing.assert_close(
        gt.scaled_dot_product_attention(q, k, wide), F.scaled_dot_product_attention(q, k, wide), **ulp
    )
    stats = gt.stats()
    assert stats["hits"] == 2 and stats["fallbacks"] == {}
    assert stats["copies"] == 1 and stats["copied"] == {"v": {"head_dim_stride": 1}}
    assert math.isclose(spec.attn_scale, 32**-0.5)


def test_record_writes_each_tensors_layout_and_names_the_copies(tmp_path):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 9, 8, 32, generator=g).to(BF16).transpose(1, 2) for _ in range(2))
    v = torch.randn(2, 8, 32, 9, generator=g).to(BF16).transpose(2, 3)  # the head dim strided
    path = tmp_path / "m.yaml"
    with torch.no_grad(), gt.record(path, shape_classes="exact") as recorder:
        F.scaled_dot_product_attention(q, k, v)
    (spec,) = manifest.load(path)
    assert (spec.layout, spec.layout_v) == ("bshd", None), "v is recorded in the layout it is copied into"
    assert recorder.copied == {("v", "head_dim_stride"): 1}
    assert "#   v head_dim_stride: 1 call(s)" in path.read_text()
