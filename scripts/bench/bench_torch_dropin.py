#!/usr/bin/env python3
"""What graphcache.torch's drop-in adds per SDPA call, at a decode shape.

Side by side, interleaved, in one process (batch 1, 8 heads, seq_q 1,
seq_kv 128, head_dim 64, bfloat16, on the CPU):

- hit: ``graphcache.torch.scaled_dot_product_attention`` served from a
  loaded graph, against calling that graph's ``execute`` directly. The graph
  here does no work (it returns a preallocated output): on a GPU the cuDNN
  launch is what the graph costs either way, so the difference between the
  two rows is the drop-in's own cost (key, memo lookup, layout views,
  counters). Loaded through a real GraphCache on a DiskStore in a temp folder.
- fallback: the drop-in running torch's SDPA for a call cuDNN would not
  take (float32) against ``F.scaled_dot_product_attention`` on the same
  tensors.
- op: the same hit through the ``graphcache::sdpa`` custom op (what a
  torch.compile'd graph calls), against the direct graph.
- class: a decode loop whose ``seq_kv`` changes on every call (129..256,
  one class, kv256): the drop-in serves each call from the class graph bound
  to that call shape (GRAPHCACHE_SHAPE_CLASSES=pow2), against calling the
  class graph's ``execute`` directly on the same rotating tensors. The memo
  holds every shape after the first pass (a decode loop's layers after the
  first, and every later request, find them there).
- class new shape: the first call of each of 256 new shapes (kv 257..512,
  class kv512, already loaded): derive, class, bind, memo entry.
- padded: the same decode loop (kv 129..256) served by a class graph of the
  padded mechanism (a cuDNN without execute-time override, 9.19 here: the
  class declared at kv256, each call's k and v copied into the reused buffer
  of that size, graphcache.compilers.padded), against exact hits of the same
  shapes: graphcache's cost of a padded hit, copies included, with the bytes
  copied per call (a call whose memory fits the declared strides is read in
  place: scripts/gpu/bench_classes_gpu.py times both).
- bias: a masked call served by a bias graph (issue 25) against the same
  call without a mask, both through the drop-in: the added cost of turning
  the mask into the graph's bias on the device (a boolean mask: 0 / -inf;
  a float one as it is) and of zeroing the rows that see no key. At the
  decode shape with a (1, 1, 1, 128) boolean and a (1, 8, 1, 128) bfloat16
  mask, and at a 128-token prefill (bhsd) with a (1, 1, 128, 128) boolean one.
- aten: the same hit through PyTorch's own door (issue 42):
  ``torch.ops.aten._scaled_dot_product_cudnn_attention`` after
  ``graphcache.torch.install(dispatch_key="CPU")``, against the hit through
  ``patch()``'s door (``graphcache.torch.scaled_dot_product_attention``, what
  patch() puts in ``torch.nn.functional``), on the same loaded graph: the
  dispatcher's trip to a Python kernel, the op's nine outputs (a logsumexp
  and two philox tensors allocated per call) and its memo key.
- floor: the dispatcher's own share of that, against the same baseline:
  an op of the same schema (``gcbench::floor``) whose CPU kernel is a
  Python function handing back one prepared nine-tuple. What the aten row
  adds over this row is graphcache's own cost at that door.

    python scripts/bench/bench_torch_dropin.py [--calls 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TORCH_SDPA = F.scaled_dot_product_attention  # torch's own, whatever is patched later

import graphcache.torch as gt  # noqa: E402
from graphcache import Artifact, GraphCache, GraphSpec, Target, UidMap  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")


class NullGraph:
    """A loaded graph that does no work, so only the drop-in's cost is timed."""

    backend = "null"

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec
        self.out = torch.zeros(spec.storage_shape("o"), dtype=torch.bfloat16)
        # run_views hands back torch's (b, h, s, d) view, as a cuDNN graph does (made once here).
        self.view = self.out.transpose(1, 2) if spec.layout == "bshd" else self.out

    def execute(self, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        return self.out

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        return self.view


class NullPaddedGraph:
    """A padded class graph that does no work but what graphcache does for
    it: each call's tensors placed as the declared graph reads them (the
    copies into the reused buffers, the seq-len tensors, the declared
    output), then the output's view of the real rows handed back."""

    backend = "null"

    def __init__(self, spec: GraphSpec) -> None:
        self.spec = spec

    def execute(self, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("bound per call shape only")

    def bind(self, spec: GraphSpec) -> Any:
        from graphcache.compilers.padded import PaddedShape

        shape = PaddedShape(self.spec, spec, torch.device("cpu"))

        class Run:
            backend = "null"
            class_spec = self.spec

            def __init__(self) -> None:
                self.spec = spec

            def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
                return shape.output(shape.place(q, k, v, bias))

        return Run()


class NullCompiler:
    """Builds empty artifacts and loads them as ``graph`` (NullGraph unless
    told otherwise; scripts/bench/bench_varlen.py passes its own) for ``target``."""

    name = "null"
    device = None

    def __init__(self, graph: Any = NullGraph, target: Target = TARGET) -> None:
        self.graph = graph
        self._target = target

    def target(self) -> Target:
        return self._target

    def build(self, spec: GraphSpec, target: Target, uids: UidMap | None = None) -> Artifact:
        from graphcache.compilers.cudnn.releases import resolved

        spec = resolved(spec, target)  # a class in the mechanism the target has, as the real compilers build it
        return Artifact(spec=spec, target=target, payload=b"null", uids=uids or UidMap.default(), dialect="null")

    def load(self, artifact: Artifact) -> Any:
        graph = NullPaddedGraph if artifact.spec.is_class and artifact.spec.mechanism == "padded" else self.graph
        return graph(artifact.spec)


_FLOOR_LIB: Any = None


def floor_op(q: torch.Tensor, k: torch.Tensor) -> Any:
    """``gcbench::floor``: the aten op's schema, its CPU kernel a Python
    function that hands back one prepared nine-tuple (the dispatcher's floor)."""
    global _FLOOR_LIB
    if _FLOOR_LIB is None:
        schema = str(torch.ops.aten._scaled_dot_product_cudnn_attention.default._schema)
        _FLOOR_LIB = torch.library.Library("gcbench", "DEF")  # noqa: TOR901 - a benchmark's own op
        _FLOOR_LIB.define("floor" + schema[schema.index("(") :])
        zero = torch.zeros((), dtype=torch.int64)
        lse = torch.empty(q.shape[:3] + (1,), dtype=torch.float32)
        ready = (torch.empty_like(q), lse, None, None, q.shape[2], k.shape[2], zero, zero.clone(), None)
        _FLOOR_LIB.impl("floor", lambda *args, **kwargs: ready, "CPU")
    return torch.ops.gcbench.floor


def per_call_us(fn: Any, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="calls per timing")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians reported)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def tensors(layout: str) -> tuple[torch.Tensor, ...]:
        if layout == "bhsd":
            return (
                torch.randn(1, 8, 1, 64, dtype=torch.bfloat16),
                torch.randn(1, 8, 128, 64, dtype=torch.bfloat16),
                torch.randn(1, 8, 128, 64, dtype=torch.bfloat16),
            )
        return (
            torch.randn(1, 1, 8, 64, dtype=torch.bfloat16).transpose(1, 2),
            torch.randn(1, 128, 8, 64, dtype=torch.bfloat16).transpose(1, 2),
            torch.randn(1, 128, 8, 64, dtype=torch.bfloat16).transpose(1, 2),
        )

    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = GraphCache(DiskStore(Path(tmp) / "store"), NullCompiler())  # type: ignore[arg-type]
        gt.configure(cache, device="cpu", on_miss="build")
        cases = {}
        for layout in ("bhsd", "bshd"):
            q, k, v = tensors(layout)
            spec = gt.spec_for(q, k, v)
            gt.scaled_dot_product_attention(q, k, v)  # builds, stores, loads once
            graph = cache.load(spec)
            qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v)) if layout == "bshd" else (q, k, v)
            cases[f"hit {layout}"] = (
                lambda g=graph, a=(qs, ks, vs): g.execute(*a),
                lambda a=(q, k, v): gt.scaled_dot_product_attention(*a),
            )
            gt.install(dispatch_key="CPU")
            op = torch.ops.aten._scaled_dot_product_cudnn_attention
            op(q, k, v, None, False)  # plans this call shape at the aten door once
            cases[f"aten {layout}"] = (
                lambda a=(q, k, v): gt.scaled_dot_product_attention(*a),
                lambda a=(q, k, v), op=op: op(*a, None, False),
            )
            if layout == "bhsd":
                floor = floor_op(q, k)
                cases["floor bhsd"] = (
                    lambda a=(q, k, v): gt.scaled_dot_product_attention(*a),
                    lambda a=(q, k, v), op=floor: op(*a, None, False),
                )
                cases["op (custom op) bhsd"] = (
                    lambda g=graph, a=(qs, ks, vs): g.execute(*a),
                    lambda a=(q, k, v): torch.ops.graphcache.sdpa(*a, None, 0.0, False, None, False),
                )
        q, k, v = tensors("bhsd")
        bool_mask = torch.rand(1, 1, 1, 128) > 0.2
        float_mask = torch.randn(1, 8, 1, 128, dtype=torch.bfloat16)
        pq, pk, pv = (torch.randn(1, 8, 128, 64, dtype=torch.bfloat16) for _ in range(3))
        prefill_mask = torch.ones(128, 128, dtype=torch.bool).tril().view(1, 1, 128, 128)
        for mask_args in ((q, k, v, bool_mask), (q, k, v, float_mask), (pq, pk, pv), (pq, pk, pv, prefill_mask)):
            gt.scaled_dot_product_attention(*mask_args)  # builds, stores, loads each bias graph once
        cases["bias decode bool b1ss"] = (
            lambda a=(q, k, v): gt.scaled_dot_product_attention(*a),
            lambda a=(q, k, v, bool_mask): gt.scaled_dot_product_attention(*a),
        )
        cases["bias decode float 1hss"] = (
            lambda a=(q, k, v): gt.scaled_dot_product_attention(*a),
            lambda a=(q, k, v, float_mask): gt.scaled_dot_product_attention(*a),
        )
        cases["bias q128 bool b1ss"] = (
            lambda a=(pq, pk, pv): gt.scaled_dot_product_attention(*a),
            lambda a=(pq, pk, pv, prefill_mask): gt.scaled_dot_product_attention(*a),
        )
        klass_cache = GraphCache(DiskStore(Path(tmp) / "classes"), NullCompiler(), shape_classes="pow2")  # type: ignore[arg-type]
        gt.configure(klass_cache, device="cpu", on_miss="build")
        q1 = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
        steps = [
            (q1, torch.randn(1, 8, n, 64, dtype=torch.bfloat16), torch.randn(1, 8, n, 64, dtype=torch.bfloat16))
            for n in range(129, 257)
        ]
        for step in steps:  # the first pass: the class graph is built and loaded once, each shape bound once
            gt.scaled_dot_product_attention(*step)
        klass_graph = klass_cache.load(gt.spec_for(*steps[0]))
        assert klass_graph.spec.is_class, klass_graph.spec
        direct, ours = itertools.cycle(steps), itertools.cycle(steps)
        cases["class decode kv129-256"] = (
            lambda g=klass_graph, it=direct: g.execute(*next(it)),
            lambda it=ours: gt.scaled_dot_product_attention(*next(it)),
        )
        fresh = [
            (q1, torch.randn(1, 8, n, 64, dtype=torch.bfloat16), torch.randn(1, 8, n, 64, dtype=torch.bfloat16))
            for n in range(257, 513)
        ]
        gt.scaled_dot_product_attention(*fresh.pop())  # loads the kv512 class
        t0 = time.perf_counter()
        for step in fresh:
            gt.scaled_dot_product_attention(*step)
        new_shape_us = (time.perf_counter() - t0) / len(fresh) * 1e6
        t0 = time.perf_counter()
        for step in fresh:
            klass_graph.execute(*step)
        new_shape_base_us = (time.perf_counter() - t0) / len(fresh) * 1e6
        class_stats = gt.stats()
        # The same decode loop on a cuDNN without override: the class is padded; against exact hits.
        old_cudnn = Target.parse("h200-sm90-cudnn9.19.0-fe1.28.0")
        exact_old = GraphCache(
            DiskStore(Path(tmp) / "exact-old"), NullCompiler(target=old_cudnn), shape_classes="exact"
        )  # type: ignore[arg-type]
        padded_old = GraphCache(
            DiskStore(Path(tmp) / "padded-old"), NullCompiler(target=old_cudnn), shape_classes="pow2"
        )  # type: ignore[arg-type]
        from graphcache.compilers import padded as padded_mod

        runs = {}
        for name, klass_of in (("exact", exact_old), ("padded", padded_old)):
            gt.configure(klass_of, device="cpu", on_miss="build")
            for step in steps:
                gt.scaled_dot_product_attention(*step)
            runs[name] = gt.RUNTIME._memo.copy()  # the plans of every shape, as a warmed worker holds them
        padded_copies = {}

        def served_by(memo: dict[Any, Any], it: Any) -> Any:
            """A call served from ``memo``'s plans, the runtime's own memo put back after (both sides alike)."""

            def call() -> Any:
                home, gt.RUNTIME._memo = gt.RUNTIME._memo, memo
                try:
                    return gt.scaled_dot_product_attention(*next(it))
                finally:
                    gt.RUNTIME._memo = home

            return call

        for name, loop in (("padded decode kv129-256", steps),):
            cases[name] = (
                served_by(runs["exact"], itertools.cycle(loop)),
                served_by(runs["padded"], itertools.cycle(loop)),
            )
            padded_mod.reset()
            once = served_by(runs["padded"], iter(loop))
            for _ in loop:
                once()
            padded_copies[name] = sum(r["bytes"] for r in padded_mod.copies().values()) / len(loop)
        gt.RUNTIME._memo = {}  # configure() clears the memo it finds: not the ones kept above
        gt.configure(cache, device="cpu", on_miss="build")
        q, k, v = tensors("bhsd")
        # Float32 on the CPU: cuDNN would not take it, so the drop-in runs torch's SDPA.
        qf, kf, vf = (t.float() for t in (q, k, v))
        cases["fallback bhsd fp32"] = (
            lambda: TORCH_SDPA(qf, kf, vf),
            lambda: gt.scaled_dot_product_attention(qf, kf, vf),
        )
        for _ in range(args.rounds):
            for name, (base, ours) in cases.items():
                calls = args.calls // 10 if name.startswith("fallback") else args.calls
                rows.setdefault(name + " base", []).append(per_call_us(base, calls))
                rows.setdefault(name + " ours", []).append(per_call_us(ours, calls))
        stats = gt.stats()
    print(
        f"decode shape b1 h8 s1/128 d64 bf16, CPU, torch {torch.__version__}, 1 thread, "
        f"{args.rounds} interleaved rounds x {args.calls} calls (fallback: {args.calls // 10})"
    )
    print("per call, median over rounds; 'added min' is the quietest round (the machine may be shared)")
    print(f"{'case':22} {'baseline us':>12} {'drop-in us':>11} {'added us':>9} {'added min':>10}  baseline")
    baselines = {
        "hit": "graph.execute() direct",
        "op": "graph.execute() direct",
        "fallback": "F.scaled_dot_product_attention",
        "class": "class graph.execute() direct",
        "padded": "exact hits of the same shapes (drop-in)",
        "bias": "the same call without a mask (drop-in hit)",
        "aten": "the same hit through patch()'s door",
        "floor": "the same hit through patch()'s door",
    }
    for name in cases:
        base, ours = rows[name + " base"], rows[name + " ours"]
        added = [o - b for o, b in zip(ours, base, strict=True)]
        print(
            f"{name:22} {statistics.median(base):12.2f} {statistics.median(ours):11.2f} "
            f"{statistics.median(added):9.2f} {min(added):10.2f}  {baselines[name.split()[0]]}"
        )
    print(
        f"{'class new shape':22} {new_shape_base_us:12.2f} {new_shape_us:11.2f} {new_shape_us - new_shape_base_us:9.2f} "
        f"{'':>10}  first call of each of {len(fresh)} new shapes (one pass)"
    )
    for name, nbytes in padded_copies.items():
        print(f"{name}: {nbytes / 1024:.0f} KiB copied a call (k and v into the class's buffers)")
    print(
        f"drop-in stats: {stats['served_from_store']} served from the store, {stats['built_here']} by graphs built "
        f"here, fallbacks {stats['fallbacks']}, graphs {stats['graphs_loaded']}"
    )
    doors = ", ".join(
        f"{name} {door['hits']} from the store, {door['built_here']} built here"
        for name, door in stats["doors"].items()
    )
    print(f"by door: {doors}")
    print(
        f"class run: graphs {class_stats['graphs_loaded']}, call shapes served {class_stats['shapes_served']}, "
        f"{class_stats['served_from_store']} served from the store, {class_stats['built_here']} by graphs built here"
    )


if __name__ == "__main__":
    main()
