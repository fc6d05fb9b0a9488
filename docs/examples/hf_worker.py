"""A worker: a Hugging Face model whose attention graphcache serves.

docs/huggingface.md runs it on an empty store, then after warming one.
"""

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import graphcache.hf
import graphcache.torch as gt
from graphcache import GraphCache

graphcache.hf.register()  # transformers >=5.24,<6: another release is refused
# A GPU host needs no configure(). Here: the reference compiler's graphs, on
# the CPU; a graph the store lacks is built on the spot (on_miss="build").
cache = GraphCache.from_env(compiler="reference")
gt.configure(cache, device="cpu", on_miss="build")

# 2 layers, hidden 256: built from its config, no download.
config = AutoConfig.from_pretrained("docs/examples/configs/tiny-llama")
model = AutoModelForCausalLM.from_config(
    config, attn_implementation="graphcache", dtype=torch.bfloat16
)  # or: model.set_attn_implementation("graphcache")
prompt = torch.randint(0, 1000, (1, 37))
with torch.no_grad():
    model.generate(prompt, max_new_tokens=8, do_sample=False)
print(gt.summary())  # served from the store, built here, fell back
