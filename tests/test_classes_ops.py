"""Ops under length classes (issue 18, item 7): warm builds one graph per
class, warm --check and prefetch count an exact spec present through its
stored class and say which, explain names the class."""

from __future__ import annotations

import json

import pytest

from graphcache import GraphCache, GraphSpec, key_for, manifest, ops
from graphcache.settings import Settings
from graphcache.spec.classes import class_of
from graphcache.stores import DiskStore, TieredStore
from service.app import create_app
from tests.clirun import cli
from tests.fakes import TARGET, FakeCompiler, make_artifact
from tests.servers import ServerThread

# A decode loop's exact specs: seq_kv 38..45 (one class, kv128) and 130 (kv256).
MANIFEST = """
defaults: {batch: 1, heads_q: 8, heads_kv: 2, head_dim: 64, seq_q: 1, dtype: bfloat16, layout: bhsd}
graphs:
  - {name: decode, seq_kv: [38, 39, 40, 41, 42, 43, 44, 45, 130]}
"""
CLASS_128 = GraphSpec(
    batch=1, heads_q=8, heads_kv=2, seq_q=1, seq_kv=128, head_dim=64, dtype="bfloat16", layout="bhsd", shapes="class"
)
CLASS_256 = CLASS_128.replace(seq_kv=256)


def specs(tmp_path):  # noqa: ANN001, ANN201
    path = tmp_path / "m.yaml"
    path.write_text(MANIFEST)
    return path, manifest.load(path)


def test_warm_builds_one_graph_per_class_and_the_exact_specs_where_a_class_is_refused(tmp_path):
    _, exact = specs(tmp_path)
    compiler = FakeCompiler()
    rows = ops.warm(exact, GraphCache(DiskStore(tmp_path / "a"), compiler, shape_classes="pow2"))
    assert [(r.spec, r.status) for r in rows] == [(CLASS_128, "built"), (CLASS_256, "built")]
    assert compiler.builds == 2 and len(rows[0].serves) == 8 and "serves 8 spec(s)" in rows[0].detail

    refusing = FakeCompiler(classes=False)
    rows = ops.warm(exact, GraphCache(DiskStore(tmp_path / "b"), refusing, shape_classes="pow2"))
    assert [r.status for r in rows[:2]] == ["unsupported", "unsupported"]
    assert [(r.spec, r.status) for r in rows[2:]] == [(s, "built") for s in exact]
    again = ops.warm(exact, GraphCache(DiskStore(tmp_path / "b"), refusing, shape_classes="pow2"))
    # Each class in both forms (override refused, then padded refused), then the exact specs; the
    # negative entries and exact graphs answered the second warm.
    assert refusing.builds == 2 * 2 + len(exact)
    assert {r.status for r in again[2:]} == {"present"}


def test_warm_serves_a_class_whose_override_is_refused_by_its_padded_form_and_check_counts_it(tmp_path):
    _, exact = specs(tmp_path)
    store = DiskStore(tmp_path / "a")
    rows = ops.warm(exact, GraphCache(store, FakeCompiler(override=False), shape_classes="pow2"))
    assert [(r.spec, r.status, r.mechanism) for r in rows] == [
        (CLASS_128, "built", "padded"),
        (CLASS_256, "built", "padded"),
    ]
    assert "execute-time override refused" in rows[0].detail
    assert rows[0].key == key_for(CLASS_128.replace(mechanism="padded"), TARGET)
    checked = ops.check(exact, TARGET, store, shape_classes="pow2")
    assert all(r.present for r in checked) and {r.mechanism for r in checked} == {"padded"}
    assert checked[0].served_by == CLASS_128.replace(mechanism="padded")
    # A worker's prefetch fetches the padded forms into its local store: its loads then read nothing remote.
    local = DiskStore(tmp_path / "local")
    report = GraphCache(TieredStore(local, store), shape_classes="pow2").prefetch(exact, TARGET)
    assert report.present == len(exact) and not report.missing
    assert local.exists(key_for(CLASS_128.replace(mechanism="padded"), TARGET))


def test_check_counts_an_exact_spec_present_through_its_stored_class_but_not_through_a_negative_entry(tmp_path):
    _, exact = specs(tmp_path)
    store = DiskStore(tmp_path / "s")
    store.put(key_for(CLASS_128, TARGET), make_artifact(CLASS_128).encode())
    rows = ops.check(exact, TARGET, store, shape_classes="pow2")
    assert [r.present for r in rows] == [True] * 8 + [False]
    assert {r.served_by for r in rows[:8]} == {CLASS_128} and rows[8].served_by is None
    assert not any(r.present for r in ops.check(exact, TARGET, store, shape_classes="exact"))
    # A class refused on the target serves nothing: the exact entry must be there.
    cache = GraphCache(store, FakeCompiler(classes=False), shape_classes="pow2")
    cache.load(exact[8])  # the class is refused (negative entry), the exact graph is built
    assert cache.lookup(CLASS_256).unsupported
    last = ops.check(exact, TARGET, store, shape_classes="pow2")[8]
    assert last.present and last.served_by is None


def test_prefetch_fetches_the_classes_and_counts_the_exact_specs_they_serve(tmp_path):
    _, exact = specs(tmp_path)
    server = DiskStore(tmp_path / "server")
    for klass in (CLASS_128,):
        server.put(key_for(klass, TARGET), make_artifact(klass).encode())
    report = GraphCache(server, shape_classes="pow2").prefetch(exact, TARGET)
    assert report.present == 8 and report.missing == (exact[8],)
    assert report.served_by == {s: CLASS_128 for s in exact[:8]}
    assert report.bytes == len(server.get(key_for(CLASS_128, TARGET)))
    plain = GraphCache(server, shape_classes="exact").prefetch(exact, TARGET)
    assert plain.present == 0 and not plain.served_by


def test_the_cli_check_prefetch_and_explain_name_the_class_over_a_real_server(tmp_path):
    path, exact = specs(tmp_path)
    server_store = DiskStore(tmp_path / "server")
    server_store.put(key_for(CLASS_128, TARGET), make_artifact(CLASS_128).encode())
    app = create_app(Settings(cache_dir=server_store.path, write_tokens=("w",)), store=server_store)
    with ServerThread(app) as srv:
        env = {"GRAPHCACHE_TOKEN": "w", "GRAPHCACHE_DIR": str(tmp_path / "local")}
        json_path = tmp_path / "r.json"
        args = ("warm", str(path), "--check", "--target", str(TARGET), "--server", srv.url, "--json", str(json_path))
        out = cli(*args, env=env)
        assert out.returncode == 1 and "8/9 present" in out.stdout
        assert f"class {CLASS_128.summary()}" in out.stdout
        rows = json.loads(json_path.read_text())["rows"]
        assert [r["served_by"] == CLASS_128.to_dict() for r in rows] == [True] * 8 + [False]
        out = cli(*args, env={**env, "GRAPHCACHE_SHAPE_CLASSES": "exact"})
        assert out.returncode == 1 and "0/9 present" in out.stdout

        out = cli("prefetch", str(path), "--target", str(TARGET), "--server", srv.url, env=env)
        assert out.returncode == 0, out.stderr
        assert "8 spec(s) present through their length class" in out.stdout
        assert f"class {CLASS_128.summary()} serves 8" in out.stdout
        assert DiskStore(tmp_path / "local").exists(key_for(CLASS_128, TARGET)), "the class landed in the local store"

        asked = tmp_path / "asked.json"
        asked.write_text(json.dumps(exact[0].to_dict()))
        out = cli("explain", str(asked), "--target", str(TARGET), "--server", srv.url, env=env)
        assert out.returncode == 0, out.stdout
        assert f"falls in {CLASS_128.summary()}" in out.stdout and "served by its class's graph" in out.stdout
        asked.write_text(json.dumps(exact[8].to_dict()))
        out = cli("explain", str(asked), "--target", str(TARGET), "--server", srv.url, env=env)
        assert out.returncode == 1
        assert f"falls in {class_of(exact[8], 'pow2').summary()}" in out.stdout and "not stored" in out.stdout


DECODE_SCRIPT = """
import torch
import torch.nn.functional as F
q = torch.randn(1, 8, 1, 64, dtype=torch.bfloat16)
for n in range(38, 46):  # one decode loop: seq_kv grows by one a step
    k = torch.randn(1, 2, n, 64, dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
"""


def test_graphcache_record_writes_classes_by_default_and_exact_specs_with_shape_classes_exact(tmp_path):
    pytest.importorskip("torch", reason="graphcache record needs torch")
    script = tmp_path / "decode.py"
    script.write_text(DECODE_SCRIPT)
    classes, exact = tmp_path / "classes.yaml", tmp_path / "exact.yaml"
    out = cli("record", "-o", str(classes), str(script))
    assert out.returncode == 0, out.stderr
    assert "8 spec(s) from 8 SDPA call(s), 1 graph(s) under shape classes pow2" in out.stdout
    assert manifest.load(classes) == [CLASS_128]
    assert "serves 8 exact shape(s) (calls each):\n#       b1 q1 kv38-45 x1\n" in classes.read_text()
    out = cli("record", "-o", str(exact), "--shape-classes", "exact", str(script))
    assert out.returncode == 0, out.stderr
    assert [s.seq_kv for s in manifest.load(exact)] == list(range(38, 46))
    assert all(not s.is_class for s in manifest.load(exact))
    # GRAPHCACHE_SHAPE_CLASSES=exact in record's environment does the same: the
    # CLI record tests of tests/test_torch_record.py run under it and assert
    # exact specs (one torch-importing process fewer here).


def test_check_reads_each_class_once_however_many_exact_specs_it_serves(tmp_path):
    # Over HTTP a class's header is its whole artifact (GET): an exact
    # manifest of a decode loop must not download the class once per spec.
    import httpx

    from graphcache.stores import HttpStore

    _, exact = specs(tmp_path)
    server_store = DiskStore(tmp_path / "server")
    server_store.put(key_for(CLASS_128, TARGET), make_artifact(CLASS_128).encode())
    app = create_app(Settings(cache_dir=server_store.path), store=server_store)
    with ServerThread(app) as srv:
        rows = ops.check(exact, TARGET, HttpStore(srv.url), shape_classes="pow2")
        assert [r.present for r in rows] == [True] * 8 + [False]
        served = [
            float(line.split()[-1])
            for line in httpx.get(srv.url + "/metrics").text.splitlines()
            if line.startswith("graphcache_bytes_served_total")
        ]
    blob = len(server_store.get(key_for(CLASS_128, TARGET)) or b"")
    assert served == [blob], f"one download of the class ({blob} bytes) for its 8 exact specs"


def test_explain_compares_an_exact_spec_with_the_class_that_would_serve_it_never_with_its_shapes(tmp_path):
    """A user's exact spec is never 'different' from a stored class by the
    ``shapes`` field it does not write: explain compares the class fields
    and, for sizes, whether the stored class covers the call within the slack."""
    from tests.fakes import OTHER_TARGET

    store = DiskStore(tmp_path / "s")
    prefill_128 = GraphSpec(batch=1, heads_q=8, seq_q=128, head_dim=64, mask="causal", shapes="class")
    for klass, target in ((prefill_128, TARGET), (prefill_128.replace(seq_q=512, seq_kv=512), OTHER_TARGET)):
        store.put(key_for(klass, target), make_artifact(klass, target).encode())
    asked = GraphSpec(batch=1, heads_q=8, seq_q=300, head_dim=64, mask="causal")
    result = ops.explain(asked, TARGET, store, shape_classes="pow2", class_slack=4)
    assert not result.present and result.serving is None
    every = [d for c in result.nearest for d in c.differences]
    assert not any("shapes" in d for d in every), every
    by_size = {c.spec.seq_q: c.differences for c in result.nearest}
    # Its own class (512) on another GPU: only the target differs.
    assert by_size[512] and all(d.startswith("target.") for d in by_size[512]), by_size[512]
    # A smaller class on this GPU: too short for the call, said in the call's numbers.
    assert by_size[128] == [
        "spec.seq_q: stored up to 128, asked 300 (class 512)",
        "spec.seq_kv: stored up to 128, asked 300 (class 512)",
    ]
    # Under the exact policy no class serves: the policy is the difference, not a field.
    exact = ops.explain(asked.replace(seq_q=100, seq_kv=100), TARGET, store, shape_classes="exact")
    assert {c.spec.seq_q: c.differences for c in exact.nearest}[128] == [
        "policy: GRAPHCACHE_SHAPE_CLASSES is exact here; a stored length class serves only under pow2"
    ]
