"""A few attention calls on the CPU through graphcache's drop-in, served by
the reference compiler's graphs (README, "Try it without a GPU").

Run it after `graphcache warm docs/examples/tiny.yaml --compiler reference`
and `graphcache prefetch ... --compiler reference`: every call is served from
the store. It prints the drop-in's counters and exits 1 when a call was not.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import graphcache.torch as gt
from graphcache import GraphCache

# The worker's cache (GRAPHCACHE_SERVER / GRAPHCACHE_DIR), with the reference
# compiler: its graphs run on the CPU. On a GPU host: GraphCache.from_env(CudnnCompiler()).
gt.configure(GraphCache.from_env(compiler="reference"), device="cpu")


def heads(seq: int) -> torch.Tensor:
    return torch.randn(1, 4, seq, 64, dtype=torch.bfloat16)  # (batch, heads, seq, dim)


torch.manual_seed(0)
with torch.no_grad(), gt.patch():
    for prompt in (64, 100):  # prefill: the prompt attends to itself, causally
        F.scaled_dot_product_attention(heads(prompt), heads(prompt), heads(prompt), is_causal=True)
    for seq_kv in range(101, 105):  # decode: one new token attends to everything before it
        F.scaled_dot_product_attention(heads(1), heads(seq_kv), heads(seq_kv))

print(f"drop-in: {gt.summary()}")  # served from the store, by graphs built here, fell back to torch
stats = gt.stats()
sys.exit(0 if stats["served_from_store"] == stats["calls"] else 1)
