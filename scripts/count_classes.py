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

    python scripts/count_classes.py [--seconds-per-build 0.4]      (about 2 minutes: 1.2 million specs)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphcache import GraphSpec  # noqa: E402
from graphcache.spec.classes import class_of  # noqa: E402


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


def count(specs: Iterator[GraphSpec]) -> tuple[int, int]:
    """(distinct exact specs, distinct classes); the exact specs are
    distinct by construction, so only the classes are held."""
    exact = 0
    classes: set[GraphSpec] = set()
    for spec in specs:
        exact += 1
        klass = class_of(spec, "pow2")
        assert klass.covers(spec)
        classes.add(klass)
    return exact, len(classes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds-per-build", type=float, default=0.4, help="cuDNN SDPA build (sglang#4650: ~0.4 s)")
    args = parser.parse_args()
    workloads = {
        "llama (8/2 heads d8, prompts 37/200/513, 64 new, b1)": generate_specs(8, 2, 8, [37, 200, 513], 64, [1]),
        "chat (32/8 heads d128, prompts 1..8192, 2048 new, b1..64)": generate_specs(
            32, 8, 128, list(range(1, 8193)), 2048, list(range(1, 65))
        ),
    }
    sec = args.seconds_per_build
    print(f"cold build time at {sec} s per SDPA build (sglang#4650)")
    print(f"{'workload':58} {'exact':>10} {'classes':>8} {'exact cold':>12} {'classes cold':>13}")
    for name, specs in workloads.items():
        exact, classes = count(specs)
        print(f"{name:58} {exact:>10,} {classes:>8,} {_time(exact * sec):>12} {_time(classes * sec):>13}")


def _time(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


if __name__ == "__main__":
    main()
