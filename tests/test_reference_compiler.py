"""The reference compiler: artifacts built and served on a CPU, under a
target no GPU worker ever asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphcache import GraphCache, NotFound, PlanRejected, Target, TargetMismatch
from graphcache.artifact import Artifact
from graphcache.compilers.reference import TARGET, ReferenceCompiler
from graphcache.settings import Settings, SettingsError
from graphcache.stores import DiskStore
from tests.clirun import cli
from tests.fakes import FakeCompiler, spec
from tests.servers import ServerThread

torch = pytest.importorskip("torch")


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path / "store")


def test_a_reference_plan_runs_torch_sdpa_with_the_specs_mask_on_the_cpu(store):
    s = spec(dtype="bfloat16", layout="bhsd", seq_q=64, mask="causal")
    graph = GraphCache(store, ReferenceCompiler()).load(s)
    q, k, v = (torch.randn(1, 8, 64, 64, dtype=torch.bfloat16) for _ in range(3))
    out = graph.execute(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert graph.backend == "reference"
    assert torch.allclose(out.float(), want, atol=2e-2)
    unmasked = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert not torch.allclose(out.float(), unmasked, atol=2e-2)  # the causal mask is applied


def test_its_target_is_its_own_and_never_a_gpus(store):
    assert str(TARGET) == "reference-sm00-cudnn0.0.0-fe0.0.0"
    assert Target.parse(str(TARGET)) == TARGET
    assert TARGET.compute_capability == "0.0"  # no GPU detects itself as 0.0
    s = spec()
    GraphCache(store, "reference").get(s)
    # A cuDNN worker (FakeCompiler stands in for CudnnCompiler, h200) asks
    # for the same spec: another key, so the reference entry is never served.
    worker = GraphCache(store, FakeCompiler())
    assert worker.key(s) != GraphCache(store, "reference").key(s)
    with pytest.raises(NotFound):
        worker.load(s, build=False)
    gpu = Target.parse("h200-sm90-mp132-cudnn9.28.0-fe1.32.0")
    with pytest.raises(TargetMismatch, match="reference compiler builds and loads for reference-sm00"):
        ReferenceCompiler().build(s, gpu)
    with pytest.raises(TargetMismatch):
        ReferenceCompiler().load(FakeCompiler(gpu).build(s, gpu))


def test_a_stored_payload_that_is_not_the_specs_plan_is_rejected():
    s = spec()
    good = ReferenceCompiler().build(s, TARGET)
    other = json.loads(bytes(good.payload))
    other["spec"]["seq_q"] = 256
    for payload in (b"\x00garbage", json.dumps(other).encode()):
        forged = Artifact(spec=s, target=TARGET, payload=payload)
        with pytest.raises(PlanRejected) as err:
            ReferenceCompiler().load(forged)
        assert err.value.reason == "deserialize_failed"


def test_the_compiler_is_named_in_graphcache_and_in_the_environment(store, monkeypatch):
    assert isinstance(GraphCache(store, compiler="reference").compiler, ReferenceCompiler)
    monkeypatch.setenv("GRAPHCACHE_COMPILER", "reference")
    monkeypatch.setenv("GRAPHCACHE_DIR", str(store.path))
    assert Settings.from_env().compiler == "reference"
    assert isinstance(GraphCache.from_env().compiler, ReferenceCompiler)
    monkeypatch.setenv("GRAPHCACHE_COMPILER", "refrence")
    with pytest.raises(SettingsError, match="GRAPHCACHE_COMPILER='refrence' names no compiler; give cudnn"):
        Settings.from_env()
    with pytest.raises(SettingsError, match="compiler='cuda' names no compiler"):
        GraphCache(store, compiler="cuda")


def test_warm_check_prefetch_and_bench_walk_with_the_reference_compiler(tmp_path):
    from service.app import create_app

    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "defaults: {batch: 1, dtype: bfloat16, heads_q: 4, head_dim: 64}\ngraphs:\n  - {name: prefill, seq_q: [64, 100], mask: causal}\n"
    )
    app = create_app(Settings(cache_dir=tmp_path / "served"), store=DiskStore(tmp_path / "served"))
    env = {"GRAPHCACHE_DIR": str(tmp_path / "local")}
    with ServerThread(app) as srv:
        server = ("--server", srv.url)
        before = cli("warm", str(manifest), "--check", "--compiler", "reference", *server, env=env)
        assert before.returncode == 1 and "0/2 present for reference-sm00-cudnn0.0.0-fe0.0.0" in before.stdout
        warm = cli("warm", str(manifest), "--compiler", "reference", *server, env=env)
        assert warm.returncode == 0, warm.stderr
        assert "1 built" in warm.stdout  # one class serves both prompt lengths
        check = cli("warm", str(manifest), "--check", *server, env={**env, "GRAPHCACHE_COMPILER": "reference"})
        assert check.returncode == 0 and "2/2 present for reference-sm00" in check.stdout
        prefetch = cli("prefetch", str(manifest), "--compiler", "reference", "--strict", *server, env=env)
        assert prefetch.returncode == 0, prefetch.stderr
        assert "reference-sm00-cudnn0.0.0-fe0.0.0 │ 2 " in prefetch.stdout
        bench = cli("bench", str(manifest), "--compiler", "reference", "--repeat", "1", *server, env=env)
        assert bench.returncode == 0, bench.stderr
        assert "measured the reference compiler" in bench.stdout and "not cuDNN" in bench.stdout
    gpu_check = cli("warm", str(manifest), "--check", "--store", str(tmp_path / "served"))
    assert gpu_check.returncode == 2 and "--check needs --target" in gpu_check.stderr


def test_explain_takes_the_compiler_and_compares_with_the_class_on_the_no_gpu_walk(tmp_path):
    """The README's tiny example warmed with the reference compiler, then
    explained as a user without a GPU types it: --compiler, no --target."""
    example = Path(__file__).parent.parent / "docs" / "examples" / "tiny.yaml"
    folder = ("--cache-dir", str(tmp_path / "c"))
    warm = cli(*folder, "warm", str(example), "--compiler", "reference")
    assert warm.returncode == 0, warm.stderr
    asked = tmp_path / "spec.yaml"
    asked.write_text("batch: 1\nheads_q: 4\nhead_dim: 64\ndtype: bfloat16\nlayout: bhsd\nmask: causal\nseq_q: 100\n")
    present = cli(*folder, "explain", str(asked), "--compiler", "reference")
    assert present.returncode == 0, present.stdout + present.stderr
    assert "served by its class's graph" in present.stdout and "reference-sm00-cudnn0.0.0-fe0.0.0" in present.stdout
    asked.write_text(asked.read_text().replace("seq_q: 100", "seq_q: 300"))
    missing = cli(*folder, "explain", str(asked), "--compiler", "reference")
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "spec.seq_q: stored up to 128, asked 300 (class 512)" in missing.stdout
    assert "shapes" not in missing.stdout, missing.stdout
    gpu = cli(*folder, "explain", str(asked))
    assert gpu.returncode == 2 and "--target" in gpu.stderr and "--compiler reference" in gpu.stderr
