"""``graphcache bench``: cold build against warm start, phase by phase.

Every cold and warm sample is a fresh process (graphcache.ops.benchrun):
cold builds from nothing and runs once; warm fetches from the server or the
local store, verifies, deserializes and runs once. Medians of ``repeat``
samples. The reference compiler (no GPU) is measured the same way, its
figures said to be the reference's. Without a GPU, with the cudnn compiler, bench
measures what it can (fetch and verify of the artifacts named by
``target``, in this process) and says that the GPU phases need a GPU.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from graphcache.artifact import Artifact
from graphcache.errors import CorruptArtifact, GraphCacheError, NoGpu
from graphcache.key import key_for
from graphcache.spec import GraphSpec
from graphcache.stores.base import Store
from graphcache.target import Target

NO_GPU_NOTE = (
    "no GPU on this machine: cold build, deserialize and first execute need one, so only fetch and verify were measured"
)


def has_gpu() -> bool:
    try:
        Target.detect()
    except NoGpu:
        return False
    return True


def _median_phases(samples: list[dict[str, Any]]) -> dict[str, Any]:
    phases = {name: statistics.median(s["phases"][name] for s in samples) for name in samples[0]["phases"]}
    return {
        "phases": phases,
        "total": statistics.median(s["total"] for s in samples),
        "init": statistics.median(s["init"] for s in samples),
        "samples": len(samples),
        "pids": [s["pid"] for s in samples if "pid" in s],  # the fresh process of each sample
    }


def _fresh(mode: str, spec: GraphSpec, *extra: str, timeout: float = 1800) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "graphcache.ops.benchrun", mode, spec.canonical_json(), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise GraphCacheError(f"bench {mode} of {spec.summary()} failed: {out.stderr.strip()[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def bench_gpu(
    specs: list[GraphSpec],
    store: Store,
    location: str,
    repeat: int,
    *,
    memory: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Cold vs warm on this GPU. ``location`` names ``store`` for the fresh
    processes (a folder or a service URL); missing artifacts are built first."""
    from graphcache.cache import GraphCache
    from graphcache.compilers.cudnn import CudnnCompiler

    compiler = CudnnCompiler()
    target = compiler.target()
    cache = GraphCache(store, compiler)
    rows: list[dict[str, Any]] = []
    for spec, _key, row in _rows(specs, target, progress):
        try:
            cache.get(spec)  # the warm side needs the artifact stored
            cold = []
            warm = []
            for i in range(repeat):
                if progress:
                    progress(f"{len(rows) + 1}/{len(specs)} {spec.summary()}: cold and warm sample {i + 1}/{repeat}")
                cold.append(_fresh("cold", spec))
                warm.append(_fresh("warm", spec, location))
            row["cold"] = _median_phases(cold)
            row["warm"] = _median_phases(warm)
            row["speedup"] = row["cold"]["total"] / row["warm"]["total"]
            row["dialect"] = cold[0].get("dialect")
            if memory:
                row["memory"] = _fresh("memory", spec)
        except GraphCacheError as exc:
            row["error"] = str(exc)
        rows.append(row)
    return {"gpu": True, "target": str(target), "repeat": repeat, "specs": rows}


def _rows(
    specs: list[GraphSpec], target: Target, progress: Callable[[str], None] | None
) -> Iterator[tuple[GraphSpec, str, dict[str, Any]]]:
    """Each spec, its key on ``target`` and the start of its report row,
    after telling ``progress`` which spec is next (``2/6 SPEC``)."""
    for i, spec in enumerate(specs):
        if progress:
            progress(f"{i + 1}/{len(specs)} {spec.summary()}")
        key = key_for(spec, target)
        yield spec, key, {"spec": spec.to_dict(), "summary": spec.summary(), "key": key}


def bench_fetch(
    specs: list[GraphSpec],
    store: Store,
    target: Target,
    repeat: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """What a machine with no GPU can measure: fetch and verify per spec."""
    rows = []
    for _, key, row in _rows(specs, target, progress):
        fetch, verify = [], []
        size = 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            data = store.get(key)
            fetch.append(time.perf_counter() - t0)
            if data is None:
                row["error"] = f"missing: no artifact for {target} in {store!r} (warm it on a {target.gpu} host)"
                break
            size = len(data)
            t0 = time.perf_counter()
            try:
                Artifact.decode(data, expected_key=key)
            except CorruptArtifact as exc:
                row["error"] = f"corrupt: {exc}"
                break
            verify.append(time.perf_counter() - t0)
        if "error" not in row:
            row["warm"] = {
                "phases": {"fetch": statistics.median(fetch), "verify": statistics.median(verify)},
                "samples": repeat,
            }
            row["warm"]["total"] = sum(row["warm"]["phases"].values())
            row["bytes"] = size
        rows.append(row)
    return {"gpu": False, "target": str(target), "repeat": repeat, "note": NO_GPU_NOTE, "specs": rows}


REFERENCE_NOTE = (
    "measured the reference compiler (torch SDPA on this machine's CPU), not cuDNN: "
    "these figures say nothing about cuDNN's build or load times; run bench on a GPU host for those"
)


def bench_reference(
    specs: list[GraphSpec],
    store: Store,
    location: str,
    repeat: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Cold (build, load, first run) against warm (fetch, verify, load, first
    run) with the reference compiler, as on a GPU: every sample a fresh
    process (graphcache.ops.benchrun), medians of ``repeat``; ``location``
    names ``store`` for those processes. Missing artifacts are built and
    stored first."""
    from graphcache.cache import GraphCache
    from graphcache.compilers.reference import ReferenceCompiler

    compiler = ReferenceCompiler()
    target = compiler.target()
    cache = GraphCache(store, compiler, shape_classes="exact")
    rows: list[dict[str, Any]] = []
    for spec, _key, row in _rows(specs, target, progress):
        try:
            cache.get(spec)  # the warm side needs the artifact stored
            cold, warm = [], []
            for i in range(repeat):
                if progress:
                    progress(f"{len(rows) + 1}/{len(specs)} {spec.summary()}: cold and warm sample {i + 1}/{repeat}")
                cold.append(_fresh("cold", spec, "--compiler", "reference"))
                warm.append(_fresh("warm", spec, location, "--compiler", "reference"))
            row["cold"], row["warm"] = _median_phases(cold), _median_phases(warm)
            row["speedup"] = row["cold"]["total"] / row["warm"]["total"]
            row["dialect"] = "reference"
        except GraphCacheError as exc:
            row["error"] = str(exc)
        rows.append(row)
    return {
        "gpu": False,
        "compiler": "reference",
        "target": str(target),
        "repeat": repeat,
        "note": REFERENCE_NOTE,
        "specs": rows,
    }


def plot(report: dict[str, Any], path: str | Path) -> None:
    """A bar chart: cold and warm seconds per spec, stacked by phase (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["specs"] if "warm" in r]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.9 * max(len(rows), 1)))
    cmap = plt.get_cmap("tab20")
    colours = [cmap(i) for i in range(cmap.N)]
    phase_names: list[str] = []
    for r in rows:
        for side in ("cold", "warm"):
            for name in r.get(side, {}).get("phases", {}):
                if name not in phase_names:
                    phase_names.append(name)
    labels = []
    y = 0.0
    drawn: set[str] = set()
    for r in rows:
        for side in ("cold", "warm"):
            if side not in r:
                continue
            left = 0.0
            for name, seconds in r[side]["phases"].items():
                ms = seconds * 1e3
                colour = colours[phase_names.index(name) % len(colours)]
                ax.barh(y, ms, left=left, color=colour, label=None if name in drawn else name)
                drawn.add(name)
                left += ms
            ax.text(left, y, f" {left:.2f} ms", va="center", fontsize=8)
            labels.append((y, f"{r['summary']}\n{side}"))
            y += 1
        y += 0.5
    ax.set_yticks([p for p, _ in labels], [t for _, t in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds (median)")
    # Matplotlib warns (on the user's terminal) about a log axis with nothing
    # above zero and a legend with no entries: neither is asked of it.
    positive = any(s > 0 for r in rows for side in ("cold", "warm") for s in r.get(side, {}).get("phases", {}).values())
    if report.get("gpu"):
        if positive:
            ax.set_xscale("log")
        ax.set_title(f"graphcache: cold build vs warm start on {report['target']}")
    else:
        ax.set_title(f"graphcache: fetch + verify of {report['target']} artifacts (no GPU here)")
    if drawn:
        ax.legend(fontsize=8, loc="lower right")
    if not rows:
        ax.text(0.5, 0.5, "no spec was measured warm", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
