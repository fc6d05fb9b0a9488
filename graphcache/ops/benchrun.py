"""One measurement in a fresh process, for ``graphcache bench``.

    python -m graphcache.ops.benchrun cold SPEC_JSON
    python -m graphcache.ops.benchrun warm SPEC_JSON STORE_LOCATION
    python -m graphcache.ops.benchrun memory SPEC_JSON

Prints one JSON line of seconds per phase (and bytes for ``memory``). A
fresh process is what a worker starting up is: no graph, no plan cache,
nothing compiled in this process before. ``init`` (importing torch and
cudnn, creating the CUDA context and the cuDNN handle) is paid by cold and
warm alike and reported apart.
"""

from __future__ import annotations

import json
import sys
import time
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


def warm(spec: GraphSpec, location: str) -> dict[str, Any]:
    """Fetch, verify, deserialize, first execute."""
    from graphcache.reference.dense import random_inputs
    from graphcache.stores import open_store

    torch, compiler, init = _init()
    store = open_store(Settings.from_env(), location)
    key = key_for(spec, compiler.target())
    inputs = random_inputs(spec, "cuda")
    t0 = time.perf_counter()
    data = store.get(key)
    fetch = time.perf_counter() - t0
    if data is None:
        raise SystemExit(f"no artifact for {spec.summary()} in {location}: warm it first")
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
    q, k, v = (to_bhsd(spec, inputs[r]) for r in ("q", "k", "v"))
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


def main(argv: list[str]) -> None:
    mode, spec_json = argv[0], argv[1]
    spec = GraphSpec.from_dict(json.loads(spec_json))
    if mode == "cold":
        result = cold(spec)
    elif mode == "warm":
        result = warm(spec, argv[2])
    elif mode == "memory":
        result = memory(spec)
    else:
        raise SystemExit(f"unknown mode {mode!r}: cold, warm or memory")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
