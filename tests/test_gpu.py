"""cuDNN on a real GPU. Skipped, with the reason, where there is none.

Not yet run on a GPU from this repository's CI (which has none): see
docs/gpu-results.md for what a lent GPU showed, when one was lent.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from graphcache import GraphCache, GraphSpec, Target, TargetMismatch
from graphcache.stores import DiskStore

pytestmark = pytest.mark.gpu

SPECS = [
    dict(dtype="float16", layout="bshd", mask="causal"),
    dict(dtype="bfloat16", layout="bshd", mask="causal"),
    dict(dtype="float16", layout="bhsd", mask="none"),
    dict(dtype="bfloat16", layout="bhsd", mask="none"),
    dict(dtype="bfloat16", layout="bshd", mask="causal", heads_kv=2),
    dict(dtype="float16", layout="bshd", mask="causal_bottom_right", seq_q=64),
    dict(dtype="bfloat16", layout="bshd", mask="sliding_window", window_left=31),
    dict(dtype="float16", layout="bshd", mask="causal", generate_stats=True),
    dict(dtype="bfloat16", layout="bshd", mask="causal", padding=True),
    dict(dtype="bfloat16", layout="bshd", bias="b1ss"),  # a padded batch's mask, as a bias (issue 25)
    dict(dtype="float16", layout="bhsd", bias="1hss"),  # a per-head relative position bias
    dict(dtype="bfloat16", layout="bshd", mask="causal", bias="bhss", generate_stats=True),
]


def make(**changes) -> GraphSpec:
    return GraphSpec.from_dict({"batch": 2, "heads_q": 8, "seq_q": 256, "head_dim": 128, **changes})


@pytest.fixture(scope="module")
def compiler():
    from graphcache.compilers.cudnn import CudnnCompiler

    return CudnnCompiler()


FRESH = r"""
import json, sys
from graphcache import Artifact
from graphcache.compilers.cudnn import CudnnCompiler
from graphcache.compilers.torch_sdpa import random_inputs, reference_error
art = Artifact.decode(open(sys.argv[1], "rb").read())
graph = CudnnCompiler().load(art)  # deserializes with enforce_precompiled and checks the canary
inputs = random_inputs(art.spec, "cuda", seed=7)
result = graph.execute(**inputs)
out = result[0] if art.spec.generate_stats else result
print(json.dumps({"error": reference_error(art.spec, out, inputs)}))
"""


@pytest.mark.parametrize("changes", SPECS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_build_serialize_then_load_in_a_fresh_process(compiler, tmp_path, changes):
    from graphcache.compilers.torch_sdpa import TOLERANCE

    spec = make(**changes)
    artifact = compiler.build(spec)
    assert artifact.payload and artifact.validation_error is not None
    assert artifact.validation_error < TOLERANCE[spec.dtype]
    assert artifact.canary is not None and artifact.canary["sha256"]
    print(f"engine {artifact.runtime.get('engine')}, notes {artifact.runtime.get('behavior_notes')}")
    path = tmp_path / "a.gcart"
    path.write_bytes(artifact.encode())
    out = subprocess.run([sys.executable, "-c", FRESH, str(path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    error = json.loads(out.stdout.strip().splitlines()[-1])["error"]
    print(f"{spec.summary()}: build {artifact.build_seconds:.3f}s, error {error:.2e}")
    assert error < TOLERANCE[spec.dtype]


def test_foreign_target_is_refused(compiler):
    artifact = compiler.build(make(mask="causal"))
    doctored = dataclasses.replace(artifact, target=Target(**{**artifact.target.to_dict(), "cudnn": "8.9.7"}))
    with pytest.raises(TargetMismatch, match="was built for"):
        compiler.load(doctored)


def test_workspace_is_allocated_once_across_executions(compiler):
    from graphcache.compilers.torch_sdpa import random_inputs

    spec = make(mask="causal")
    graph = compiler.load(compiler.build(spec))
    pointer = graph.workspace.data_ptr()
    for seed in range(3):
        graph.execute(**random_inputs(spec, "cuda", seed=seed))
        assert graph.workspace.data_ptr() == pointer


def shape_override(compiler) -> bool:  # noqa: ANN001
    """Whether this stack runs class graphs (cuDNN >= 9.21, frontend >= 1.24)."""
    from graphcache.compilers.cudnn.releases import SHAPE_OVERRIDE, missing

    return missing(SHAPE_OVERRIDE, compiler.target().frontend, compiler.target().cudnn) is None


def test_graph_cache_end_to_end(compiler, tmp_path):
    # Under the default length classes: the class graph where this stack has
    # shape override, else the class is refused at preflight (cuDNN 9.19 on
    # the H200 of 2026-12-04), which is no build, and the exact graph serves.
    cache = GraphCache(DiskStore(tmp_path), compiler, shape_classes="pow2")
    spec = make(mask="causal", seq_q=200)
    graph = cache.load(spec)
    assert graph.backend == "cudnn" and graph.spec.is_class is shape_override(compiler)
    stats = cache.stats()
    assert (stats["builds"], stats["unsupported"]) == (1, 0 if shape_override(compiler) else 1), stats
    again = GraphCache(DiskStore(tmp_path), compiler, shape_classes="pow2")
    again.load(spec)
    assert again.stats()["builds"] == 0 and again.stats()["hits"] >= 1


def test_a_doctored_canary_rejects_the_plan_and_the_cache_rebuilds_it(compiler, tmp_path):
    from graphcache import PlanRejected

    spec = make(mask="causal")
    artifact = compiler.build(spec)
    doctored = dataclasses.replace(
        artifact, canary={**artifact.canary, "sha256": "0" * 64, "deterministic": True, "l2": 1e9}
    )
    with pytest.raises(PlanRejected) as info:
        compiler.load(doctored)
    assert info.value.reason == "canary_mismatch"
    store = DiskStore(tmp_path)
    store.put(doctored.key, doctored.encode())
    cache = GraphCache(store, compiler, shape_classes="exact")  # the stored exact plan, not a class graph
    graph = cache.load(spec)
    assert graph.backend == "cudnn" and cache.stats()["canary_failures"] == 1 and cache.stats()["builds"] == 1


def test_execute_follows_the_callers_stream_and_threads_take_turns(compiler):
    import threading

    import torch

    from graphcache.compilers.torch_sdpa import random_inputs, reference_error

    spec = make(mask="causal")
    graph = compiler.load(compiler.build(spec))
    errors: list[float] = []

    def run(seed: int) -> None:
        stream = torch.cuda.Stream()
        inputs = random_inputs(spec, "cuda", seed=seed)
        torch.cuda.current_stream().synchronize()
        with torch.cuda.stream(stream):
            out = graph.execute(**inputs)
        stream.synchronize()
        errors.append(reference_error(spec, out, inputs))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(errors) == 4 and all(e < 5e-3 for e in errors), errors


def test_each_stream_has_its_own_workspace(compiler):
    import torch

    graph = compiler.load(compiler.build(make(mask="causal")))
    first = graph.workspace.data_ptr()
    with torch.cuda.stream(torch.cuda.Stream()):
        assert graph.workspace.data_ptr() != first
    assert graph.workspace.data_ptr() == first


def test_tensors_on_another_device_are_refused(compiler):
    from graphcache import ExecutionError
    from graphcache.compilers.torch_sdpa import random_inputs

    spec = make(mask="causal")
    graph = compiler.load(compiler.build(spec))
    with pytest.raises(ExecutionError, match="cuda"):
        graph.execute(**random_inputs(spec, "cpu"))


def test_a_custom_uid_map_builds_and_runs(compiler):
    from graphcache import UidMap
    from graphcache.compilers.torch_sdpa import random_inputs

    uids = UidMap({**UidMap.default().to_dict(), "o": 40})
    spec = make(mask="causal")
    artifact = compiler.build(spec, uids=uids)
    assert artifact.uids == uids
    graph = compiler.load(artifact)
    graph.execute(**random_inputs(spec, "cuda"))


def test_dropout_records_no_validation_error(compiler):
    artifact = compiler.build(make(mask="causal", dropout=0.1))
    assert artifact.validation_error is None and "dropout" in artifact.runtime["validation"]


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_run_views_reads_torchs_views_as_execute_reads_storage(compiler, layout):
    """graphcache.torch's per-call path hands cuDNN torch's (b, h, s, d) views
    as they are; the answer must be execute()'s, bit for bit."""
    import torch

    from graphcache.compilers.torch_sdpa import random_inputs

    spec = make(mask="causal", layout=layout)
    graph = compiler.load(compiler.build(spec))
    feed = random_inputs(spec, "cuda", seed=3)
    stored = graph.execute(**feed)
    views = [t.transpose(1, 2) if layout == "bshd" else t for t in (feed["q"], feed["k"], feed["v"])]
    out = graph.run_views(*views)
    assert tuple(out.shape) == tuple(spec.dims("o")) and tuple(out.stride()) == tuple(spec.strides("o"))
    got = out.transpose(1, 2) if layout == "bshd" else out
    assert torch.equal(got, stored)
