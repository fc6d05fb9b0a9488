#!/usr/bin/env python3
"""What graphcache.torch.varlen_attn costs per call on a hit, at a serving
engine's shapes (32 query heads over 8 KV heads, head_dim 128, bfloat16; a
pool of 2048 pages of 16 tokens, block tables 256 pages wide), on the CPU.

Side by side, interleaved, in one process:

- offsets: the graph's per-call index tensors (``varlen_args.graph_inputs``:
  offsets, lengths, padded tables; what ``CudnnGraph.run_varlen`` computes on
  the GPU before its launch) plus the output allocation, against a Python
  call returning a preallocated output.
- hit: ``graphcache.torch.varlen_attn`` on a loaded graph against that
  graph's ``run_varlen`` called directly; the graph does the offset
  arithmetic above and no attention (on a GPU the cuDNN launch is what the
  graph costs either way), so the difference is the drop-in's own: the memo
  key, one dict lookup, the grad check, the counter.
- memo: the same with a graph that does nothing, so the drop-in's own cost
  is not the difference of two large, noisy numbers.

Cases: paged decode of 20 sequences (class batch 32) and a ragged prefill of
5 prompts (class batch 8, q/kv class 128). GPU: not yet run.

    python scripts/bench/bench_varlen.py [--calls 5000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

# The null compiler, target and timer of the dense drop-in bench (this folder is on sys.path).
from bench_torch_dropin import NullCompiler, per_call_us  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, GraphSpec  # noqa: E402
from graphcache.compilers.varlen_args import graph_inputs  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from graphcache.torch.varlen.thd_spec import varlen_spec  # noqa: E402


class OffsetsGraph:
    """A loaded thd graph that does the per-call index arithmetic and
    allocates the output, and no attention."""

    backend = "null"

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec

    def run_varlen(self, q: Any, k: Any, v: Any, cu_seq_q: Any, cu_seq_k: Any, seqused_k: Any = None,
                   block_table: Any = None) -> tuple[Any, Any]:  # fmt: skip
        graph_inputs(self.spec, cu_seq_q, cu_seq_k, seqused_k, block_table)
        return torch.empty_like(q), None


class NullGraph(OffsetsGraph):
    """A loaded thd graph that does nothing: only the drop-in's own cost is timed."""

    def run_varlen(self, q: Any, k: Any, v: Any, cu_seq_q: Any, cu_seq_k: Any, seqused_k: Any = None,
                   block_table: Any = None) -> tuple[Any, Any]:  # fmt: skip
        return q, None


def cases() -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    bf16 = torch.bfloat16
    n = 20
    pool = torch.randn(2048, 16, 8, 128, generator=g).to(bf16)
    decode = (
        torch.randn(n, 32, 128, generator=g).to(bf16), pool, pool,
        torch.arange(n + 1, dtype=torch.int32), None, 1, 1000,
    )  # fmt: skip
    decode_kw = {
        "window_size": (-1, 0),
        "enable_gqa": True,
        "seqused_k": torch.randint(1, 1000, (n,), generator=g, dtype=torch.int32),
        "block_table": torch.randint(0, 2048, (n, 256), generator=g, dtype=torch.int32),
    }
    lens = torch.tensor([0, 37, 90, 128, 5, 64])
    cu = lens.cumsum(0).to(torch.int32)
    total = int(cu[-1])
    prefill = (
        torch.randn(total, 32, 128, generator=g).to(bf16), torch.randn(total, 8, 128, generator=g).to(bf16),
        torch.randn(total, 8, 128, generator=g).to(bf16), cu, cu, 128, 128,
    )  # fmt: skip
    return {"paged decode n20": (decode, decode_kw), "ragged prefill n5": (prefill, {"window_size": (-1, 0),
                                                                                    "enable_gqa": True})}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians reported)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = GraphCache(DiskStore(Path(tmp) / "store"), NullCompiler(OffsetsGraph), shape_classes="pow2")  # type: ignore[arg-type]
        gt.configure(cache, device="cpu", on_miss="build")
        timed = {}
        for name, (call, kw) in cases().items():
            gt.varlen_attn(*call, **kw)  # builds, stores, loads once
            graph = cache.load(varlen_spec(*call, **kw))  # the class graph the drop-in holds
            q, k, v, cu_q, cu_k = call[:5]
            used, table = kw.get("seqused_k"), kw.get("block_table")
            out = torch.empty_like(q)
            timed[f"offsets {name}"] = (
                lambda o=out: o,
                lambda a=(q, k, v, cu_q, cu_k, used, table), g=graph: g.run_varlen(*a),
            )
            timed[f"hit {name}"] = (lambda a=(q, k, v, cu_q, cu_k, used, table), g=graph: g.run_varlen(*a),
                                    lambda c=call, w=kw: gt.varlen_attn(*c, **w))  # fmt: skip
        for _ in range(args.rounds):
            for name, (base, drop) in timed.items():
                rows.setdefault(name, []).append((per_call_us(base, args.calls), per_call_us(drop, args.calls)))
        null = GraphCache(DiskStore(Path(tmp) / "null"), NullCompiler(NullGraph), shape_classes="pow2")  # type: ignore[arg-type]
        gt.configure(null, device="cpu", on_miss="build")
        timed = {}
        for name, (call, kw) in cases().items():
            gt.varlen_attn(*call, **kw)
            graph = null.load(varlen_spec(*call, **kw))
            direct = (*call[:5], kw.get("seqused_k"), kw.get("block_table"))
            timed[f"memo {name}"] = (
                lambda a=direct, g=graph: g.run_varlen(*a),
                lambda c=call, w=kw: gt.varlen_attn(*c, **w),
            )
        for _ in range(args.rounds):
            for name, (base, drop) in timed.items():
                rows.setdefault(name, []).append((per_call_us(base, args.calls), per_call_us(drop, args.calls)))
        stats = gt.stats()
    print(f"torch {torch.__version__}, CPU, one thread; {args.rounds} rounds of {args.calls} calls; medians")
    print(f"{'case':28} {'baseline us':>11} {'measured us':>11} {'added us':>9} {'added min':>9}")
    for name, samples in rows.items():
        base = statistics.median(b for b, _ in samples)
        drop = statistics.median(d for _, d in samples)
        added_min = min(d - b for b, d in samples)
        print(f"{name:28} {base:11.2f} {drop:11.2f} {drop - base:9.2f} {added_min:9.2f}")
    print(
        f"drop-in counters: {stats['served_from_store']} served from the store, "
        f"{stats['built_here']} by graphs built here, fallbacks {stats['fallbacks']}"
    )


if __name__ == "__main__":
    main()
