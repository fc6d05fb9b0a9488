"""warm, warm --check, prefetch and explain for ragged and paged specs, with
the worked example of docs/serving-engines.md (an engine configuration ->
its manifest -> its graph count), through the CLI and a real server."""

from __future__ import annotations

from pathlib import Path

from graphcache import GraphSpec, manifest
from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.clirun import cli
from tests.fakes import TARGET
from tests.servers import ServerThread

EXAMPLE = Path(__file__).parent.parent / "docs" / "examples" / "engine-llama3-8b-paged.yaml"


def test_the_worked_example_is_the_graph_count_the_docs_give():
    specs = manifest.load(EXAMPLE)
    assert len(specs) == 32  # 7 decode batch classes + 5 batch x 5 chunk classes
    assert all(s.layout == "thd" and s.page_size == 16 and s.seq_kv == 8192 for s in specs)
    assert sum(s.seq_q == 1 for s in specs) == 7
    assert "32 graphs" in (EXAMPLE.parent.parent / "serving-engines.md").read_text()


def test_warm_check_prefetch_and_explain_serve_paged_specs_like_any_other(tmp_path):
    server_store = DiskStore(tmp_path / "server")
    store = ["--cache-dir", str(tmp_path / "server")]
    check = cli("warm", str(EXAMPLE), "--check", "--target", str(TARGET), *store)
    assert check.returncode == 1 and "0/32 present" in check.stdout
    warm = cli("warm", str(EXAMPLE), "--compiler", "tests.fakes:FakeCompiler", *store)  # the GPU's step, stood in
    assert warm.returncode == 0, warm.stderr
    check = cli("warm", str(EXAMPLE), "--check", "--target", str(TARGET), *store)
    assert check.returncode == 0 and "32/32 present" in check.stdout, check.stdout
    assert "paged16x8192/512" in check.stdout

    app = create_app(Settings(cache_dir=server_store.path, write_tokens=("w",)), store=server_store)
    with ServerThread(app) as srv:
        local = tmp_path / "local"
        env = {"GRAPHCACHE_DIR": str(local)}
        got = cli("prefetch", str(EXAMPLE), "--server", srv.url, "--target", str(TARGET), env=env)
        assert got.returncode == 0, got.stdout + got.stderr
        assert len(list(DiskStore(local).keys())) == 32

        # Another pool size is another graph: explain names the field.
        other = GraphSpec(**{**manifest.load(EXAMPLE)[3].to_dict(), "num_pages": 4096})
        spec_file = tmp_path / "spec.json"
        spec_file.write_text(other.canonical_json())
        why = cli("explain", str(spec_file), "--target", str(TARGET), "--server", srv.url)
        assert "num_pages" in why.stdout, why.stdout + why.stderr


def test_a_manifest_with_a_table_narrower_than_its_context_is_refused_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("pages_per_seq: 512", "pages_per_seq: 512\n  seq_kv: 16384"))
    out = cli("warm", str(bad), "--check", "--target", str(TARGET), "--cache-dir", str(tmp_path / "s"))
    assert out.returncode != 0 and "pages_per_seq" in (out.stdout + out.stderr)


def test_explain_names_only_the_field_that_differs_for_a_paged_spec(tmp_path):
    from graphcache import GraphCache, ops
    from tests.fakes import FakeCompiler

    store = DiskStore(tmp_path / "s")
    stored = manifest.load(EXAMPLE)[3]
    GraphCache(store, FakeCompiler()).get(stored)
    asked = GraphSpec(**{**stored.to_dict(), "num_pages": 4096})
    nearest = ops.explain(asked, TARGET, store).nearest
    assert nearest[0].differences == ["spec.num_pages: stored 8192, asked 4096"]  # no spurious uid-map line
