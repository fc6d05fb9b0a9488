"""Class graphs (execute-time shape override) on a real GPU. Skipped, with
the reason, where there is none. Not yet run on a GPU: see
docs/gpu-results.md. scripts/gpu/bench_classes_gpu.py gives the figures
(error at off-tile shapes, class-at-a-short-shape vs exact execute time)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphcache import GraphCache, GraphSpec, UnsupportedSpec
from graphcache.spec.classes import class_of
from graphcache.stores import DiskStore

pytestmark = pytest.mark.gpu

CLASSES = [
    dict(batch=4, heads_q=8, heads_kv=2, seq_q=1, seq_kv=256, head_dim=128, dtype="bfloat16", layout="bhsd"),
    dict(batch=2, heads_q=8, seq_q=256, seq_kv=256, head_dim=128, dtype="bfloat16", mask="causal"),
    dict(batch=2, heads_q=8, seq_q=128, seq_kv=512, head_dim=64, dtype="float16", mask="causal_bottom_right"),
    dict(batch=2, heads_q=8, seq_q=256, head_dim=128, dtype="float16", mask="none", generate_stats=True),
]


@pytest.fixture(scope="module")
def compiler():
    from graphcache.compilers.cudnn import CudnnCompiler

    return CudnnCompiler()


def supported(compiler) -> str | None:  # noqa: ANN001
    from graphcache.compilers.cudnn.releases import SHAPE_OVERRIDE, missing

    target = compiler.target()
    return missing(SHAPE_OVERRIDE, target.frontend, target.cudnn)


FRESH = r"""
import json, sys
from graphcache import Artifact
from graphcache.compilers.cudnn import CudnnCompiler
from graphcache.compilers.cudnn.override import check_shapes
from graphcache.compilers.torch_sdpa import random_inputs, reference_error
art = Artifact.decode(open(sys.argv[1], "rb").read())
graph = CudnnCompiler().load(art)  # enforce_precompiled, and the canary at a real shape
errors = {}
for real in check_shapes(art.spec):
    feed = random_inputs(real, "cuda", seed=11)
    result = graph.execute(**feed)
    out = result[0] if real.generate_stats else result
    errors[f"b{real.batch} q{real.seq_q} kv{real.seq_kv}"] = reference_error(real, out, feed)
print(json.dumps(errors))
"""


@pytest.mark.parametrize("fields", CLASSES, ids=lambda f: GraphSpec(**f).summary().replace(" ", "-"))
def test_a_class_graph_builds_checks_and_serves_off_tile_shapes_in_a_fresh_process(compiler, tmp_path, fields):
    from graphcache.compilers.torch_sdpa import TOLERANCE

    klass = GraphSpec(**fields, shapes="class")
    need = supported(compiler)
    if need:
        with pytest.raises(UnsupportedSpec, match="needs"):
            compiler.build(klass)
        pytest.skip(f"this stack has no shape override: {need}")
    artifact = compiler.build(klass)  # the build-time check ran at check_shapes in NaN-filled buffers
    assert artifact.validation_error is not None and artifact.validation_error <= TOLERANCE[klass.dtype]
    assert artifact.canary is not None
    path = tmp_path / "class.gcart"
    path.write_bytes(artifact.encode())
    out = subprocess.run([sys.executable, "-c", FRESH, str(path)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    errors = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{klass.summary()}: engine {artifact.runtime.get('engine')}, errors {errors}")
    assert all(e <= TOLERANCE[klass.dtype] for e in errors.values()), errors


def test_the_drop_in_serves_a_decode_loop_from_one_class_graph(compiler, tmp_path):
    import torch

    import graphcache.torch as gt

    if supported(compiler):
        pytest.skip(f"this stack has no shape override: {supported(compiler)}")
    cache = GraphCache(DiskStore(tmp_path), compiler, shape_classes="pow2")
    gt.reset()
    gt.configure(cache, on_miss="build")
    q = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    try:
        for n in (130, 131, 200, 256):
            k, v = (torch.randn(1, 2, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            got = gt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
            assert (got.float() - want).norm() / want.norm() < 2e-2, n
        stats = gt.stats()
        assert stats["built_here"] == 4 and stats["graphs_loaded"] == 1 and stats["shapes_served"] == 4
        spec = gt.spec_for(q, k, v, enable_gqa=True)
        assert cache.load(spec).spec == class_of(spec, "pow2")
    finally:
        gt.reset()
