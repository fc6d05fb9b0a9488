"""``graphcache manifest --method config``: the offline reader of the
families it knows (issue 26, item 3), read back by warm and warm --check.
The default, the model traced (issue 32), is tests/test_models_trace.py's;
there the traced manifest is also held to cover every spec this reader writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphcache import GraphCache, ManifestError, manifest, ops
from graphcache.models.config import describe, read
from graphcache.models.specs import specs_for
from graphcache.spec import GraphSpec
from graphcache.stores import DiskStore
from tests.clirun import cli
from tests.fakes import TARGET, FakeCompiler

CONFIGS = Path(__file__).parent.parent / "docs" / "examples" / "configs"
BIAS = "bias" in GraphSpec.field_names()


def write(tmp_path: Path, **config) -> Path:  # noqa: ANN003
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def llama(**changes) -> dict:  # noqa: ANN003
    base = dict(
        model_type="llama",
        hidden_size=256,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=2,
    )
    return {**base, **changes}


def test_llama_3_8b_lists_prefill_and_decode_per_batch_and_length_class(tmp_path):
    out = tmp_path / "m.yaml"
    run = cli(
        "manifest", str(CONFIGS / "llama-3-8b"), "--max-batch", "64", "--max-seq", "8192", "--method", "config",
        "-o", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    specs = manifest.load(out)
    plain = [s for s in specs if getattr(s, "bias", None) is None]
    # 7 batch classes (1..64) x 7 length classes (128..8192), prefill and decode.
    assert len(plain) == 2 * 7 * 7
    assert len(specs) == 98 + (6 * 14 if BIAS else 0)  # padded batches (> 1) as bias graphs on route sdpa
    assert {(s.heads_q, s.heads_kv, s.head_dim, s.dtype, s.layout) for s in plain} == {(32, 8, 128, "bfloat16", "bhsd")}
    # With a mask tensor transformers' sdpa repeats the KV heads (no enable_gqa): prefill bias graphs are
    # MHA; a decode step's query heads packed into rows are folded back into the GQA decode step.
    bias = {(s.seq_q == 1, s.heads_kv) for s in specs if s not in plain}
    assert bias == ({(False, 32), (True, 8)} if BIAS else set())
    assert {s.mask for s in plain if s.seq_q > 1} == {"causal"} and {s.mask for s in plain if s.seq_q == 1} == {"none"}
    assert all(s.is_class for s in specs)
    assert f"{len(specs)} graph(s) for llama on route sdpa, cold build ~" in run.stdout
    text = out.read_text()
    assert "# decoder layers 0-31 (causal): prefill\n" in text
    assert f"cold build ~{len(specs) * 0.4:.1f} s at 0.4 s per graph" in text


def test_mistral_sliding_window_on_each_route(tmp_path):
    model = describe(read(CONFIGS / "mistral-7b-v0.1"))
    (attention,) = model.attentions
    assert attention.window == 4096 and attention.layers == tuple(range(32))
    sdpa = specs_for(model, max_batch=1, max_seq=8192).users
    # transformers masks a window from kv >= window on: prompts of 4096 tokens and more get a mask tensor.
    plain = {s.seq_kv for s in sdpa if getattr(s, "bias", None) is None and s.seq_q > 1}
    assert plain == {128, 256, 512, 1024, 2048, 4096}
    assert {s.seq_kv for s in sdpa if getattr(s, "bias", None) and s.seq_q > 1} == {4096, 8192}
    # A sliding layer's cache holds its window: no decode step has more keys than 4096.
    assert max(s.seq_kv for s in sdpa if s.seq_q == 1) == 4096
    ragged = specs_for(model, max_batch=1, max_seq=8192, route="graphcache").users
    assert not [s for s in ragged if s.layout == "thd"]  # unpadded, no chunks: dense only
    # A prompt past the window, unpadded, is a dense sliding_window graph there.
    dense = {(s.seq_q, s.mask, s.window_left, s.window_right) for s in ragged if s.seq_kv == 8192}
    assert dense == {(8192, "sliding_window", 4095, 0)}
    padded = specs_for(model, max_batch=2, max_seq=8192, route="graphcache").users
    windows = {(s.seq_q, s.seq_kv, s.mask, s.window_left) for s in padded if s.layout == "thd" and s.window_left}
    assert windows == {(8192, 8192, "sliding_window_bottom_right", 4095)}  # a padded prompt past the window


def test_gemma3_layer_types_give_one_family_per_window(tmp_path):
    config = dict(
        model_type="gemma3",
        text_config=dict(
            hidden_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            num_hidden_layers=6,
            sliding_window=512,
            query_pre_attn_scalar=64,
        ),
    )
    model = describe(config)
    by_window = {a.window: a.layers for a in model.attentions}
    assert by_window == {512: (0, 1, 2, 3, 4), None: (5,)}
    assert {a.scale for a in model.attentions} == {64**-0.5}


def seq2seq(model_type: str, heads: int, **extra) -> tuple[dict, list[GraphSpec]]:  # noqa: ANN003
    """An encoder-decoder's specs at batch 1, and those of its encoder."""
    max_seq = extra.pop("max_seq", 256)
    config = dict(model_type=model_type, encoder_attention_heads=heads, decoder_attention_heads=heads, **extra)
    specs = specs_for(describe(config), max_batch=1, max_seq=max_seq).users
    return specs, [s for s, us in specs.items() if us[0].startswith("encoder")]


def test_bart_has_encoder_decoder_and_cross_attention(tmp_path):
    specs, encoder = seq2seq("bart", 4, d_model=256, encoder_layers=2, decoder_layers=3)
    users = {u.split(":")[0] for us in specs.values() for u in us}
    assert users == {
        "encoder layers 0-1 (bidirectional)",
        "decoder layers 0-2 (causal)",
        "decoder cross-attention, layers 0-2 (bidirectional)",
    }
    assert {(s.layout, s.mask, s.seq_q, s.seq_kv) for s in encoder} == {
        ("bshd", "none", 128, 128),
        ("bshd", "none", 256, 256),
    }


@pytest.mark.parametrize("route", ["sdpa", "graphcache"])
def test_t5_is_bias_graphs_of_scale_one_with_the_bias_dims_the_drop_in_derives(route):
    config = dict(model_type="t5", d_model=512, d_kv=64, num_heads=8, num_layers=6, num_decoder_layers=4)
    users = specs_for(describe(config), max_batch=2, max_seq=256, route=route).users
    assert {(s.heads_q, s.heads_kv, s.head_dim, s.attn_scale, s.mask) for s in users} == {(8, 8, 64, 1.0, "none")}
    layers = {u.split(":")[0] for us in users.values() for u in us}
    assert layers == {
        "encoder layers 0-5 (bidirectional)",
        "decoder layers 0-3 (causal)",
        "decoder cross-attention, layers 0-3 (bidirectional)",
    }

    def kinds(phase: str, batch: int) -> set[tuple[str, str]]:
        return {(s.layout, s.bias) for s, us in users.items() if s.batch == batch and any(phase in u for u in us)}

    # Batch 1: every bias is bhss; above it the position bias alone (1hss), and
    # with the encoder's padding (its own calls, cross-attention) bhss too.
    assert kinds("(bidirectional): encoder", 1) == {("bshd", "bhss")}
    assert kinds("(bidirectional): encoder", 2) == {("bshd", "1hss"), ("bshd", "bhss")}
    assert kinds("(causal): decode", 2) == {("bhsd", "1hss")}
    assert kinds("(causal): first decode step", 2) == {("bshd", "1hss")}
    assert kinds("(causal): prefill", 2) == {("bhsd", "1hss")}
    assert kinds("cross-attention, layers 0-3 (bidirectional): decode", 2) == {("bhsd", "1hss"), ("bhsd", "bhss")}


def test_whisper_encoder_length_is_fixed(tmp_path):
    whisper = dict(d_model=384, encoder_layers=4, decoder_layers=4, max_source_positions=1500, max_target_positions=448)
    specs, encoder = seq2seq("whisper", 6, max_seq=8192, **whisper)
    # Whisper scales q in its projection (scaling 1.0) and hands the attention contiguous tensors.
    assert [(s.seq_q, s.seq_kv, s.layout, s.attn_scale) for s in encoder] == [(2048, 2048, "bhsd", 1.0)]
    assert max(s.seq_q for s in specs if s not in encoder) == 512  # the decoder's 448 tokens


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (llama(model_type="gemma2", attn_logit_softcapping=50.0, head_dim=64), "attn_logit_softcapping"),
        ({"model_type": "t5", "d_model": 512, "d_kv": 64, "num_layers": 6}, "num_heads is missing"),
        ({"model_type": "mamba"}, "model_type 'mamba' is not a family"),
        ({"num_attention_heads": 8}, "model_type is missing"),
        (llama(num_attention_heads=None), "num_attention_heads is missing"),
        (llama(layer_types=["full_attention", "chunked_attention"]), "chunked_attention"),
        (llama(model_type="gpt2", n_head=4, n_embd=256, n_layer=2, scale_attn_by_inverse_layer_idx=True), "per layer"),
    ],
    ids=["gemma2-softcap", "t5", "unknown", "no-model-type", "missing-field", "layer-type", "gpt2-layer-scale"],
)
def test_what_cannot_be_described_is_refused_naming_it(tmp_path, config, named):
    path = write(tmp_path, **config)
    with pytest.raises(ManifestError, match=named):
        describe(read(path), str(path))
    run = cli("manifest", str(path), "--max-batch", "1", "--max-seq", "128", "--method", "config")
    assert run.returncode != 0 and "error:" in run.stderr and named in run.stderr and not run.stdout


def test_a_folder_without_config_json_or_bad_json_is_named(tmp_path):
    with pytest.raises(ManifestError, match="no config.json"):
        read(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(ManifestError, match=r"config.json:1:2: not valid JSON"):
        read(tmp_path)


def test_warm_builds_and_warm_check_accepts_the_manifest(tmp_path):
    out = tmp_path / "m.yaml"
    path = write(tmp_path, **llama())
    # --method config, this file's reader: the default (the model traced, ~10 s of
    # transformers in the subprocess) is warmed and served from in
    # tests/test_manifest_models.py.
    run = cli(
        "manifest", str(path), "--max-batch", "2", "--max-seq", "256", "--route", "graphcache", "--method", "config",
        "-o", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    specs = manifest.load(out)
    assert specs and "--method config" in out.read_text()
    store = DiskStore(tmp_path / "store")
    rows = ops.warm(specs, GraphCache(store, FakeCompiler(), shape_classes="pow2"))
    assert {r.status for r in rows} == {"built"} and len(rows) == len(specs)
    check = cli("warm", str(out), "--check", "--target", str(TARGET), env={"GRAPHCACHE_DIR": str(tmp_path / "store")})
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(specs)}/{len(specs)} present" in check.stdout


def test_decode_and_chunk_options(tmp_path):
    model = describe(llama())
    without = specs_for(model, max_batch=1, max_seq=512, decode=False).users
    assert all(s.seq_q > 1 for s in without) and len(without) == 3
    chunked = specs_for(model, max_batch=1, max_seq=512, route="graphcache", chunk=128).users
    assert {(s.seq_q, s.seq_kv, s.mask) for s in chunked if s.layout == "thd"} == {
        (128, 256, "causal_bottom_right"),
        (128, 512, "causal_bottom_right"),
    }
