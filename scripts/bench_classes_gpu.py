#!/usr/bin/env python3
"""Class graphs on a GPU: the error of a class graph against the float32
reference at off-tile real shapes, and its execute time at a short real
shape against the exact graph of that shape (cuDNN warns a long declaration
can run short rows about 2x slower, cudnn-frontend#1087). Needs a GPU; run by
scripts/gpu_check.sh. Not yet run on a GPU.

    python scripts/bench_classes_gpu.py [--repeat 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphcache import GraphSpec  # noqa: E402
from graphcache.spec.classes import class_of  # noqa: E402

# (exact short shape, what it stands for)
CASES = [
    (
        dict(batch=8, heads_q=32, heads_kv=8, seq_q=1, seq_kv=130, head_dim=128, dtype="bfloat16"),
        "decode, kv 130 in kv256",
    ),
    (
        dict(batch=8, heads_q=32, heads_kv=8, seq_q=4, seq_kv=4, head_dim=128, dtype="bfloat16", mask="causal"),
        "4-row prefill in q128",
    ),
    (
        dict(batch=1, heads_q=32, heads_kv=8, seq_q=300, seq_kv=300, head_dim=128, dtype="bfloat16", mask="causal"),
        "prefill 300 in q512",
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    from graphcache.compilers.cudnn import CudnnCompiler
    from graphcache.compilers.cudnn.override import check_shapes
    from graphcache.compilers.torch_sdpa import random_inputs, reference_error

    compiler = CudnnCompiler()
    print(f"target {compiler.target()}")
    rows = []
    for fields, what in CASES:
        exact = GraphSpec(**fields)
        klass = class_of(exact, "pow2")
        row: dict = {"case": what, "exact": exact.summary(), "class": klass.summary()}
        try:
            class_graph = compiler.load(compiler.build(klass))
            exact_graph = compiler.load(compiler.build(exact))
        except Exception as exc:  # noqa: BLE001 - reported, the other cases still run
            row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            print(f"{what}: {row['error'][:200]}")
            continue
        errors = {}
        for real in check_shapes(klass):
            feed = random_inputs(real, "cuda", seed=3)
            result = class_graph.execute(**feed)
            errors[f"b{real.batch} q{real.seq_q} kv{real.seq_kv}"] = reference_error(
                real, result[0] if real.generate_stats else result, feed
            )
        feed = random_inputs(exact, "cuda", seed=5)
        times = {}
        for name, graph in (("class", class_graph), ("exact", exact_graph)):
            for _ in range(10):
                graph.execute(**feed)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.repeat):
                graph.execute(**feed)
            end.record()
            torch.cuda.synchronize()
            times[name] = start.elapsed_time(end) / args.repeat * 1e3  # us
        row.update(
            errors=errors, class_us=times["class"], exact_us=times["exact"], ratio=times["class"] / times["exact"]
        )
        rows.append(row)
        print(
            f"{what:28} class {times['class']:8.1f} us  exact {times['exact']:8.1f} us  ratio {row['ratio']:.2f}  "
            f"max error {max(errors.values()):.2e} at {max(errors, key=errors.get)}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
