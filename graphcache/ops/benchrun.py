"""One measurement in a fresh process, for ``graphcache bench``.

    python -m graphcache.ops.benchrun cold SPEC_JSON [--compiler reference]
    python -m graphcache.ops.benchrun warm SPEC_JSON STORE_LOCATION [--compiler reference]
    python -m graphcache.ops.benchrun memory SPEC_JSON

Prints one JSON line of seconds per phase (and bytes for ``memory``), with
the process's pid. A fresh process is what a worker starting up is: no
graph, no plan cache, nothing compiled or run in this process before.
``init`` (importing torch and cudnn, creating the CUDA context and the
cuDNN handle; for the reference compiler importing torch) is paid by cold
and warm alike and reported apart. The reference compiler's samples (no
GPU: torch SDPA on the CPU) are fresh processes as cuDNN's are, so its
first call's own start-up lands on both sides, never on cold alone.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from graphcache.artifact import Artifact
from graphcache.key import key_for
from graphcache.settings import Settings
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap


def _init() -> tuple[Any, Any, float]:
    start = time.perf_counter()
    import torch

    from graphcache.compilers.cudnn import CudnnCompiler

    compiler = CudnnCompiler(check_reference=False)
    compiler.handle()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    return torch, compiler, time.perf_counter() - start


def cold(spec: GraphSpec) -> dict[str, Any]:
    """Build from nothing (every build step), then the first execute."""
    from graphcache.compilers.cudnn import CudnnGraph, build_graph
    from graphcache.reference.dense import random_inputs

    torch, compiler, init = _init()
    inputs = random_inputs(spec, "cuda")
    start = time.perf_counter()
    built = build_graph(compiler.cudnn(), spec, UidMap.default(), compiler.handle())
    build = time.perf_counter() - start
    placeholder = Artifact(spec=spec, target=compiler.target(), payload=b"", uids=UidMap.default())
    t0 = time.perf_counter()
    graph = CudnnGraph(compiler, placeholder, built.graph)
    graph.execute(**inputs)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    return {
        "init": init,
        "phases": {**built.timings, "first_execute": first},
        "total": build + first,
        "dialect": built.dialect,
    }


def _fetched(spec: GraphSpec, location: str, compiler: Any, device: str) -> tuple[bytes, str, dict[str, Any], float]:
    """The spec's stored bytes for ``compiler``'s target, their key, inputs on
    ``device``, and the seconds the fetch took (the store opened untimed)."""
    from graphcache.reference.dense import random_inputs
    from graphcache.stores import open_store

    store = open_store(Settings.from_env(), location)
    key = key_for(spec, compiler.target())
    inputs = random_inputs(spec, device)
    t0 = time.perf_counter()
    data = store.get(key)
    fetch = time.perf_counter() - t0
    if data is None:
        raise SystemExit(f"no artifact for {spec.summary()} in {location}: warm it first")
    return data, key, inputs, fetch


def warm(spec: GraphSpec, location: str) -> dict[str, Any]:
    """Fetch, verify, deserialize, first execute."""
    torch, compiler, init = _init()
    data, key, inputs, fetch = _fetched(spec, location, compiler, "cuda")
    t0 = time.perf_counter()
    artifact = Artifact.decode(data, expected_key=key)
    verify = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph = compiler.load(artifact)
    torch.cuda.synchronize()
    deserialize = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph.execute(**inputs)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    phases = {"fetch": fetch, "verify": verify, "deserialize": deserialize, "first_execute": first}
    return {"init": init, "phases": phases, "total": sum(phases.values()), "bytes": len(data)}


def memory(spec: GraphSpec) -> dict[str, Any]:
    """Peak GPU memory of one execute: the cuDNN graph against torch's math SDPA."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from graphcache.compilers.cudnn import CudnnGraph, build_graph
    from graphcache.reference.dense import random_inputs, score_matrix_bytes, to_bhsd

    torch, compiler, _ = _init()
    inputs = random_inputs(spec, "cuda")
    built = build_graph(compiler.cudnn(), spec, UidMap.default(), compiler.handle())
    placeholder = Artifact(spec=spec, target=compiler.target(), payload=b"", uids=UidMap.default())
    graph = CudnnGraph(compiler, placeholder, built.graph)
    torch.cuda.synchronize()

    def peak(fn: Any) -> int:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)

    cudnn_peak = peak(lambda: graph.execute(**inputs)) + graph.workspace_size
    q, k, v = (to_bhsd(spec, inputs[r], r) for r in ("q", "k", "v"))
    gqa = spec.heads_q != spec.heads_kv

    def math() -> None:
        with sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(
                q, k, v, is_causal=spec.mask == "causal", enable_gqa=gqa, scale=spec.attn_scale
            )

    return {
        "cudnn_peak_bytes": cudnn_peak,
        "torch_math_peak_bytes": peak(math),
        "score_matrix_bytes": score_matrix_bytes(spec),
        "workspace_bytes": graph.workspace_size,
    }


def _reference_init() -> tuple[Any, Any, float]:
    start = time.perf_counter()
    import torch

    from graphcache.compilers.reference import ReferenceCompiler

    return torch, ReferenceCompiler(), time.perf_counter() - start


def reference_cold(spec: GraphSpec) -> dict[str, Any]:
    """The reference compiler's build, then load and first run, on the CPU."""
    from graphcache.reference.dense import random_inputs

    _, compiler, init = _reference_init()
    inputs = random_inputs(spec, "cpu")
    t0 = time.perf_counter()
    artifact = compiler.build(spec, compiler.target())
    t1 = time.perf_counter()
    compiler.load(artifact).execute(**inputs)
    t2 = time.perf_counter()
    return {"init": init, "phases": {"build": t1 - t0, "load+run": t2 - t1}, "total": t2 - t0, "dialect": "reference"}


def reference_warm(spec: GraphSpec, location: str) -> dict[str, Any]:
    """Fetch and verify the reference artifact, then load and first run."""
    _, compiler, init = _reference_init()
    data, key, inputs, fetch = _fetched(spec, location, compiler, "cpu")
    t1 = time.perf_counter()
    artifact = Artifact.decode(data, expected_key=key)
    t2 = time.perf_counter()
    compiler.load(artifact).execute(**inputs)
    t3 = time.perf_counter()
    phases = {"fetch": fetch, "verify": t2 - t1, "load+run": t3 - t2}
    return {"init": init, "phases": phases, "total": sum(phases.values()), "bytes": len(data)}


MODES: dict[str, dict[str, Callable[..., dict[str, Any]]]] = {
    "cudnn": {"cold": cold, "warm": warm, "memory": memory},
    "reference": {"cold": reference_cold, "warm": reference_warm},
}


def main(argv: list[str]) -> None:
    args = list(argv)
    compiler = "cudnn"
    if "--compiler" in args:
        at = args.index("--compiler")
        compiler = args[at + 1] if at + 1 < len(args) else ""
        del args[at : at + 2]
    if compiler not in MODES:
        raise SystemExit(f"unknown compiler {compiler!r}: {' or '.join(MODES)}")
    mode, spec_json = args[0], args[1]
    spec = GraphSpec.from_dict(json.loads(spec_json))
    run = MODES[compiler].get(mode)
    if run is None:
        raise SystemExit(f"unknown mode {mode!r} for {compiler}: {', '.join(MODES[compiler])}")
    result = run(spec, *args[2:3]) if mode == "warm" else run(spec)
    print(json.dumps({**result, "pid": os.getpid()}))


if __name__ == "__main__":
    main(sys.argv[1:])
