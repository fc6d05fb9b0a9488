#!/usr/bin/env python3
"""A tiny Llama's decode on the cuDNN most PyTorch users have, walked on a
CPU: the reference compiler stands in for each cuDNN release
(GRAPHCACHE_REFERENCE_CUDNN), so classes are served as a worker on that
release serves them (below 9.21, no execute-time override: padded).

For each release: the manifest traced from the config alone (`graphcache
manifest`), warmed (`graphcache warm --compiler reference`) and checked
(`warm --check`), then a fresh worker process generates --new-tokens tokens
(greedy, bf16) after prompts of 37, 200 and 513 tokens and for a left-padded
batch of 3, under graphcache.torch.patch(), against plain torch in the same
process. A table per release: graphs stored, attention calls, served from the
store, built here, graphs loaded, tensors and bytes copied, tokens equal to
plain torch's, seconds.

    python scripts/bench/bench_classes_padded.py [--new-tokens 64] [--cudnn 9.19.0 --cudnn 9.26.0] [--json OUT]

Nothing here is cuDNN: the figures say what graphcache does on the path (which
graphs, which copies), not how fast cuDNN runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "docs" / "examples" / "configs" / "tiny-llama"

WORKER = r"""
import json, sys, time
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
start = time.perf_counter()
with gt.patch():
    served = [run(i, m) for i, m in cases]
stats = gt.stats()
stats["seconds"] = time.perf_counter() - start
stats["tokens_equal"] = [bool(torch.equal(a, b)) for a, b in zip(plain, served)]
print(json.dumps(stats))
"""


def _cli(*args: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "graphcache.cli", *args], capture_output=True, text=True, env=env, timeout=1800
    )
    if out.returncode:
        raise SystemExit(f"graphcache {' '.join(args)} failed: {out.stderr.strip()[-2000:]}")
    return out.stdout


def one(cudnn: str, manifest: Path, store: Path, new_tokens: int) -> dict[str, object]:
    """Warm ``store`` for the reference standing in for ``cudnn``, then one fresh worker's run."""
    env = {**os.environ, "GRAPHCACHE_REFERENCE_CUDNN": cudnn, "GRAPHCACHE_DIR": str(store), "COLUMNS": "200"}
    warmed = _cli("warm", str(manifest), "--compiler", "reference", env=env)
    checked = _cli("warm", str(manifest), "--check", "--compiler", "reference", env=env)
    listed = _cli("ls", env=env)
    stored = sum(1 for line in listed.splitlines() if "reference-sm00" in line)
    mechanism = next((line for line in warmed.splitlines() if line.startswith("length classes on ")), "")
    started = time.perf_counter()
    worker = subprocess.run(
        [sys.executable, "-c", WORKER, str(CONFIG), str(new_tokens)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if worker.returncode:
        raise SystemExit(f"the worker on cuDNN {cudnn} failed: {worker.stderr.strip()[-2000:]}")
    stats = json.loads(worker.stdout.strip().splitlines()[-1])
    return {
        "cudnn": cudnn,
        "graphs_stored": stored,
        "mechanism": mechanism,
        "check": next((line for line in checked.splitlines() if " present for " in line), ""),
        "worker_seconds": time.perf_counter() - started,
        **{k: stats[k] for k in ("calls", "served_from_store", "built_here", "graphs_loaded", "fallbacks")},
        **{k: stats[k] for k in ("copies", "copied", "copied_bytes", "tokens_equal", "seconds")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--cudnn", action="append", default=[], help="a cuDNN release (repeatable)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    releases = args.cudnn or ["9.19.0", "9.26.0"]
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "llama.yaml"
        _cli(
            "manifest", str(CONFIG), "--max-batch", "4", "--max-seq", "1024", "-o", str(manifest), env=dict(os.environ)
        )
        rows = []
        for cudnn in releases:
            print(f"cuDNN {cudnn}: warm, check, a fresh worker ({args.new_tokens} new tokens)...", flush=True)
            rows.append(one(cudnn, manifest, Path(tmp) / f"store-{cudnn}", args.new_tokens))
    print()
    print(f"tiny Llama (docs/examples/configs/tiny-llama), {args.new_tokens} new tokens after prompts 37/200/513 and a")
    print("left-padded batch of 3, patch(), the reference compiler standing in for each cuDNN; manifest traced alone")
    head = ["cuDNN", "graphs", "calls", "served", "built", "loaded", "copies", "copied MiB", "tokens equal", "s"]
    print("  ".join(f"{h:>12}" for h in head))
    for r in rows:
        served = f"{r['served_from_store']} ({100 * r['served_from_store'] / max(r['calls'], 1):.0f}%)"  # type: ignore[operator]
        cells = [
            r["cudnn"], r["graphs_stored"], r["calls"], served, r["built_here"], r["graphs_loaded"], r["copies"],
            f"{r['copied_bytes'] / 2**20:.1f}", f"{sum(r['tokens_equal'])}/{len(r['tokens_equal'])}",  # type: ignore[arg-type, operator]
            f"{r['seconds']:.1f}",
        ]  # fmt: skip
        print("  ".join(f"{c!s:>12}" for c in cells))
    for r in rows:
        print(f"cuDNN {r['cudnn']}: {r['mechanism'][:160]}")
        print(f"cuDNN {r['cudnn']}: copied by tensor {r['copied']}; fallbacks {r['fallbacks']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
