"""A worker on the cuDNN most PyTorch users have (9.19: torch 2.11's CUDA
wheels, no execute-time shape override), walked on this CPU: the reference
compiler stands in for that release (GRAPHCACHE_REFERENCE_CUDNN=9.19.0), so
classes are served by the padded mechanism, as on such a GPU.

Through the CLI and a fresh worker process, as a user drives it: a tiny
Llama's manifest traced from its config alone, warmed on 9.19 and on 9.26,
then generate after prompts of 37, 200 and 513 tokens and for a left-padded
batch of 3 under ``graphcache.torch.patch()``: the calls are served from the
store, nothing is built, the tokens are plain torch's, and the copies the
padded classes made are counted. (64 new tokens in
scripts/bench_classes_padded.py's figure; 4 here.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirun import cli

pytest.importorskip("torch", reason="the worker runs a torch model")
pytest.importorskip("transformers", reason="the worker runs a transformers Llama")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "examples" / "configs" / "tiny-llama"

WORKER = r"""
import json, os, sys
import torch, transformers
import graphcache.torch as gt
from graphcache import GraphCache

torch.manual_seed(0)
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
config._attn_implementation = "sdpa"
model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
new = int(sys.argv[2])

def run(ids, mask):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=0)

cases = []
for n in (37, 200, 513):
    ids = torch.randint(3, 1000, (1, n), generator=torch.Generator().manual_seed(n))
    cases.append((ids, torch.ones_like(ids)))
ids, mask = torch.zeros(3, 50, dtype=torch.long), torch.zeros(3, 50, dtype=torch.long)
for i, n in enumerate((20, 33, 50)):  # left-padded
    ids[i, 50 - n:] = torch.randint(3, 1000, (n,), generator=torch.Generator().manual_seed(n))
    mask[i, 50 - n:] = 1
cases.append((ids, mask))
plain = [run(i, m) for i, m in cases]
gt.configure(GraphCache.from_env("reference"), device="cpu", on_miss="torch")
with gt.patch():
    served = [run(i, m) for i, m in cases]
stats = gt.stats()
stats["tokens_equal"] = [bool(torch.equal(a, b)) for a, b in zip(plain, served)]
print(json.dumps(stats))
"""


def _warm(manifest: Path, store: Path, cudnn: str) -> str:
    env = {"GRAPHCACHE_REFERENCE_CUDNN": cudnn}
    out = cli("warm", str(manifest), "--compiler", "reference", "--cache-dir", str(store), env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    check = cli("warm", str(manifest), "--check", "--compiler", "reference", "--cache-dir", str(store), env=env)
    assert check.returncode == 0 and "present for reference-sm00" in check.stdout, check.stdout + check.stderr
    return out.stdout + check.stdout


def _stored(store: Path) -> int:
    out = cli("ls", "--cache-dir", str(store))
    assert out.returncode == 0, out.stderr
    return sum(1 for line in out.stdout.splitlines() if "reference-sm00" in line)


def test_a_tiny_llama_on_cudnn_9_19_decodes_from_its_manifest_alone_through_padded_classes(tmp_path):
    manifest = tmp_path / "llama.yaml"
    made = cli("manifest", str(CONFIG), "--max-batch", "4", "--max-seq", "1024", "-o", str(manifest))
    assert made.returncode == 0, made.stderr
    old = _warm(manifest, tmp_path / "s919", "9.19.0")
    assert "length classes on reference-sm00-cudnn9.19.0-fe0.0.0: padded: no execute-time shape override" in old
    assert "(padded)" in old or "padded;" in old
    new = _warm(manifest, tmp_path / "s926", "9.26.0")
    assert "length classes on reference-sm00-cudnn9.26.0-fe0.0.0: override" in new
    assert _stored(tmp_path / "s919") <= 2 * _stored(tmp_path / "s926")

    env = {**os.environ, "GRAPHCACHE_REFERENCE_CUDNN": "9.19.0", "GRAPHCACHE_DIR": str(tmp_path / "s919")}
    worker = subprocess.run(
        [sys.executable, "-c", WORKER, str(CONFIG), "4"], capture_output=True, text=True, env=env, timeout=600
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    stats = json.loads(worker.stdout.strip().splitlines()[-1])
    assert stats["tokens_equal"] == [True] * 4
    assert stats["built_here"] == 0 and stats["served_from_store"] >= 0.95 * stats["calls"], stats
    assert stats["copies"] > 0 and stats["copied_bytes"] > 0
    assert {"k", "v"} <= set(stats["copied"]) and all("class_buffer" in r for r in stats["copied"].values())


def test_a_reference_cudnn_that_is_no_release_is_refused_naming_the_variable(tmp_path):
    out = cli("warm", "--check", str(tmp_path / "m.yaml"), "--compiler", "reference", env={
        "GRAPHCACHE_REFERENCE_CUDNN": "nine"
    })  # fmt: skip
    assert out.returncode != 0
    assert "GRAPHCACHE_REFERENCE_CUDNN='nine' is not a release number; write it as 9.19.0" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
