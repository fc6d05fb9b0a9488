"""Which transformers model types ``graphcache manifest`` traces (issue 32).

Each model type is built from a small config by the installed transformers
(``AutoConfig.for_model`` with 2 layers, hidden 256, 4 heads, its family's
own names for those fields) and traced through both routes at --max-batch 2
--max-seq 256; prints a markdown table: the graphs the manifest lists, how
the model ran (its stacks cut to a prefix, or full depth), the calls no
graph serves by reason, or the refusal, named by feature.

    python scripts/bench/trace_model_types.py                  # every type listed here
    python scripts/bench/trace_model_types.py bert falcon mpt  # these

Needs torch and transformers (the hf extra), no GPU; nothing is timed but
each trace's wall time, for orientation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import transformers  # noqa: E402

from graphcache.errors import ManifestError  # noqa: E402
from graphcache.models.scenarios import Sizes  # noqa: E402
from graphcache.models.trace import trace  # noqa: E402

BASE = dict(
    vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
SEQ2SEQ = dict(
    d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=512, decoder_ffn_dim=512, decoder_start_token_id=2,
)  # fmt: skip
FIELDS: dict[str, dict[str, object]] = {
    **{t: SEQ2SEQ for t in ("bart", "mbart", "pegasus", "marian", "blenderbot", "m2m_100", "plbart", "led")},
    **{t: dict(d_model=256, d_kv=64, d_ff=512, num_layers=2, num_heads=4) for t in ("t5", "mt5", "umt5", "longt5")},
    "distilbert": dict(dim=256, n_layers=2, n_heads=4, hidden_dim=512),
    "gpt2": dict(n_embd=256, n_layer=2, n_head=4),
    "mpt": dict(d_model=256, n_heads=4, n_layers=2),
    "bloom": dict(n_layer=2, n_head=4),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128),
    "modernbert": dict(global_attn_every_n_layers=2, local_attention=64, cls_token_id=1, sep_token_id=2),
    "gemma2": dict(head_dim=64),
    "gpt_oss": dict(head_dim=64, sliding_window=64, num_local_experts=4, num_experts_per_tok=2),
}
TYPES = (
    # decoders
    "llama", "qwen3", "granite", "olmo2", "starcoder2", "cohere", "stablelm", "gemma", "mixtral", "falcon",
    "gpt_neox", "gptj", "opt", "smollm3", "glm", "olmo", "persimmon", "phi", "codegen", "exaone4", "ernie4_5",
    "seed_oss", "qwen3_moe", "granitemoe", "llama4_text", "arcee", "apertus", "minimax", "gpt2", "gemma2", "gpt_oss",
    # encoders
    "bert", "roberta", "distilbert", "electra", "xlm-roberta", "modernbert", "camembert", "albert", "ernie",
    "nomic_bert", "jina_embeddings_v3", "data2vec-text", "xlm-roberta-xl", "esm",
    # encoder-decoders
    "bart", "mbart", "pegasus", "marian", "blenderbot", "m2m_100", "plbart", "t5", "umt5",
    # transformers refuses sdpa
    "mpt", "bloom", "mpnet", "deberta-v2", "megatron-bert", "roformer", "longt5", "led",
)  # fmt: skip


def row(model_type: str, route: str) -> str:
    fields = {**BASE, **FIELDS.get(model_type, {})}
    config = transformers.AutoConfig.for_model(model_type, **fields).to_dict()
    started = time.perf_counter()
    try:
        traced = trace({**config, "model_type": model_type}, model_type, Sizes(2, 256), route)
    except ManifestError as exc:
        return f"| {model_type} | {route} | refused | {str(exc).split(': ', 1)[-1]} |"
    took = time.perf_counter() - started
    refused = "; ".join(f"{code} ({len(users)} site(s))" for (code, _), users in traced.refused.items())
    untraced = "; ".join(traced.untraced)
    notes = ", ".join(x for x in (refused and f"not covered: {refused}", untraced) if x) or "-"
    return (
        f"| {model_type} | {route} | {len(traced.specs.users)} graphs, {traced.kind}, {took:.1f} s | "
        f"{traced.layers}; {notes} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", default=list(TYPES))
    parser.add_argument("--route", nargs="+", choices=("sdpa", "graphcache"), default=["sdpa", "graphcache"])
    args = parser.parse_args(argv)
    print(f"transformers {transformers.__version__}, --max-batch 2 --max-seq 256")
    print("| model_type | route | traced | how, what is not covered / the refusal |")
    print("|---|---|---|---|")
    for model_type in args.types:
        for route in args.route:
            print(row(model_type, route), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
