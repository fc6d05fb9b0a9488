"""``graphcache manifest``'s default (issue 32): the model traced from its
config by the installed transformers on the meta device, through either
route, as the attention calls it makes; refusals by feature. The serving
measure (warmed only from the traced manifest) is test_manifest_models.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the tracer needs torch (pip install '.[hf]')")
transformers = pytest.importorskip("transformers", reason="the tracer needs transformers (pip install '.[hf]')")

from graphcache import ManifestError, manifest  # noqa: E402
from graphcache.models.config import describe  # noqa: E402
from graphcache.models.scenarios import Sizes  # noqa: E402
from graphcache.models.specs import ROUTES, specs_for  # noqa: E402
from graphcache.models.trace import trace  # noqa: E402
from tests import hf_models  # noqa: E402
from tests.clirun import cli  # noqa: E402

CONFIGS = Path(__file__).parent.parent / "docs" / "examples" / "configs"
FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "gemma", "gemma3_text", "gpt2",
    "bart", "mbart", "whisper", "t5", "mt5",
)  # fmt: skip


def data(name: str, **changes: object) -> dict:
    """A small config of ``name`` as its config.json would hold it."""
    out = hf_models.config(name).to_dict()
    out.update(model_type=name, **changes)
    return out


def covered(spec, pool) -> bool:  # noqa: ANN001
    return any(p == spec or (p.is_class and p.covers(spec)) for p in pool)


# One route each, alternating (the suite's time budget): each route is traced
# for seven families, decoders and encoder-decoders on both; the serving table
# over both routes is scripts/bench/bench_hf_models.py --from-config's.
@pytest.mark.parametrize(("name", "route"), [(name, ROUTES[i % len(ROUTES)]) for i, name in enumerate(FAMILIES)])
def test_the_traced_manifest_covers_every_spec_the_config_reader_writes(name, route):
    """The offline reader stays (no torch: --method config), held to what the
    model itself calls: every spec it lists, the traced model calls too."""
    config = data(name)
    # What the reader lists: the default cache, eager code (the static cache and compiled code are the trace's own).
    traced = trace(config, name, Sizes(2, 256, caches=("dynamic",), compiled=False), route)
    read = specs_for(describe(config), max_batch=2, max_seq=256, route=route).users
    missing = [s.summary() for s in read if not covered(s, traced.specs.users)]
    assert not missing, missing
    assert traced.kind == ("encoder-decoder" if name in ("bart", "mbart", "whisper", "t5", "mt5") else "decoder")


def test_llama_3_8b_traced_as_the_reader_lists_it_plus_right_padded_prompts():
    config = json.loads((CONFIGS / "llama-3-8b" / "config.json").read_text())
    for route in ROUTES:
        traced = trace(config, "llama-3-8b", Sizes(8, 1024, caches=("dynamic",), compiled=False), route)
        read = set(specs_for(describe(config), max_batch=8, max_seq=1024, route=route).users)
        got = set(traced.specs.users)
        assert read <= got
        # What the reader leaves out: a right-padded prompt (route graphcache: a padded dense graph).
        extra = {tuple(sorted({p.split(": ")[1] for p in traced.specs.users[s]})) for s in got - read}
        assert extra <= {("prefill, right-padded",), ("prefill, right-padded, no cache",)}, extra
        assert traced.layers.startswith("cut to the prefix") and "(layers: 1 of 32)" in traced.layers
        users = {u for us in traced.specs.users.values() for u in us}
        assert "layers 0-31 self_attn: decode" in users


def test_a_stack_of_two_kinds_of_layers_is_cut_to_a_prefix_that_calls_as_the_whole_model():
    # Gemma 3: five sliding-window layers, then a full one, then two more sliding ones.
    layers = ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2
    config = data("gemma3_text", num_hidden_layers=8, layer_types=layers)
    # The default cache in eager code: the cut is the same for every scenario, and the whole model's run is the costly one.
    sizes = Sizes(2, 128, caches=("dynamic",), compiled=False)
    cut = trace(config, "gemma3", sizes, "graphcache")
    whole = trace(config, "gemma3", sizes, "graphcache", cut=False)
    assert "(layers: 6 of 8)" in cut.layers and "(layers: 8 of 8)" in whole.layers
    assert cut.specs.users.keys() == whole.specs.users.keys()
    sites = {u.split(":")[0] for us in cut.specs.users.values() for u in us}
    assert sites == {"layers 0-4,6-7 self_attn", "layers 5 self_attn"}
    assert {u.split(":")[0] for us in whole.specs.users.values() for u in us} == sites


def test_encoders_and_their_padding_are_traced_on_both_routes():
    config = data("bert")
    sdpa = trace(config, "bert", Sizes(4, 256), "sdpa")
    backend = trace(config, "bert", Sizes(4, 256), "graphcache")
    assert sdpa.kind == backend.kind == "encoder"
    assert {(s.layout, s.mask, s.bias, s.batch) for s in sdpa.specs.users if s.batch == 4} == {
        ("bshd", "none", None, 4),  # unpadded
        ("bshd", "none", "b1ss", 4),  # padded: transformers' 4-D mask, a bias graph
    }
    assert {(s.layout, s.mask, s.padding) for s in backend.specs.users if s.batch == 4} == {
        ("bshd", "none", False),
        ("thd", "none", True),  # padded: ragged offsets
    }


def test_a_vision_tower_is_traced_beside_the_language_model():
    text = {**hf_models.SMALL_CONFIGS["gemma3_text"], "vocab_size": hf_models.VOCAB, "pad_token_id": 0}
    vision = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=224,
        patch_size=14,
    )
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=256).to_dict()
    # 512: a prompt holding the image's 256 tokens; the towers and prompts of eager code on the default cache.
    traced = trace(config, "gemma3", Sizes(2, 512, caches=("dynamic",), compiled=False), "sdpa")
    towers = {s for s, us in traced.specs.users.items() if any("vision_config (images)" in u for u in us)}
    # 224 / 14 = 16 patches a side: 256 tokens, bidirectional, batches of images 1 and 2.
    assert {(s.batch, s.seq_q, s.seq_kv, s.mask, s.heads_q) for s in towers} == {
        (1, 256, 256, "none", 4),
        (2, 256, 256, "none", 4),
    }
    assert not traced.untraced
    # Text and image together: a prompt holding the image's tokens, then a decode step on its cache.
    users = {u for us in traced.specs.users.values() for u in us}
    assert any("prefill with an image" in u for u in users) and any("decode after an image" in u for u in users)


@pytest.mark.parametrize(
    ("name", "route", "named"),
    [
        ("mpt", "sdpa", "refuses sdpa for model_type 'mpt' (MptModel does not support an attention implementation"),
        ("mpt", "graphcache", "lets no attention backend serve it"),
        ("deberta-v2", "sdpa", "refuses sdpa for model_type 'deberta-v2'"),
        ("gemma2", "sdpa", "its attention caps scores (softcap): no route serves softcap"),
        ("gemma2", "graphcache", "can be a graph: softcap"),
    ],
)
def test_what_cannot_be_traced_is_refused_naming_the_feature(name, route, named):
    fields = {"mpt": dict(d_model=256, n_heads=8, n_layers=2), "gemma2": dict(hf_models._DECODER, head_dim=32)}
    base = dict(vocab_size=hf_models.VOCAB, pad_token_id=0, hidden_size=256, num_attention_heads=8, num_hidden_layers=2)
    config = transformers.AutoConfig.for_model(name, **{**base, **fields.get(name, {})}).to_dict()
    with pytest.raises(ManifestError, match=named.replace("(", r"\(").replace(")", r"\)")) as refused:
        trace({**config, "model_type": name}, name, Sizes(1, 128), route)
    if "try --route graphcache" in str(refused.value):  # the route a refusal names as the fix traces the model
        assert trace({**config, "model_type": name}, name, Sizes(1, 128), "graphcache").specs.users


def test_falcon_on_the_backend_route_is_traced_where_transformers_dispatches_it():
    # Falcon's attention went through transformers' AttentionInterface from
    # 5.25 on (5.24 raised KeyError for any other implementation): what the
    # tracer does follows what the installed release does, probed here with
    # transformers' own sdpa function registered as the attention.
    if hf_models.dispatches("falcon"):
        traced = trace(data("falcon"), "falcon", Sizes(2, 256), "graphcache")
        assert traced.specs.users and not traced.refused, traced.refused
        assert {s.heads_kv for s in traced.specs.users} == {1}  # multi-query: one key/value head
    else:
        with pytest.raises(ManifestError, match="does not dispatch its attention through transformers' Attention"):
            trace(data("falcon"), "falcon", Sizes(2, 256), "graphcache")


def test_sinks_in_a_padded_call_are_named_not_covered_and_the_rest_is_listed(tmp_path):
    hf_models.config("gpt_oss").save_pretrained(tmp_path / "gpt-oss")
    out = tmp_path / "m.yaml"
    run = cli(
        "manifest", str(tmp_path / "gpt-oss"), "--max-batch", "2", "--max-seq", "256", "--route", "graphcache",
        "-o", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "not covered: sinks: attention sinks (s_aux) with a padding mask" in run.stderr
    assert "# not covered: sinks: attention sinks (s_aux) with a padding mask" in out.read_text()
    specs = manifest.load(out)
    assert specs and all(s.sinks for s in specs)  # every call it serves is a sink graph
    assert {s.batch for s in specs} == {1, 2}  # unpadded batches of 2 are served; padded ones fall back


def test_an_unknown_model_type_and_a_missing_one_are_named(tmp_path):
    with pytest.raises(ManifestError, match="model_type 'no-such-model' is not a model transformers"):
        trace({"model_type": "no-such-model"}, "c", Sizes(1, 128), "sdpa")
    with pytest.raises(ManifestError, match="model_type is missing"):
        trace({"hidden_size": 8}, "c", Sizes(1, 128), "sdpa")


def test_the_cli_traces_by_default_and_beams_widen_the_batches(tmp_path):
    hf_models.config("qwen3_moe").save_pretrained(tmp_path / "model")
    out = tmp_path / "m.yaml"
    run = cli(
        "manifest", str(tmp_path / "model"), "--max-batch", "2", "--max-seq", "256", "--beams", "2", "-o", str(out)
    )
    assert run.returncode == 0, run.stderr
    text = out.read_text()
    assert "# traced: a decoder on the meta device through route sdpa" in text
    specs = manifest.load(out)
    assert {s.batch for s in specs} == {1, 2, 4}  # 2 prompts x 2 beams
    assert f"{len(specs)} graph(s) for qwen3_moe on route sdpa" in run.stdout


def test_static_caches_and_compiled_code_are_traced_by_default_and_each_can_be_asked_for_alone(tmp_path):
    """The default manifest holds generate()'s static-cache calls and what
    compiled code calls; --cache static --max-cache-len writes exactly the
    static cache's, --cache dynamic --no-compiled neither."""
    hf_models.config("llama").save_pretrained(tmp_path / "model")
    small = ("--max-batch", "2", "--max-seq", "128", "--route", "graphcache")

    def phases(*options: str) -> set[str]:
        out = tmp_path / f"m{len(options)}.yaml"
        run = cli("manifest", str(tmp_path / "model"), *small, *options, "-o", str(out))
        assert run.returncode == 0, run.stderr
        lines = [line.split(": ", 1)[1] for line in out.read_text().splitlines() if line.startswith("  # layers")]
        found = {phase.removesuffix(" (compiled)") for line in lines for phase in line.split(", ")}
        return found - {"left-padded"}

    every = phases()
    assert {"static cache prefill", "static cache decode", "prefill", "decode"} <= every
    assert phases("--cache", "static", "--max-cache-len", "128") == {"static cache prefill", "static cache decode"}
    eager = phases("--cache", "dynamic", "--no-compiled")
    assert not any("static" in p for p in eager) and "prefill" in eager
    # A static cache's prompt and decode steps share its shape: padded dense over every slot.
    static = manifest.load(tmp_path / "m4.yaml")
    unpadded = {(s.seq_q == 1, s.mask) for s in static if s.padding}
    assert unpadded == {(False, "causal_bottom_right"), (True, "none")} and {s.seq_kv for s in static} == {128}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (("--cache", "dynamic", "--max-cache-len", "128"), "--max-cache-len sizes static caches"),
        (("--cache", "static", "--method", "config"), "--cache: for traced transformers models"),
    ],
)
def test_cache_options_that_cannot_apply_are_refused_naming_them(tmp_path, options, named):
    hf_models.config("llama").save_pretrained(tmp_path / "model")
    run = cli("manifest", str(tmp_path / "model"), "--max-batch", "1", "--max-seq", "128", *options)
    assert run.returncode != 0 and named in run.stderr, run.stderr


def test_a_static_cache_asked_of_an_encoder_is_refused_naming_its_kind(tmp_path):
    with pytest.raises(ManifestError, match="'bert' is an encoder, which generate\\(\\) gives no static cache"):
        trace(data("bert"), "bert", Sizes(1, 128, caches=("static",)), "sdpa")


@pytest.mark.parametrize("hidden", ["torch", "transformers"])
def test_without_torch_or_transformers_the_trace_names_the_extra(tmp_path, hidden):
    (tmp_path / "config.json").write_text(json.dumps(data("llama")))
    run = cli("manifest", str(tmp_path), "--max-batch", "1", "--max-seq", "128", hide=(hidden,))
    assert run.returncode != 0 and not run.stdout
    assert run.stderr.count("\n") == 1, run.stderr
    assert "pip install 'graphcache[hf]'" in run.stderr and "--method config" in run.stderr
    offline = cli(
        "manifest", str(tmp_path), "--max-batch", "1", "--max-seq", "128", "--method", "config", hide=(hidden,)
    )
    assert offline.returncode == 0, offline.stderr
