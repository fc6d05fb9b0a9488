#!/usr/bin/env python3
"""Graphs per workload, exact shapes against length classes, and the cold
build time each implies (issue 18, item 8).

Every spec is a real GraphSpec and every class comes from
graphcache.spec.classes.class_of (policy pow2), so the counts are the policy's.
The specs are the ones graphcache.torch derives for a causal decoder's
generate(): a causal prefill (seq_q = seq_kv = prompt length) and one decode
step per new token (seq_q 1, seq_kv = prompt + tokens so far), per batch size.

- llama: the small Hugging Face Llama of tests/test_classes_llama.py (8 heads,
  2 KV heads, d8, batch 1), prompts 37, 200 and 513, 64 new tokens; the test
  records the same counts from the real model.
- chat: 32 heads, 8 KV heads, d128, bf16; prompts of every length 1..8192,
  2048 new tokens, every batch size 1..64.

Per target: the graphs a deploy stores there. A class a mechanism serves on
the target (execute-time override on cuDNN >= 9.21 with frontend >= 1.24,
else padded: graphcache.compilers.cudnn.releases.class_mechanism) is one
graph; a class none serves is every exact spec it covers; a spec a known-bad
window refuses there is none (torch serves it). --manifest counts a
manifest's entries the same way (a class none serves: its exact shapes are
not in a manifest, so it is counted as refused).

    python scripts/bench/count_classes.py [--seconds-per-build 0.4]      (about 4 minutes: 1.2 million specs)
    graphcache manifest docs/examples/configs/llama-3-8b --max-batch 64 --max-seq 8192 -o /tmp/l8b.yaml
    python scripts/bench/count_classes.py --manifest /tmp/l8b.yaml --no-workloads
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache import GraphSpec, Target  # noqa: E402
from graphcache.compilers.cudnn.releases import class_mechanism, refused  # noqa: E402
from graphcache.spec.classes import class_of  # noqa: E402

# The cuDNN PyTorch bundles (its release files and pins; docs/install.md), on an H200.
TARGETS = {
    "9.10.2 (every cu126 torch)": "h200-sm90-mp132-cudnn9.10.2-fe1.12.0",
    "9.19.0 (torch 2.11, the lent H200)": "h200-sm90-mp132-cudnn9.19.0-fe1.28.0",
    "9.20.0 (torch 2.12, 2.13 cu130)": "h200-sm90-mp132-cudnn9.20.0-fe1.32.0",
    "9.26.0 (torch 2.15 cu132)": "h200-sm90-mp132-cudnn9.26.0-fe1.32.0",
}


def generate_specs(
    heads_q: int, heads_kv: int, head_dim: int, prompts: list[int], new_tokens: int, batches: list[int]
) -> Iterator[GraphSpec]:
    base = dict(heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, dtype="bfloat16", layout="bhsd")
    for b in batches:
        for p in prompts:
            yield GraphSpec(batch=b, seq_q=p, seq_kv=p, mask="causal", **base)
        # decode steps: seq_kv from the shortest prompt + 1 to the longest + new_tokens - 1
        reach = sorted({p + n for p in prompts for n in range(1, new_tokens)})
        for kv in reach:
            yield GraphSpec(batch=b, seq_q=1, seq_kv=kv, **base)


def count(specs: Iterator[GraphSpec], targets: dict[str, Target]) -> tuple[int, int, dict[str, int]]:
    """(distinct exact specs, distinct classes, graphs per target); the exact
    specs are distinct by construction, so only the classes, and the exact
    specs of classes some target cannot serve, are held."""
    exact = 0
    classes: dict[GraphSpec, int] = {}  # class -> exact specs it covers
    for spec in specs:
        exact += 1
        klass = class_of(spec, "pow2")
        assert klass.covers(spec)
        classes[klass] = classes.get(klass, 0) + 1
    graphs = {}
    for name, target in targets.items():
        total = 0
        for klass, covered in classes.items():
            chosen = class_mechanism(klass, target)
            if chosen is None or not chosen.serves:
                total += covered  # every exact shape its own graph
            elif refused(klass, target) is None:
                total += 1
        graphs[name] = total
    return exact, len(classes), graphs


def count_manifest(path: str, targets: dict[str, Target]) -> dict[str, tuple[int, int, int]]:
    """Per target: (graphs stored, classes by padded, entries refused or no mechanism)."""
    from graphcache.ops import manifest

    specs = manifest.load(path)
    rows = {}
    for name, target in targets.items():
        stored = padded = refusals = 0
        for spec in specs:
            chosen = class_mechanism(spec, target)
            if refused(spec, target) is not None or (chosen is not None and not chosen.serves):
                refusals += 1
                continue
            stored += 1
            padded += chosen is not None and chosen.name == "padded"
        rows[name] = (stored, padded, refusals)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds-per-build", type=float, default=0.4, help="cuDNN SDPA build (sglang#4650: ~0.4 s)")
    parser.add_argument("--manifest", action="append", default=[], help="count a manifest's graphs per target too")
    parser.add_argument("--no-workloads", action="store_true", help="only the manifests")
    args = parser.parse_args()
    targets = {name: Target.parse(text) for name, text in TARGETS.items()}
    sec = args.seconds_per_build
    if not args.no_workloads:
        workloads = {
            "llama (8/2 heads d8, prompts 37/200/513, 64 new, b1)": generate_specs(8, 2, 8, [37, 200, 513], 64, [1]),
            "chat (32/8 heads d128, prompts 1..8192, 2048 new, b1..64)": generate_specs(
                32, 8, 128, list(range(1, 8193)), 2048, list(range(1, 65))
            ),
        }
        print(f"cold build time at {sec} s per SDPA build (sglang#4650)")
        print(f"{'workload':58} {'exact':>10} {'classes':>8} {'exact cold':>12} {'classes cold':>13}")
        per_target = {}
        for name, specs in workloads.items():
            exact, classes, graphs = count(specs, targets)
            per_target[name] = graphs
            print(f"{name:58} {exact:>10,} {classes:>8,} {_time(exact * sec):>12} {_time(classes * sec):>13}")
        print()
        print("graphs a deploy stores, per target (cuDNN, on an H200)")
        print(f"{'workload':58} " + " ".join(f"{t.split(' ')[0]:>9}" for t in targets))
        for name, graphs in per_target.items():
            print(f"{name:58} " + " ".join(f"{graphs[t]:>9,}" for t in targets))
    for path in args.manifest:
        print()
        print(f"{path}: graphs stored per target (classes by padded; entries refused or with no mechanism)")
        for name, (stored, padded, refusals) in count_manifest(path, targets).items():
            print(f"  cuDNN {name:38} {stored:>5} graphs ({padded} padded classes), {refusals} refused")


def _time(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


if __name__ == "__main__":
    main()
