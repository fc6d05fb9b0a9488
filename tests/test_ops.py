"""warm, the coverage gate and explain: the library calls and the CLI over a real server."""

from __future__ import annotations

import json

import pytest

from graphcache import GraphCache, Target, key_for, manifest, ops
from graphcache.settings import Settings
from graphcache.stores import DiskStore, HttpStore
from service.app import create_app
from tests.clirun import cli
from tests.fakes import TARGET, FakeCompiler, make_artifact, spec
from tests.servers import ServerThread

MANIFEST = """
defaults: {heads_q: 8, head_dim: 64, seq_q: 128}
graphs:
  - {name: dense, mask: causal, batch: [1, 2, 3]}
  - {name: window, mask: sliding_window, window_left: 16, batch: 1}
"""


@pytest.fixture(autouse=True)
def exact_shapes(monkeypatch):
    """Exact-shape warm, check and explain here (the CLI's subprocesses
    inherit it); under length classes they are tests/test_classes_ops.py's."""
    monkeypatch.setenv("GRAPHCACHE_SHAPE_CLASSES", "exact")


@pytest.fixture
def manifest_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(MANIFEST)
    return path


def test_warm_builds_missing_reports_and_pins(tmp_path, manifest_file):
    store = DiskStore(tmp_path / "s")
    specs = manifest.load(manifest_file)
    compiler = FakeCompiler(unsupported={"sliding_window"})
    GraphCache(store, compiler).get(specs[0])  # already present
    rows = ops.warm(specs, GraphCache(store, compiler), jobs=2)
    assert [r.status for r in rows] == ["present", "built", "built", "unsupported"]
    assert "no serializable plan" in rows[3].detail
    assert all(store.pinned(r.key) for r in rows if r.status in ("present", "built"))
    builds = compiler.builds
    again = ops.warm(specs, GraphCache(store, compiler))
    assert [r.status for r in again] == ["present", "present", "present", "unsupported"]
    assert compiler.builds == builds, "unsupported specs are recorded once, not rebuilt"


def test_warm_reports_failures(tmp_path):
    class Broken(FakeCompiler):
        def build(self, spec, target, uids=None):  # noqa: ANN001
            raise RuntimeError("cuDNN said no")

    rows = ops.warm([spec()], GraphCache(DiskStore(tmp_path), Broken()))
    assert rows[0].status == "failed" and "cuDNN said no" in rows[0].detail


def test_cli_warm_then_check_against_a_real_server(tmp_path, manifest_file):
    server_store = DiskStore(tmp_path / "server")
    app = create_app(Settings(cache_dir=server_store.path, write_tokens=("w",)), store=server_store)
    with ServerThread(app) as srv:
        env = {"GRAPHCACHE_TOKEN": "w", "GRAPHCACHE_DIR": str(tmp_path / "local")}
        # Only the first two specs are present on the server.
        http = HttpStore(srv.url, token="w")
        specs = manifest.load(manifest_file)
        for s in specs[:2]:
            http.put(key_for(s, TARGET), make_artifact(s).encode())
        out = cli(
            "warm",
            str(manifest_file),
            "--check",
            "--target",
            str(TARGET),
            "--server",
            srv.url,
            "--json",
            str(tmp_path / "r.json"),
            env=env,
        )
        assert out.returncode == 1
        assert "2/4 present" in out.stdout and "missing" in out.stdout
        assert "coverage gate failed" in out.stderr
        report = json.loads((tmp_path / "r.json").read_text())
        assert [r["present"] for r in report["rows"]] == [True, True, False, False]
        # Warm the rest through the server with the deterministic compiler, then the gate passes.
        out = cli("warm", str(manifest_file), "--server", srv.url, "--compiler", "tests.fakes:FakeCompiler", env=env)
        assert out.returncode == 0, out.stderr
        assert "2 present, 2 built" in out.stdout
        out = cli("warm", str(manifest_file), "--check", "--target", str(TARGET), "--server", srv.url, env=env)
        assert out.returncode == 0 and "4/4 present" in out.stdout
        # Another target has nothing.
        out = cli(
            "warm",
            str(manifest_file),
            "--check",
            "--target",
            "a100-sm80-cudnn9.28.0-fe1.32.0",
            "--server",
            srv.url,
            env=env,
        )
        assert out.returncode == 1 and "0/4 present" in out.stdout


@pytest.mark.torch  # without torch the message is that torch is missing (tests/test_no_torch.py)
def test_cli_warm_without_gpu_says_so(manifest_file, tmp_path):
    out = cli("--cache-dir", str(tmp_path), "warm", str(manifest_file))
    assert out.returncode == 1 and "no CUDA GPU" in out.stderr and "Traceback" not in out.stderr


def test_check_needs_a_target(manifest_file, tmp_path):
    out = cli("--cache-dir", str(tmp_path), "warm", str(manifest_file), "--check")
    assert out.returncode == 2 and "--target" in out.stderr


def test_explain_names_the_differing_fields(tmp_path):
    store = DiskStore(tmp_path / "s")
    stored = spec(seq_q=2048, dtype="bfloat16")
    store.put(make_artifact(stored).key, make_artifact(stored).encode())
    far = spec(batch=8, heads_q=16, seq_q=512, mask="none")
    store.put(make_artifact(far).key, make_artifact(far).encode())
    asked = spec(seq_q=4096, dtype="bfloat16")
    result = ops.explain(asked, Target.parse("h200-sm90-cudnn9.28.0-fe1.31.0"), store)
    assert not result.present and result.scanned == 2
    nearest = result.nearest[0]
    assert nearest.differences == [
        "spec.seq_q: stored 2048, asked 4096",
        "spec.seq_kv: stored 2048, asked 4096",
        "target.frontend: stored '1.32.0', asked '1.31.0'",
    ]
    f = tmp_path / "asked.json"
    f.write_text(json.dumps(asked.to_dict()))
    out = cli("--cache-dir", str(tmp_path / "s"), "explain", str(f), "--target", "h200-sm90-cudnn9.28.0-fe1.31.0")
    assert out.returncode == 1
    assert "spec.seq_q: stored 2048, asked 4096" in out.stdout and "target.frontend" in out.stdout
    out = cli("--cache-dir", str(tmp_path / "s"), "explain", str(f), "--target", str(TARGET))
    assert "spec.seq_q" in out.stdout and "target." not in out.stdout


def test_explain_over_the_server(tmp_path):
    server_store = DiskStore(tmp_path / "server")
    stored = spec(seq_q=2048)
    server_store.put(make_artifact(stored).key, make_artifact(stored).encode())
    with ServerThread(create_app(Settings(cache_dir=server_store.path), store=server_store)) as srv:
        f = tmp_path / "asked.yaml"
        f.write_text("batch: 1\nheads_q: 8\nseq_q: 4096\nhead_dim: 64\nmask: causal\n")
        out = cli("explain", str(f), "--target", str(TARGET), "--server", srv.url)
        assert out.returncode == 1 and "spec.seq_q: stored 2048, asked 4096" in out.stdout
        f.write_text("batch: 1\nheads_q: 8\nseq_q: 2048\nhead_dim: 64\nmask: causal\n")
        out = cli("explain", str(f), "--target", str(TARGET), "--server", srv.url)
        assert out.returncode == 0 and "present" in out.stdout


def test_purge_unsupported_clears_only_negative_entries_and_rm_clears_one(tmp_path):
    """A negative entry recorded by mistake (or before a cuDNN fix) must be
    removable without touching the plans that work."""
    store = DiskStore(tmp_path / "s")
    cache = GraphCache(store, FakeCompiler(unsupported={"sliding_window"}))
    good = cache.get(spec(mask="causal"), TARGET)
    negatives = []
    for window in (8, 16):
        with pytest.raises(Exception, match="no serializable plan"):
            cache.get(spec(mask="sliding_window", window_left=window), TARGET)
        negatives.append(cache.key(spec(mask="sliding_window", window_left=window), TARGET))
    store.close()
    base = ["--cache-dir", str(tmp_path / "s")]

    assert cli(*base, "purge").returncode == 2  # neither --target nor --unsupported
    dry = cli(*base, "purge", "--unsupported", "--dry-run")
    assert dry.returncode == 0 and sorted(dry.stdout.split()[:2]) == sorted(negatives)
    assert cli(*base, "rm", negatives[0]).returncode == 0
    out = cli(*base, "purge", "--unsupported")
    assert out.returncode == 0 and "removed 1 negative entry" in out.stdout, out.stdout + out.stderr
    assert list(DiskStore(tmp_path / "s").keys()) == [good.key]


def test_purge_unsupported_through_the_server(tmp_path):
    store = DiskStore(tmp_path / "s")
    cache = GraphCache(store, FakeCompiler(unsupported={"sliding_window"}))
    good = cache.get(spec(mask="causal"), TARGET)
    with pytest.raises(Exception, match="no serializable plan"):
        cache.get(spec(mask="sliding_window", window_left=8), TARGET)
    settings = Settings(admin_tokens=("adm",))
    with ServerThread(create_app(settings, store=store)) as srv:
        out = cli("purge", "--unsupported", "--server", srv.url, env={"GRAPHCACHE_TOKEN": "adm"})
        assert out.returncode == 0 and "removed 1 negative entry" in out.stdout, out.stdout + out.stderr
        assert HttpStore(srv.url).get(good.key) is not None
        bad = HttpStore(srv.url, token="adm")._request("POST", "/v1/purge", params={})
        assert bad.status_code == 400 and "unsupported=true" in bad.json()["detail"]
    assert list(store.keys()) == [good.key]
