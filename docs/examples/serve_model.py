"""A stand-in for a serving script, for `graphcache record` (docs/manifests.md):
a small Llama built from its config (random weights, no download) answers one
prompt of --prompt-len tokens with --new-tokens more, on the CPU.

    graphcache record -o manifest.yaml --dtype bfloat16 docs/examples/serve_model.py --prompt-len 512

Needs torch and transformers (the hf extra).
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--prompt-len", type=int, default=128)
parser.add_argument("--new-tokens", type=int, default=8)
args = parser.parse_args()

config = LlamaConfig(
    hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=1000,
)  # fmt: skip
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
prompt = torch.randint(0, config.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    out = model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
print(f"served a prompt of {args.prompt_len} tokens, {out.shape[1] - args.prompt_len} new")
