#!/usr/bin/env python3
"""What a call costs by mechanism, on a GPU: each real shape through its exact
graph, its class in the padded form (declared at the class's maxima, no
execute-time override: every cuDNN PyTorch bundles below 9.21; k and v as a
DynamicCache hands them, copied every call, and for decode also as views of a
static cache as long as the class, read in place) and, where the target's
cuDNN has it (>= 9.21, frontend >= 1.24), through override. Decode and
prefill, batch 1 to 64, Llama-3-8B's heads (32/8, d128, bf16). Every graph
is built here with its reference check, and timed on the drop-in's per-call
path (graphcache.ops.classbench), copies included. Run by
scripts/gpu/gpu_check.sh (step "classes"). Not yet run on a GPU.

    python scripts/gpu/bench_classes_gpu.py [--repeat 100] [--json out.json] [--quick]
    python scripts/gpu/bench_classes_gpu.py --compiler reference   # the CPU dry run (no cuDNN timed)

With --compiler reference, GRAPHCACHE_REFERENCE_CUDNN=9.19.0 walks the padded
path of a cuDNN 9.19 worker on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache import GraphSpec  # noqa: E402

HEADS = dict(heads_q=32, heads_kv=8, head_dim=128, dtype="bfloat16")
# (batch, seq_q, seq_kv, mask): decode over a cache, prefill of a prompt.
SHAPES = [
    (1, 1, 1000, "none"),
    (8, 1, 1000, "none"),
    (64, 1, 1000, "none"),
    (1, 1, 3000, "none"),
    (8, 1, 3000, "none"),
    (1, 300, 300, "causal"),
    (8, 300, 300, "causal"),
    (1, 3000, 3000, "causal"),
]
QUICK = [(1, 1, 200, "none"), (3, 1, 200, "none"), (1, 150, 150, "causal")]  # the CPU dry run's small heads
QUICK_HEADS = dict(heads_q=8, heads_kv=2, head_dim=64, dtype="bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--json", default=None)
    parser.add_argument("--compiler", default="cudnn", help="cudnn (a GPU), or reference (the CPU dry run)")
    parser.add_argument(
        "--quick", action="store_true", help="three small shapes (the default with --compiler reference)"
    )
    args = parser.parse_args()

    from graphcache.compilers.named import compiler_named
    from graphcache.ops.classbench import WAYS, compare, table

    compiler = compiler_named(args.compiler)
    quick = args.quick or args.compiler == "reference"
    shapes, heads = (QUICK, QUICK_HEADS) if quick else (SHAPES, HEADS)
    specs = [
        GraphSpec(batch=b, seq_q=sq, seq_kv=skv, mask=mask, layout="bhsd", layout_q="bshd" if sq > 1 else None, **heads)
        for b, sq, skv, mask in shapes
    ]
    print(f"target {compiler.target()}: per call, on the drop-in's path (copies included), {args.repeat} calls a way")
    rows = compare(specs, compiler, repeat=args.repeat, progress=lambda s: print(f"  timing {s}", flush=True))
    header = ["call", "class", *WAYS]
    cells = table(rows)
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
    for line in [header, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    {
                        "call": r.spec.to_dict(),
                        "class": r.klass.to_dict(),
                        **{
                            name: {"us": t.us, "copied_bytes": t.copied_bytes, "note": t.note}
                            for name, t in r.timings.items()
                        },
                    }
                    for r in rows
                ],
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
