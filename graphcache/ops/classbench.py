"""What a call costs by mechanism: one exact spec's call timed through its
exact graph, its class in the ``padded`` form (declared at the class's
maxima, copies included) and, where the target has execute-time override,
its class through override: the figure that decides, per target, whether a
class is worth its copies (``graphcache bench --classes``,
scripts/gpu/bench_classes_gpu.py).

Each graph is built here (the compiler's build, with its reference check),
bound to the call's exact spec as the drop-in binds it, and timed on the
drop-in's per-call path (``run_views``: torch's (b, h, s, d) views in, the
output's view out), so a padded class's copies are in its time. Decode calls
are timed twice for padded: k/v as a DynamicCache hands them (contiguous at
the real length: copied every call) and as a static cache does (views of a
cache as long as the class: read in place). On a GPU, CUDA events time the
calls; elsewhere (the reference compiler) wall time, which says nothing
about cuDNN.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphcache.compilers.cudnn.releases import Mechanism, class_mechanism
from graphcache.spec import GraphSpec
from graphcache.spec.classes import class_of

Progress = Callable[[str], None]


@dataclass
class Timing:
    """One way of serving a call: microseconds per call, bytes copied per call, or why it did not run."""

    us: float | None = None
    copied_bytes: int = 0
    note: str = ""


@dataclass
class ClassRow:
    """The call ``spec`` served each way (``exact``, ``padded``, ``padded in place`` for decode over a
    static cache, ``override``), and its class."""

    spec: GraphSpec
    klass: GraphSpec
    timings: dict[str, Timing] = field(default_factory=dict)

    def ratio(self, name: str) -> float | None:
        """``name``'s time over the exact graph's (None where either did not run)."""
        mine, exact = self.timings.get(name), self.timings.get("exact")
        if mine is None or exact is None or mine.us is None or not exact.us:
            return None
        return mine.us / exact.us


WAYS = ("exact", "padded", "padded in place", "override")


def compare(
    specs: list[GraphSpec], compiler: Any, *, repeat: int = 100, progress: Progress | None = None
) -> list[ClassRow]:
    """Time every exact spec of ``specs`` each way on ``compiler``'s target
    (its device: CUDA for the cuDNN compiler, the CPU for the reference).
    A way the target cannot serve says why in its note."""
    import torch

    target = compiler.target()
    device = torch.device("cuda", compiler.device) if getattr(compiler, "name", "") == "cudnn" else torch.device("cpu")
    rows = []
    for spec in specs:
        klass = class_of(spec, "pow2")
        row = ClassRow(spec, klass)
        if progress:
            progress(spec.summary())
        graphs: dict[str, GraphSpec] = {"exact": spec}
        if klass != spec:
            graphs["padded"] = klass.replace(mechanism=Mechanism.PADDED)
            chosen = class_mechanism(klass, target)
            if chosen is not None and chosen.name == Mechanism.OVERRIDE and chosen.serves:
                graphs["override"] = klass
            else:
                row.timings["override"] = Timing(note=chosen.why if chosen is not None else "no class")
        for name, graph_spec in graphs.items():
            try:
                graph = _bound(compiler, graph_spec, spec)
            except Exception as exc:  # noqa: BLE001 - reported in the row, the other ways still run
                row.timings[name] = Timing(note=f"{type(exc).__name__}: {exc}"[:300])
                continue
            row.timings[name] = _time(graph, _inputs(spec, device), repeat, device)
            if name == "padded" and spec.seq_q == 1:
                row.timings["padded in place"] = _time(graph, _inputs(spec, device, cache=klass), repeat, device)
        rows.append(row)
    return rows


def _bound(compiler: Any, graph_spec: GraphSpec, spec: GraphSpec) -> Any:
    from graphcache.compilers.classgraph import bind

    graph = compiler.load(compiler.build(graph_spec, compiler.target()))
    return bind(graph, spec)


def _inputs(spec: GraphSpec, device: Any, cache: GraphSpec | None = None) -> tuple[Any, Any, Any]:
    """(b, h, s, d) views of q, k, v in the spec's layouts; with ``cache``,
    k and v are views of a buffer as long as that class (a static cache)."""
    import torch

    from graphcache.compilers.classgraph import bhsd_view
    from graphcache.reference.dense import torch_dtype

    gen = torch.Generator(device="cpu").manual_seed(0)
    dtype = torch_dtype(spec)
    views = []
    for role in ("q", "k", "v"):
        if cache is not None and role != "q":
            held = cache.at(cache.batch, spec.seq_q, cache.seq_kv or spec.seq_q)
            full = torch.randn(held.storage_shape(role), generator=gen).to(device=device, dtype=dtype)
            stored = full[tuple(slice(0, n) for n in spec.storage_shape(role))]
            views.append(bhsd_view(spec, role, stored))
            continue
        stored = torch.randn(spec.storage_shape(role), generator=gen).to(device=device, dtype=dtype)
        views.append(bhsd_view(spec, role, stored))
    return views[0], views[1], views[2]


def _time(graph: Any, inputs: tuple[Any, Any, Any], repeat: int, device: Any) -> Timing:
    import torch

    from graphcache.compilers import padded

    q, k, v = inputs
    run = graph.run_views
    for _ in range(3):
        run(q, k, v)
    before = sum(row["bytes"] for row in padded.copies().values())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            run(q, k, v)
        end.record()
        torch.cuda.synchronize(device)
        us = start.elapsed_time(end) * 1e3 / repeat
    else:
        t0 = time.perf_counter()
        for _ in range(repeat):
            run(q, k, v)
        us = (time.perf_counter() - t0) * 1e6 / repeat
    copied = sum(row["bytes"] for row in padded.copies().values()) - before
    return Timing(us=us, copied_bytes=copied // repeat)


def table(rows: list[ClassRow]) -> list[list[str]]:
    """The report as text cells: the call, its class, each way's us (x exact) and bytes copied a call."""
    out = []
    for row in rows:
        cells = [row.spec.summary(), row.klass.summary() if row.klass != row.spec else "(no class)"]
        for name in WAYS:
            timing = row.timings.get(name)
            if timing is None:
                cells.append("")
            elif timing.us is None:
                cells.append(f"n/a: {timing.note[:60]}")
            else:
                ratio = row.ratio(name)
                text = f"{timing.us:.1f} us" + ("" if ratio is None or name == "exact" else f" ({ratio:.2f}x)")
                if timing.copied_bytes:
                    text += f", {timing.copied_bytes / 1024:.0f} KiB copied"
                cells.append(text)
        out.append(cells)
    return out
