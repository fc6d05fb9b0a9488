"""Small Hugging Face models built from configs (random weights, no
download) and the measure issue 25 asks for: record a model's generate() on
prompts of 37, 200 and 513 tokens (and one padded batch of 4 and one 2-beam
search), warm the manifest into a store, then serve other prompt lengths,
a padded batch of 4 of other lengths, and 2-beam search: the fraction of
attention calls served by cached graphs, and whether the greedy tokens equal
unpatched torch's (attn_implementation="sdpa", no graphcache).

Shared by tests/test_hf_models.py and scripts/bench/bench_hf_models.py. The
compiler is a CPU one that executes (the caller's), so hits run real math.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers

import graphcache.hf
import graphcache.torch as gt
from graphcache import GraphCache, GraphSpec, manifest, ops
from graphcache.errors import ManifestError
from graphcache.stores import DiskStore

VOCAB = 128
# Below this top-2 logit gap (bf16 logits of a random model) a greedy choice
# is a tie that a last-bit difference in attention may flip either way.
TIE = 0.05


@dataclass(frozen=True)
class Lengths:
    """Prompt lengths to record on and to serve."""

    record: tuple[int, ...] = (37, 200, 513)
    record_batch: tuple[int, ...] = (37, 200, 513, 100)
    serve: tuple[int, ...] = (50, 300, 700)
    serve_batch: tuple[int, ...] = (700, 300, 90, 160)
    beam: int = 120


# Small enough for the test suite: the same classes (<= 128, 256) recorded and served.
SMALL = Lengths(record=(9, 150), record_batch=(9, 150, 20, 40), serve=(20, 140), serve_batch=(130, 60, 17, 33), beam=30)


_DECODER: dict[str, Any] = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
    max_position_embeddings=2048,
)  # fmt: skip
_SEQ2SEQ: dict[str, Any] = dict(
    d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=8, decoder_attention_heads=8,
    encoder_ffn_dim=512, decoder_ffn_dim=512, max_position_embeddings=2048, decoder_start_token_id=2,
    forced_eos_token_id=None,
)  # fmt: skip
_ENCODER: dict[str, Any] = dict(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8, max_position_embeddings=2048
)
# Small configs (2 layers, hidden 256, head dim 32) of model types by their
# own field names, built with AutoConfig.for_model: the 14 families
# graphcache.models.config reads, and architectures outside them (issue 32).
SMALL_CONFIGS: dict[str, dict[str, Any]] = {
    # the families the config reader knows
    "llama": _DECODER,
    "mistral": {**_DECODER, "sliding_window": 64},
    "mixtral": {**_DECODER, "num_local_experts": 4, "sliding_window": None},
    "qwen2": _DECODER,
    "qwen3": {**_DECODER, "head_dim": 32},
    "phi3": {**_DECODER, "sliding_window": 64},
    "gemma": {**_DECODER, "head_dim": 32},
    "gemma3_text": {
        **_DECODER,
        "head_dim": 32,
        "sliding_window": 64,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "gpt2": dict(n_embd=256, n_layer=2, n_head=8, n_positions=2048),
    "bart": _SEQ2SEQ,
    "mbart": _SEQ2SEQ,
    "whisper": {
        **_SEQ2SEQ,
        "max_position_embeddings": None,
        "num_mel_bins": 80,
        "max_source_positions": 1500,
        "max_target_positions": 448,
        "decoder_start_token_id": 1,
    },
    "t5": dict(d_model=256, d_kv=32, d_ff=512, num_layers=2, num_heads=8, decoder_start_token_id=0),
    "mt5": dict(d_model=256, d_kv=32, d_ff=512, num_layers=2, num_heads=8, decoder_start_token_id=0),
    # outside them: encoders
    "bert": _ENCODER,
    "roberta": _ENCODER,
    "distilbert": dict(dim=256, n_layers=2, n_heads=8, hidden_dim=512, max_position_embeddings=2048),
    "electra": {**_ENCODER, "embedding_size": 256},
    "modernbert": {
        **_ENCODER,
        "global_attn_every_n_layers": 2,
        "local_attention": 64,
        "cls_token_id": 1,
        "sep_token_id": 2,
    },
    "xlm-roberta": _ENCODER,
    # decoders
    "qwen3_moe": {**_DECODER, "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128},
    "granitemoe": {**_DECODER, "num_local_experts": 4},
    "falcon": {**_DECODER, "num_key_value_heads": None},  # multi-query: one key/value head
    # StarCoder 1: multi-query, one fused c_attn row per token (q's heads, one key head, one value head)
    "gpt_bigcode": dict(n_embd=256, n_layer=2, n_head=8, n_positions=2048, multi_query=True),
    "opt": {**_DECODER, "ffn_dim": 512, "word_embed_proj_dim": 256},
    "gpt_neox": _DECODER,
    "phi": _DECODER,
    "starcoder2": {**_DECODER, "sliding_window": 64},
    # encoder-decoders
    "pegasus": _SEQ2SEQ,
    "marian": {**_SEQ2SEQ, "decoder_vocab_size": VOCAB},
}
# The architectures outside the families, as issue 32 measures them.
ARCHITECTURES = (
    "bert", "roberta", "distilbert", "electra", "modernbert", "xlm-roberta", "qwen3_moe", "granitemoe", "falcon",
    "opt", "gpt_neox", "phi", "starcoder2", "pegasus", "marian",
)  # fmt: skip


def config(name: str) -> Any:
    """2 layers, hidden 256, head dim 32: Llama-style GQA (8/2 heads),
    Mistral with a 64-token sliding window, Gemma 3 (a window on alternate
    layers), BART, T5 (relative position bias); any other name of
    SMALL_CONFIGS, built by transformers from those fields."""
    common: dict[str, Any] = dict(vocab_size=VOCAB, pad_token_id=0, eos_token_id=VOCAB - 1, bos_token_id=1)
    decoder: dict[str, Any] = dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        **common,
    )
    if name == "llama":
        return transformers.LlamaConfig(**decoder)
    if name == "mistral":
        return transformers.MistralConfig(sliding_window=64, **decoder)
    if name == "gemma3":  # a 64-token window on its first layer, full attention on its second
        layers = ["sliding_attention", "full_attention"]
        return transformers.Gemma3TextConfig(head_dim=32, sliding_window=64, layer_types=layers, **decoder)
    if name == "gpt_oss":  # attention sinks (s_aux) on both layers, a 64-token window on the first
        return transformers.GptOssConfig(
            head_dim=32, sliding_window=64, num_local_experts=4, num_experts_per_tok=2, **decoder
        )
    if name == "bart":
        return transformers.BartConfig(
            d_model=256,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            encoder_ffn_dim=512,
            decoder_ffn_dim=512,
            max_position_embeddings=2048,
            decoder_start_token_id=2,
            forced_eos_token_id=None,
            **common,
        )
    if name == "t5":
        return transformers.T5Config(
            d_model=256, d_kv=32, d_ff=512, num_layers=2, num_heads=8, decoder_start_token_id=0, **common
        )
    if name in SMALL_CONFIGS:
        fields = {k: v for k, v in SMALL_CONFIGS[name].items() if v is not None}
        return transformers.AutoConfig.for_model(name, **{**fields, **common, "bos_token_id": 1})
    raise ValueError(f"unknown model {name!r}: llama, mistral, gemma3, gpt_oss, bart, t5, {', '.join(SMALL_CONFIGS)}")


# Encoder-only models of SMALL_CONFIGS: served by forward passes, not generate().
ENCODERS = frozenset({"bert", "roberta", "distilbert", "electra", "modernbert", "xlm-roberta"})


def kind(name: str) -> str:
    """encoder, decoder or encoder-decoder."""
    if name in ENCODERS:
        return "encoder"
    return "encoder-decoder" if config(name).is_encoder_decoder else "decoder"


def build(name: str, attn: str = "graphcache") -> Any:
    """The model, bf16, eval mode, seeded (the same weights every time)."""
    graphcache.hf.register()
    torch.manual_seed(0)
    cfg = config(name)
    classes = {
        "encoder": transformers.AutoModel,
        "encoder-decoder": transformers.AutoModelForSeq2SeqLM,
        "decoder": transformers.AutoModelForCausalLM,
    }
    return classes[kind(name)].from_config(cfg, attn_implementation=attn).eval().to(torch.bfloat16)


PROBE = "graphcache-probe"


def dispatches(name: str) -> bool:
    """Whether the installed transformers sends ``name``'s attention through
    its AttentionInterface: the small model is built with a probe attention
    registered there (transformers' own sdpa function, counted) and run on 4
    tokens. False where transformers refuses the name (Falcon up to 5.24
    raised KeyError) or the forward never calls the probe. What the
    installed release does, whatever its version number says."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    calls = []

    def probe(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register(PROBE, probe)
    AttentionMaskInterface.register(PROBE, sdpa_mask)
    try:
        model = build(name, PROBE)
    except (KeyError, ValueError):
        return False
    with torch.no_grad():
        model(torch.arange(1, 5).unsqueeze(0))
    return bool(calls)


def batch(lengths: tuple[int, ...], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts of ``lengths`` (no pad token in them), padded on the
    left (decoders) or the right (encoders, as their tokenizers pad)."""
    longest = max(lengths)
    ids = torch.zeros((len(lengths), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        tokens = torch.randint(3, VOCAB - 1, (n,), generator=torch.Generator().manual_seed(n))
        where = slice(longest - n, longest) if left else slice(0, n)
        ids[row, where] = tokens
        mask[row, where] = 1
    return ids, mask


def encode(model: Any, lengths: tuple[int, ...]) -> torch.Tensor:
    """An encoder's last hidden states for a left-padded batch, float32,
    with the padding rows zeroed (what they hold is no one's answer)."""
    ids, mask = batch(lengths, left=True)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    return out.float() * mask.unsqueeze(-1)


# An encoder's hidden states agree with unpatched torch's within this
# (relative to their largest value): bf16, and the float32 reference that
# executes ragged graphs here rounding otherwise than torch's bf16 kernels.
ENCODER_TOLERANCE = 3e-2


def generate(model: Any, lengths: tuple[int, ...], new_tokens: int, beams: int = 1, **options: Any) -> torch.Tensor:
    """Greedy tokens for a left-padded batch of prompts of ``lengths``
    (an encoder's hidden states); ``options`` go to generate()
    (``cache_implementation="static"``, ``compile_config``)."""
    if model.config.model_type in ENCODERS:
        return encode(model, lengths)
    ids, mask = batch(lengths, left=not model.config.is_encoder_decoder)
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            num_beams=beams,
            pad_token_id=0,
            **options,
        )


@dataclass
class Case:
    """One serving case: hits over attention calls, and token equality."""

    name: str
    calls: int
    hits: int
    equal: bool
    fallbacks: dict[str, int] = field(default_factory=dict)
    tie: bool = False  # tokens differ only where torch's own choice was a near tie (TIE)
    gap: float | None = None  # the largest such logit gap
    copied: dict[str, dict[str, int]] = field(default_factory=dict)  # stats()["copied"]: tensors copied, by reason

    @property
    def fraction(self) -> float:
        return self.hits / self.calls if self.calls else 0.0


def cases(lengths: Lengths, encoder: bool = False) -> dict[str, list[tuple[tuple[int, ...], int]]]:
    """Serving cases: name -> runs of (prompt lengths, beams); an encoder has no beams."""
    out = {
        "other prompt lengths, b=1": [((p,), 1) for p in lengths.serve],
        "padded batch of 4": [(lengths.serve_batch, 1)],
        "2-beam search": [((lengths.beam,), 2)],
    }
    if encoder:
        del out["2-beam search"]
    return out


def same(want: torch.Tensor, got: torch.Tensor) -> bool:
    """Token ids equal, or an encoder's hidden states within ENCODER_TOLERANCE."""
    if want.is_floating_point():
        scale = float(want.abs().max()) or 1.0
        return float((want - got).abs().max()) <= ENCODER_TOLERANCE * scale
    return torch.equal(want, got)


# Issue 32's measure: prompts of 50/300/700 tokens, a left-padded batch of
# 4 of those lengths, 2-beam search; the tests use SMALL_SERVE's lengths.
MANIFEST_SERVE = Lengths(serve=(50, 300, 700), serve_batch=(50, 300, 700, 300), beam=120)
SMALL_SERVE = Lengths(serve=(20, 140), serve_batch=(140, 60, 17, 33), beam=30)


def served(
    name: str,
    route: str,
    folder: Path,
    compiler: Any,
    lengths: Lengths = MANIFEST_SERVE,
    new_tokens: int = 8,
    manifest_args: Sequence[str] = ("--max-batch", "8", "--max-seq", "1024"),
    only: Sequence[str] | None = None,
) -> tuple[list[Case], int]:
    """Warm ``name`` ONLY from ``graphcache manifest CONFIG`` (the CLI as a
    user runs it: the model traced, no recording) on ``route``, then serve
    ``cases`` (those named in ``only``) with ``compiler`` executing the
    graphs; tokens (an encoder's hidden states) compared with unpatched
    torch's sdpa. Returns the cases and how many graphs were built while
    serving (0: served from what the manifest warmed)."""
    model = build(name, "sdpa")
    cache = warmed_from_config(name, route, folder, compiler, manifest_args)
    builds = getattr(compiler, "builds", 0)
    found = serve_cases(model, cache, lengths, new_tokens, route, only=only)
    return found, getattr(compiler, "builds", 0) - builds


def warmed_from_config(
    name: str, route: str, folder: Path, compiler: Any, manifest_args: Sequence[str] = ("--max-batch", "8")
) -> GraphCache:
    """A cache warmed ONLY from ``graphcache manifest CONFIG`` (the CLI as a
    user runs it: ``name``'s config.json in a model folder, traced through
    ``route``), its graphs built by ``compiler``; the manifest is left in
    ``folder`` as NAME-ROUTE.yaml."""
    from tests.clirun import cli

    config(name).save_pretrained(folder / "model")  # config.json, as a model folder holds it
    out = folder / f"{name}-{route}.yaml"
    run = cli("manifest", str(folder / "model"), *manifest_args, "--route", route, "-o", str(out))
    if run.returncode != 0:
        raise ManifestError(run.stderr.strip())
    store = DiskStore(folder / f"{name}-{route}-store")
    ops.warm(manifest.load(out), GraphCache(store, compiler, shape_classes="pow2"))
    return GraphCache(store, compiler, shape_classes="pow2")


def measure(
    name: str,
    compiler: Any,
    folder: Path,
    lengths: Lengths = Lengths(),
    new_tokens: int = 8,
    attn: str = "graphcache",
    also: Sequence[GraphSpec] = (),
    baseline: str = "sdpa",
    only: Sequence[str] | None = None,
    max_batch: int | None = None,
) -> list[Case]:
    """Record, warm and serve ``name`` through ``attn`` ("graphcache", or
    "sdpa" under graphcache.torch.patch()); see the module docs. ``also``
    is warmed beside the recording (a manifest of the model's config, what
    the "coverage" issue adds where a recording falls short). One Case per
    entry of ``cases`` (or of those named in ``only``); tokens are compared
    with ``baseline``'s (gpt-oss: "eager", transformers' sdpa refuses sinks).
    With ``max_batch``, the recording is of batch-1 prompts alone, widened
    as ``graphcache record --max-batch`` widens it (issue 32, item 4)."""
    model = build(name, attn)
    gt.reset()
    path = folder / f"{name}-{attn}.yaml"
    try:
        with gt.record(path, shape_classes="pow2", max_batch=max_batch):
            for p in lengths.record:
                generate(model, (p,), new_tokens)
            if max_batch is None:
                generate(model, lengths.record_batch, new_tokens)
                generate(model, (lengths.record[0],), new_tokens, beams=2)
    except ManifestError:  # no call could be a graph (T5's position bias before bias graphs): nothing to warm
        pass
    cache = GraphCache(DiskStore(folder / f"{name}-{attn}-store"), compiler, shape_classes="pow2")
    if path.exists():
        ops.warm(manifest.load(path), cache)
    if also:
        ops.warm(list(also), cache)
    return serve_cases(model, cache, lengths, new_tokens, attn, baseline, only)


def serve_cases(
    model: Any,
    cache: GraphCache,
    lengths: Lengths,
    new_tokens: int,
    attn: str,
    baseline: str = "sdpa",
    only: Sequence[str] | None = None,
) -> list[Case]:
    """Serve ``cases`` (those named in ``only``) through ``attn`` from
    ``cache``, each against ``baseline`` (unpatched): one Case each, the
    drop-in's counters and whether the tokens (an encoder's hidden states)
    agree, or differ only at a near tie."""
    encoder = model.config.model_type in ENCODERS
    found = []
    for case, runs in cases(lengths, encoder=encoder).items():
        if only is not None and case not in only:
            continue
        model.set_attn_implementation(baseline)
        want = [generate(model, p, new_tokens, beams) for p, beams in runs]
        model.set_attn_implementation(attn)
        gt.reset()
        gt.configure(cache, device="cpu", on_miss="torch")
        with gt.patch() if attn == "sdpa" else _nothing():
            got = [generate(model, p, new_tokens, beams) for p, beams in runs]
        stats = gt.stats()
        model.set_attn_implementation(baseline)
        gt.reset()
        equal = all(same(w, g) for w, g in zip(want, got, strict=True))
        tie, gap = False, None
        if not equal and not encoder:
            gaps = [tie_gap(model, p, w, g) for (p, beams), w, g in zip(runs, want, got, strict=True) if beams == 1]
            gap = max((t for t in gaps if t is not None), default=None)
            tie = len(gaps) == len(runs) and (gap is None or gap < TIE)
        fallbacks = dict(stats["fallbacks"])
        found.append(Case(case, stats["calls"], stats["hits"], equal, fallbacks, tie, gap, stats.get("copied", {})))
    return found


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def tie_gap(model: Any, lengths: tuple[int, ...], want: torch.Tensor, got: torch.Tensor) -> float | None:
    """Where greedy ``got`` first leaves ``want`` in each row (None where they
    agree): the largest gap, in unpatched torch's logits at that step,
    between the token torch chose and the one the served run chose."""
    ids, mask = batch(lengths, left=not model.config.is_encoder_decoder)
    gaps = []
    for row in range(want.shape[0]):
        differs = (want[row] != got[row]).nonzero()
        if differs.numel() == 0:
            continue
        col = int(differs[0, 0])
        prefix = want[:, :col]
        with torch.no_grad():
            if model.config.is_encoder_decoder:
                logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=prefix).logits[:, -1]
            else:
                pad = torch.ones((mask.shape[0], col - mask.shape[1]), dtype=mask.dtype)
                logits = model(input_ids=prefix, attention_mask=torch.cat([mask, pad], dim=1)).logits[:, -1]
        gaps.append(float(logits[row, want[row, col]] - logits[row, got[row, col]]))
    return max(gaps) if gaps else None
