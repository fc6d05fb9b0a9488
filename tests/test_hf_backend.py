"""graphcache.hf: the "graphcache" attention backend for Hugging Face
transformers. Each attention call is checked against transformers' own
sdpa (given transformers' own 4-D mask for the same padding and pattern),
served from graphs of a CPU stand-in compiler that executes them."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="graphcache.hf needs torch (pip install '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    bidirectional_mask_function,
    causal_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward  # noqa: E402, F401 - Layer's eager

import graphcache.hf  # noqa: E402
import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache  # noqa: E402
from graphcache.errors import UnsupportedVersion  # noqa: E402
from graphcache.hf.backend import attention  # noqa: E402
from graphcache.hf.masks import PADDING_ATTR, padding_mask  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.fakes import FakeCompiler  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

B, HQ, HKV, D = 3, 8, 2, 32


class Layer(torch.nn.Module):
    """What transformers' attention functions read off a model's attention
    layer; its module's ``eager_attention_forward`` (Gemma 2's, which caps
    scores) is the eager attention the backend falls back to."""

    def __init__(self, causal: bool = True) -> None:
        super().__init__()
        self.is_causal = causal
        self.num_key_value_groups = HQ // HKV
        self.head_dim = D
        self.training = False


@pytest.fixture(autouse=True)
def served(tmp_path):
    gt.reset()
    gt.configure(GraphCache(DiskStore(tmp_path / "store"), CpuGraphCompiler()), device="cpu", on_miss="build")
    yield
    gt.reset()


def qkv(b: int, sq: int, skv: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    # As models hand them over: q a transposed (b, s, h, d) projection, k/v contiguous cache tensors.
    q = torch.randn((b, sq, HQ, D), generator=gen).to(torch.bfloat16).transpose(1, 2)
    k = torch.randn((b, HKV, skv, D), generator=gen).to(torch.bfloat16)
    v = torch.randn((b, HKV, skv, D), generator=gen).to(torch.bfloat16)
    return q, k, v


def tokens(lengths: list[int], total: int, left: bool) -> torch.Tensor:
    pad = torch.zeros((len(lengths), total), dtype=torch.bool)
    for row, n in enumerate(lengths):
        pad[row, total - n :] = True if left else False
        if not left:
            pad[row, :n] = True
    return pad


def torch_answer(layer, q, k, v, pad, pattern=causal_mask_function, **kwargs):  # noqa: ANN001, ANN003
    """transformers' sdpa with transformers' own 4-D mask for this padding."""
    sq, skv = q.shape[2], k.shape[2]
    mask = sdpa_mask(
        batch_size=q.shape[0],
        q_length=sq,
        kv_length=skv,
        q_offset=skv - sq,
        mask_function=pattern,
        attention_mask=pad,
        allow_is_causal_skip=False,
    )
    return sdpa_attention_forward(layer, q, k, v, mask, **kwargs)[0]


def ours(layer, q, k, v, pad, pattern=causal_mask_function, **kwargs):  # noqa: ANN001, ANN003
    """The backend's answer, with the mask transformers would hand it."""
    sq, skv = q.shape[2], k.shape[2]
    mask = padding_mask(q.shape[0], sq, skv, skv - sq, 0, pattern, pad)
    return attention(layer, q, k, v, mask, **kwargs)[0]


def assert_close_on(rows: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal (bf16 rounding) on the query rows that are tokens."""
    keep = rows.view(*rows.shape, *[1] * (got.dim() - 2)).expand_as(got)
    torch.testing.assert_close(got[keep].float(), want[keep].float(), atol=2e-2, rtol=2e-2)


def hits() -> int:
    return gt.stats()["built_here"]


def tiny_llama(attn: str):  # noqa: ANN201
    """A 2-layer Llama (hidden 256, GQA 8/2) from its config, bf16, seeded."""
    graphcache.hf.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval().to(torch.bfloat16)


def test_importing_graphcache_hf_imports_neither_transformers_nor_torch():
    code = "import sys, graphcache.hf; assert not {'transformers', 'torch'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unsupported_transformers_release_is_refused_naming_both_versions(monkeypatch):
    graphcache.hf.check_version("5.24.0")
    with pytest.raises(UnsupportedVersion, match=r"transformers >=5\.24,<6 .*found 4\.57\.1"):
        graphcache.hf.check_version("4.57.1")
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "6.0.0")  # what register() imports
    with pytest.raises(UnsupportedVersion, match="found 6.0.0"):
        graphcache.hf.register()


def test_left_padded_prefill_and_decode_are_one_ragged_graph_each():
    layer, pad = Layer(), tokens([20, 7, 13], 20, left=True)
    q, k, v = qkv(B, 20, 20)
    assert_close_on(pad, ours(layer, q, k, v, pad), torch_answer(layer, q, k, v, pad))
    q, k, v = qkv(B, 1, 21, seed=1)
    step = torch.cat([pad, torch.ones((B, 1), dtype=torch.bool)], dim=1)
    assert_close_on(step[:, -1:], ours(layer, q, k, v, step), torch_answer(layer, q, k, v, step))
    assert hits() == 2 and gt.stats()["fallbacks"] == {}
    assert {s.layout for s in gt.RUNTIME._graphs} == {"thd"}


def test_right_padded_causal_prompt_is_a_padded_dense_graph():
    layer, pad = Layer(), tokens([16, 5, 11], 16, left=False)
    q, k, v = qkv(B, 16, 16)
    assert_close_on(pad, ours(layer, q, k, v, pad), torch_answer(layer, q, k, v, pad))
    assert hits() == 1
    [spec] = gt.RUNTIME._graphs
    assert spec.padding and spec.mask == "causal" and spec.layout != "thd"


@pytest.mark.parametrize(
    ("left", "causal", "sq"),
    [(False, True, 16), (True, True, 16), (True, True, 1), (False, False, 16), (True, False, 16)],
    ids=["right-padded prompt", "left-padded prompt", "left-padded decode", "right-padded encoder", "left encoder"],
)
def test_every_row_of_a_padded_call_is_transformers_answer_padded_rows_included(left, causal, sq):
    """transformers' sdpa gives a padded query row what its 4-D mask lets
    it see (issue 33, item 6a): on the right of a causal prompt, every real
    token of its sequence (the keys up to its own position that are tokens);
    on the left, nothing, which torch's SDPA answers with 0; in an encoder,
    every real token. The backend's graphs give the same, on every row."""
    pattern = causal_mask_function if causal else bidirectional_mask_function
    layer, pad = Layer(causal=causal), tokens([16, 5, 11], 16, left=left)
    if sq == 1:
        pad = torch.cat([pad, torch.ones((B, 1), dtype=torch.bool)], dim=1)
    q, k, v = qkv(B, sq, pad.shape[1])
    got = ours(layer, q, k, v, pad, pattern)
    want = torch_answer(layer, q, k, v, pad, pattern)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert hits() == 1 and gt.stats()["fallbacks"] == {}


class NanRowsCompiler(CpuGraphCompiler):
    """Stands in for a cuDNN thd plan on the query rows that see no key,
    where cuDNN promises nothing (a softmax over nothing): its graphs write
    NaN there (the rows the reference answers with zeros)."""

    def load(self, artifact):  # noqa: ANN001, ANN201
        graph = super().load(artifact)
        real = graph.run_varlen

        def run_varlen(q, k, v, *rest):  # noqa: ANN001, ANN002, ANN202
            out, lse = real(q, k, v, *rest)
            return out.masked_fill((out == 0).all(-1, keepdim=True), float("nan")), lse

        graph.run_varlen = run_varlen
        return graph


def test_the_padded_rows_of_a_left_padded_prompt_are_zero_whatever_the_graph_wrote_there(tmp_path):
    gt.configure(GraphCache(DiskStore(tmp_path / "nan"), NanRowsCompiler()), device="cpu", on_miss="build")
    layer, pad = Layer(), tokens([16, 5, 11], 16, left=True)
    q, k, v = qkv(B, 16, 16)
    got = ours(layer, q, k, v, pad)
    assert hits() == 1 and not got.isnan().any()
    torch.testing.assert_close(got.float(), torch_answer(layer, q, k, v, pad).float(), atol=2e-2, rtol=2e-2)


def test_padded_encoder_and_cross_attention_are_ragged_graphs():
    pad = tokens([16, 5, 11], 16, left=False)
    q, k, v = qkv(B, 16, 16)
    every = torch.ones((B, 16), dtype=torch.bool)
    encoder = Layer(causal=False)
    assert_close_on(every, ours(encoder, q, k, v, pad, bidirectional_mask_function),
                    torch_answer(encoder, q, k, v, pad, bidirectional_mask_function))  # fmt: skip
    q = qkv(B, 1, 16, seed=2)[0]  # a decoder query against the padded encoder's keys
    one = torch.ones((B, 1), dtype=torch.bool)
    assert_close_on(one, ours(encoder, q, k, v, pad, bidirectional_mask_function),
                    torch_answer(encoder, q, k, v, pad, bidirectional_mask_function))  # fmt: skip
    assert hits() == 2 and gt.stats()["fallbacks"] == {}


def test_a_sliding_window_in_reach_is_a_window_graph_and_a_continued_prompt_a_bottom_right_ragged_one():
    layer, every = Layer(), torch.ones((1, 40), dtype=torch.bool)
    q, k, v = qkv(1, 40, 40)
    window = sliding_window_causal_mask_function(16)
    got = ours(layer, q, k, v, every, window, sliding_window=16)
    assert_close_on(every, got, torch_answer(layer, q, k, v, every, window))
    q = qkv(1, 8, 40, seed=3)[0]  # 8 new tokens on a 32-token cache
    assert_close_on(every[:, :8], ours(layer, q, k, v, every), torch_answer(layer, q, k, v, every))
    assert hits() == 2
    assert {(s.layout, s.mask, s.window_left) for s in gt.RUNTIME._graphs} == {
        ("bhsd", "sliding_window", 15),  # a query sees 16 positions: its own and 15 before
        ("thd", "causal_bottom_right", None),
    }


def test_what_no_graph_expresses_falls_back_under_a_named_reason():
    layer, every = Layer(), torch.ones((1, 12), dtype=torch.bool)
    q, k, v = qkv(1, 12, 12)
    want = torch_answer(layer, q, k, v, every)
    capped = ours(layer, q, k, v, every, softcap=50.0)  # the layer's own eager, which caps the scores
    assert_close_on(every, capped, want)  # scores far below the cap: capping changes little
    q2, k2, v2 = qkv(2, 12, 12)  # sinks on a left-padded batch: no sink graph takes a padding mask
    ours(layer, q2, k2, v2, tokens([7, 12], 12, left=True), s_aux=torch.zeros(HQ))
    assert gt.stats()["fallbacks"] == {"softcap": 1, "sinks": 1} and hits() == 0


def sdpa_reads() -> set[str]:
    """The arguments the installed transformers' sdpa_attention_forward reads
    beyond (module, query, key, value): its named parameters and the names
    it looks up in its **kwargs, read from its source."""
    import ast
    import inspect
    import textwrap

    signature = inspect.signature(sdpa_attention_forward)
    named = {n for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD}
    tree = ast.parse(textwrap.dedent(inspect.getsource(sdpa_attention_forward)))
    looked_up = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
            if isinstance(target, ast.Name) and target.id == "kwargs" and isinstance(node.args[0], ast.Constant):
                looked_up.add(node.args[0].value)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "kwargs":
            looked_up.add(ast.literal_eval(node.slice))
    return (named | looked_up) - {"module", "query", "key", "value"}


def test_the_backend_reads_exactly_the_arguments_transformers_sdpa_reads():
    from graphcache.hf.backend import BACKEND_ARGUMENTS, SDPA_ARGUMENTS

    assert set(SDPA_ARGUMENTS) == sdpa_reads()
    assert not set(BACKEND_ARGUMENTS) & set(SDPA_ARGUMENTS)


@pytest.mark.parametrize(
    "ignored",
    [
        {"deterministic": True},  # ModernBERT, every call
        {"output_attentions": False},
        {"cu_seq_lens_q": torch.tensor([0, 12]), "max_length_q": 12},
        {"position_ids": torch.arange(12).view(1, 12), "cache_position": torch.arange(12)},
    ],
    ids=["deterministic", "output_attentions-false", "cu_seq_lens", "positions"],
)
def test_arguments_transformers_sdpa_ignores_are_ignored_and_the_call_is_served(ignored):
    layer, every = Layer(), torch.ones((1, 12), dtype=torch.bool)
    q, k, v = qkv(1, 12, 12)
    got = ours(layer, q, k, v, every, **ignored)
    assert_close_on(every, got, torch_answer(layer, q, k, v, every, **ignored))
    assert hits() == 1 and gt.stats()["fallbacks"] == {}


def test_output_attentions_returns_the_weights_eager_computes():
    layer = Layer()
    q, k, v = qkv(1, 12, 12)
    out, weights = attention(layer, q, k, v, None, output_attentions=True)
    mask = torch.zeros((1, 1, 12, 12), dtype=q.dtype).masked_fill(
        ~torch.ones((12, 12), dtype=torch.bool).tril(), torch.finfo(q.dtype).min
    )
    want_out, want_weights = eager_attention_forward(layer, q, k, v, mask, scaling=D**-0.5)
    assert weights is not None and weights.shape == (1, HQ, 12, 12)
    torch.testing.assert_close(weights, want_weights)
    torch.testing.assert_close(out, want_out)
    assert gt.stats()["fallbacks"] == {"output_attentions": 1}


def test_padding_with_holes_and_custom_patterns_get_transformers_own_4d_mask():
    left = tokens([5, 8], 8, left=True)
    assert padding_mask(2, 8, 8, 0, 0, causal_mask_function, torch.ones((2, 8), dtype=torch.bool)) is None
    assert getattr(padding_mask(2, 8, 8, 0, 0, causal_mask_function, left), PADDING_ATTR) == "left"
    holes = left.clone()
    holes[1, 4] = False
    assert padding_mask(2, 8, 8, 0, 0, causal_mask_function, holes).dim() == 4
    assert padding_mask(2, 8, 8, 0, 0, causal_mask_function, left, use_vmap=True).dim() == 4
    layer = Layer()
    q, k, v = qkv(2, 8, 8)
    assert_close_on(holes, ours(layer, q, k, v, holes), torch_answer(layer, q, k, v, holes))
    assert gt.stats()["calls"] == 1  # the drop-in counted it (a bias graph, or torch under "mask")


def test_a_model_built_with_attn_implementation_graphcache_is_served_and_recorded(tmp_path):
    model = tiny_llama("graphcache")
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = tokens([12, 7], 12, left=True).long()
    with torch.no_grad(), gt.record(tmp_path / "m.yaml") as recorder:
        got = model(ids, attention_mask=mask).logits
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        want = model(ids, attention_mask=mask).logits
    assert_close_on(mask.bool(), got, want)
    assert gt.stats()["built_here"] == 2 and gt.stats()["calls"] == 2
    assert {s.layout for s in recorder.specs} == {"thd"} and "layout: thd" in (tmp_path / "m.yaml").read_text()


class ZeroGraph:
    """Stands in for a loaded cuDNN graph where only the backend's own work
    is watched: returns zeros of the output's shape, reading no value."""

    backend = "zeros"

    def __init__(self, spec) -> None:  # noqa: ANN001
        self.spec = spec

    def run_varlen(self, q, k, v, *rest):  # noqa: ANN001, ANN002
        return q.new_zeros((q.shape[0], q.shape[1], v.shape[-1])), None

    def execute(self, q, k, v, **lengths):  # noqa: ANN001, ANN003
        return torch.zeros_like(q)


class ZeroCompiler(FakeCompiler):
    def load(self, artifact):  # noqa: ANN001, ANN201
        super().load(artifact)
        return ZeroGraph(artifact.spec)


def test_padded_calls_read_no_tensor_value_on_the_host(tmp_path, monkeypatch):
    gt.configure(GraphCache(DiskStore(tmp_path / "zeros"), ZeroCompiler()), device="cpu", on_miss="build")
    layer = Layer()
    left, right = tokens([20, 7, 13], 20, left=True), tokens([20, 7, 13], 20, left=False)
    masks = [
        padding_mask(B, 20, 20, 0, 0, causal_mask_function, m) for m in (left, right)
    ]  # one read each, per forward
    step = padding_mask(
        B, 1, 21, 20, 0, causal_mask_function, torch.cat([left, torch.ones((B, 1), dtype=torch.bool)], 1)
    )

    def synced(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("a tensor value was read on the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, synced)
    for mask in masks:
        q, k, v = qkv(B, 20, 20)
        attention(layer, q, k, v, mask)
    q, k, v = qkv(B, 1, 21)
    attention(layer, q, k, v, step)
    monkeypatch.undo()
    assert gt.stats()["built_here"] == 3 and {s.layout for s in gt.RUNTIME._graphs} >= {"thd"}


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (transformers.Gemma2Config, "softcap"),  # attention softcapping: transformers' sdpa refuses these models
        (transformers.GptOssConfig, "sinks"),  # attention sinks (s_aux): served, see the sink tests below
    ],
)
def test_softcap_and_sink_models_run_with_eagers_logits_under_a_named_reason(config, reason):
    graphcache.hf.register()
    torch.manual_seed(0)
    # A cap of 0.02 changes the (small) scores of a random model; Gemma 2's default of 50 would not.
    extra = (
        {"attn_logit_softcapping": 0.02} if reason == "softcap" else {"num_local_experts": 4, "num_experts_per_tok": 2}
    )
    cfg = config(
        vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=32, sliding_window=16, pad_token_id=0, **extra,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval().to(torch.bfloat16)
    ids = torch.randint(1, 64, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
        model.set_attn_implementation("graphcache")
        got = model(ids).logits
    if reason == "sinks":  # sink graphs serve both layers (the float32 reference executes them here)
        torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
        assert gt.stats()["fallbacks"] == {} and hits() == 2
        return
    assert torch.equal(want, got)
    assert gt.stats()["fallbacks"] == {reason: 2} and gt.stats()["calls"] == 2


@pytest.mark.parametrize(
    ("sq", "skv", "window", "extra"),
    [(20, 20, None, {}), (20, 20, 8, {}), (1, 30, None, {}), (1, 30, 8, {}), (20, 20, 8, {"output_attentions": False})],
)
def test_sinks_are_a_sink_graph_with_gpt_oss_eagers_answer(sq, skv, window, extra):
    """A causal prompt (a window in reach or not) and a decode step (past
    its window too: its last ``window`` keys) against gpt-oss's own eager."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

    layer = Layer()
    layer.sinks = torch.randn(HQ, generator=torch.Generator().manual_seed(1)).mul(2).to(torch.bfloat16)
    q, k, v = qkv(1, sq, skv)
    got = attention(layer, q, k, v, None, scaling=D**-0.5, sliding_window=window, s_aux=layer.sinks, **extra)[0]
    i = torch.arange(skv - sq, skv).view(-1, 1)
    j = torch.arange(skv).view(1, -1)
    seen = (j <= i) & ((j > i - window) if window is not None else True)
    mask = torch.zeros(sq, skv).masked_fill(~seen, float("-inf")).view(1, 1, sq, skv).to(torch.bfloat16)
    want = gpt_oss_eager(layer, q, k, v, mask, scaling=D**-0.5)[0]
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert hits() == 1 and gt.stats()["fallbacks"] == {}


def test_a_sink_that_requires_grad_gets_its_gradient_after_a_no_grad_call_of_the_same_shapes():
    """The dense path's plan for a call shape is made once; whether the
    call needs gradients is read per call (issue 33, item 5)."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

    cfg = transformers.GptOssConfig(hidden_size=256, num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D)
    layer = GptOssAttention(cfg, layer_idx=1).eval().to(torch.bfloat16)  # its eager is gpt-oss's, which takes sinks
    layer.requires_grad_(False).sinks.requires_grad_(True)  # only the sinks are trained
    with torch.no_grad():
        layer.sinks.copy_(torch.randn(HQ, generator=torch.Generator().manual_seed(1)))
    q, k, v = qkv(1, 20, 20)
    with torch.no_grad():
        attention(layer, q, k, v, None, scaling=D**-0.5, s_aux=layer.sinks)
    assert hits() == 1
    attention(layer, q, k, v, None, scaling=D**-0.5, s_aux=layer.sinks)[0].float().sum().backward()
    mask = torch.zeros(20, 20).masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
    want = gpt_oss_eager(layer, q, k, v, mask.view(1, 1, 20, 20).to(torch.bfloat16), scaling=D**-0.5)[0]
    (grad,) = torch.autograd.grad(want.float().sum(), layer.sinks)
    assert layer.sinks.grad is not None and torch.equal(layer.sinks.grad, grad)
    assert hits() == 1 and gt.stats()["fallbacks"] == {"autograd": 1}


def test_a_static_cache_keys_past_the_tokens_seen_are_masked_not_attended():
    # A StaticCache hands attention every slot of the cache; only a mask
    # leaves out those not written yet, so the backend is handed one (through
    # the drop-in) and never guesses an alignment over the empty slots.
    model = tiny_llama("sdpa")
    ids = torch.randint(1, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    run = dict(max_new_tokens=3, do_sample=False, cache_implementation="static", output_logits=True)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), return_dict_in_generate=True, **run)
        model.set_attn_implementation("graphcache")
        got = model.generate(ids, attention_mask=torch.ones_like(ids), return_dict_in_generate=True, **run)
    for w, g in zip(want.logits, got.logits, strict=True):
        torch.testing.assert_close(g.float(), w.float(), atol=2e-2, rtol=2e-2)
    stats = gt.stats()
    assert stats["calls"] == 2 * 3 and stats["built_here"] + stats["fallbacks"].get("mask", 0) == stats["calls"]


def test_a_static_caches_mask_without_an_attention_mask_is_made_on_the_models_device():
    # transformers hands the mask interface the model's device; with an int offset and no attention
    # mask nothing else says it (the meta device stands in for a GPU: never this CPU's).
    from transformers.masking_utils import causal_mask_function

    from graphcache.hf.masks import LENGTHS_ATTR

    mask = padding_mask(2, 3, 16, 5, 0, causal_mask_function, None, device=torch.device("meta"))
    assert getattr(mask, PADDING_ATTR) == "static"
    assert mask.device.type == "meta" and getattr(mask, LENGTHS_ATTR).device.type == "meta"
