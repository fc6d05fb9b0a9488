"""Issue 26, item 1 and 2: when a call's own class is not stored, the
smallest stored class that covers it serves it (within
GRAPHCACHE_CLASS_SLACK), chosen from an in-memory index of the local store,
and a batch class serves every smaller batch."""

from __future__ import annotations

import pytest

from graphcache import GraphCache, NotFound, UnsupportedSpec
from graphcache.classindex import ClassIndex, work
from graphcache.settings import Settings, SettingsError
from graphcache.spec.classes import class_of
from graphcache.stores import DiskStore
from tests.clirun import cli
from tests.fakes import TARGET, FakeCompiler, spec


def prefill(n: int, batch: int = 1):  # noqa: ANN201
    return spec(batch=batch, seq_q=n, seq_kv=n)


def decode(kv: int, batch: int = 1):  # noqa: ANN201
    return spec(batch=batch, seq_q=1, seq_kv=kv, mask="none")


def warmed(tmp_path, *specs, **options):  # noqa: ANN001, ANN002, ANN003, ANN201
    """A fresh cache (a new process) over a store another cache warmed with
    the classes of ``specs``."""
    folder = tmp_path / "store"
    builder = GraphCache(DiskStore(folder), FakeCompiler(), shape_classes="pow2")
    for s in specs:
        builder.get(class_of(s, "pow2"))
    compiler = FakeCompiler()
    return GraphCache(DiskStore(folder), compiler, shape_classes="pow2", **options), compiler


def test_a_call_whose_class_was_never_stored_is_served_by_the_smallest_larger_stored_class(tmp_path):
    # What a recording of prompts 37, 200 and 513 stores: classes 128, 256 and 1024.
    cache, compiler = warmed(tmp_path, prefill(37), prefill(200), prefill(513), decode(38), decode(514))
    graph = cache.load(prefill(300), build=False)  # its own class, 512, was never stored
    assert graph.spec == class_of(prefill(513), "pow2") and graph.spec.seq_q == 1024
    assert cache.load(decode(301), build=False).spec == class_of(decode(514), "pow2")
    assert compiler.builds == 0
    stats = cache.stats()
    assert stats["served_by_larger"] == 2
    assert stats["declared_to_real"] == round((1024 * 1024 + 1024) / (300 * 300 + 301), 3)


def test_the_calls_own_class_serves_when_stored_even_if_a_larger_one_is(tmp_path):
    cache, _ = warmed(tmp_path, prefill(300), prefill(513))
    assert cache.load(prefill(300), build=False).spec.seq_q == 512
    assert cache.stats()["served_by_larger"] == 0


def test_a_class_beyond_the_slack_never_serves(tmp_path):
    # 2048 x 2048 declares 16x the work of the call's own class (512 x 512).
    cache, compiler = warmed(tmp_path, prefill(2000))
    with pytest.raises(NotFound):
        cache.load(prefill(300), build=False)
    graph = cache.load(prefill(300))  # with build, its own class is built instead
    assert graph.spec == class_of(prefill(300), "pow2") and compiler.builds == 1
    wider, _ = warmed(tmp_path / "again", prefill(2000), class_slack=16)
    assert wider.load(prefill(300), build=False).spec.seq_q == 2048


def test_the_slack_bound_is_inclusive_and_1_serves_only_own_classes(tmp_path):
    cache, _ = warmed(tmp_path, prefill(1000))  # exactly 4x of 512 x 512
    assert cache.load(prefill(300), build=False).spec.seq_q == 1024
    strict, _ = warmed(tmp_path / "strict", prefill(1000), class_slack=1)
    with pytest.raises(NotFound):
        strict.load(prefill(300), build=False)


def test_a_prefill_class_never_serves_decode_nor_the_reverse(tmp_path):
    cache, _ = warmed(tmp_path, prefill(1000), decode(1000))
    assert cache.serving_class(decode(300)).seq_q == 1
    assert cache.serving_class(prefill(300)).seq_q == 1024
    index = ClassIndex()
    index.add(class_of(prefill(1000), "pow2"), TARGET)
    assert index.choose(decode(300), class_of(decode(300), "pow2"), TARGET, 64.0) == class_of(decode(300), "pow2")


def test_a_batch_class_serves_every_smaller_batch_and_never_a_larger_one(tmp_path):
    cache, _ = warmed(tmp_path, prefill(100, batch=4), decode(100, batch=4))
    for batch in (1, 2, 3, 4):
        assert cache.load(prefill(90, batch=batch), build=False).spec.batch == 4
        assert cache.load(decode(90, batch=batch), build=False).spec.batch == 4
    with pytest.raises(NotFound):
        cache.load(prefill(90, batch=5), build=False)


def test_other_fields_must_match_exactly(tmp_path):
    cache, _ = warmed(tmp_path, prefill(1000))
    other_heads = spec(seq_q=300, seq_kv=300, heads_q=16)
    assert cache.serving_class(other_heads) == class_of(other_heads, "pow2")


def test_the_index_follows_what_this_cache_builds_and_fetches(tmp_path):
    store = DiskStore(tmp_path / "store")
    cache = GraphCache(store, FakeCompiler(), shape_classes="pow2")
    assert cache.serving_class(prefill(300)).seq_q == 512  # nothing stored: its own class
    cache.load(prefill(1000))  # builds the 1024 class
    assert cache.serving_class(prefill(300)).seq_q == 1024
    reader = GraphCache(store, FakeCompiler(), shape_classes="pow2")
    reader.index()  # read from the store: the 1024 class
    other = GraphCache(store, FakeCompiler(), shape_classes="pow2")
    other.get(class_of(prefill(3000), "pow2"))  # another process stores 4096 ...
    reader.lookup(class_of(prefill(3000), "pow2"))  # ... which this one fetches
    assert class_of(prefill(3000), "pow2") in reader.index().stored(prefill(3000), TARGET)


def test_a_negative_entry_is_not_indexed(tmp_path):
    store = DiskStore(tmp_path / "store")
    with pytest.raises(UnsupportedSpec):
        GraphCache(store, FakeCompiler(classes=False), shape_classes="pow2").get(class_of(prefill(1000), "pow2"))
    cache = GraphCache(store, FakeCompiler(), shape_classes="pow2")
    assert len(cache.index()) == 0
    assert cache.serving_class(prefill(300)).seq_q == 512


def test_the_choice_reads_no_store(tmp_path):
    cache, _ = warmed(tmp_path, prefill(1000))
    cache.index()
    reads = []
    real_get = cache.store.get
    cache.store.get = lambda key: reads.append(key) or real_get(key)  # type: ignore[method-assign]
    for n in (300, 301, 400, 500):
        assert cache.serving_class(prefill(n)).seq_q == 1024
    assert reads == []


def test_work_is_batch_times_both_lengths():
    assert work(spec(batch=2, seq_q=3, seq_kv=5)) == 30


@pytest.mark.parametrize("value", ["0.5", "abc", "inf", "nan", "-1", "0"])
def test_a_bad_class_slack_fails_at_start_naming_it(tmp_path, monkeypatch, value):
    monkeypatch.setenv("GRAPHCACHE_CLASS_SLACK", value)
    with pytest.raises(SettingsError, match="GRAPHCACHE_CLASS_SLACK"):
        GraphCache(DiskStore(tmp_path), FakeCompiler())
    with pytest.raises(SettingsError, match="GRAPHCACHE_CLASS_SLACK"):
        Settings.from_env()  # a worker, the server and the CLI read it at start
    with pytest.raises(SettingsError, match="GRAPHCACHE_CLASS_SLACK"):
        GraphCache.from_env(FakeCompiler())
    with pytest.raises(SettingsError, match="class_slack"):
        GraphCache(DiskStore(tmp_path), FakeCompiler(), class_slack=0.5)


def test_the_class_slack_is_read_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHCACHE_CLASS_SLACK", "16")
    assert GraphCache(DiskStore(tmp_path), FakeCompiler()).class_slack == 16.0
    assert Settings.from_env().class_slack == 16.0
    settings = Settings.from_env({"GRAPHCACHE_DIR": str(tmp_path), "GRAPHCACHE_CLASS_SLACK": "8"})
    assert GraphCache.from_env(FakeCompiler(), settings=settings).class_slack == 8.0
    monkeypatch.delenv("GRAPHCACHE_CLASS_SLACK")
    assert GraphCache(DiskStore(tmp_path), FakeCompiler()).class_slack == 4.0


def test_explain_names_the_larger_class_that_serves_and_why_the_others_do_not(tmp_path):
    from graphcache import ops

    cache, _ = warmed(tmp_path, prefill(100), prefill(1000), prefill(3000), prefill(100, batch=2))
    store = cache.store
    result = ops.explain(prefill(300), TARGET, store, shape_classes="pow2", class_slack=4)
    assert result.klass is not None and result.klass.seq_q == 512 and not result.class_present
    assert result.serving == class_of(prefill(1000), "pow2")
    assert result.not_serving == [
        "b1 q512 kv512 (the call's own class): not stored",
        "b1 q128 kv128: does not cover the call (seq_q 128 < 300, seq_kv 128 < 300)",
        "b2 q128 kv128: does not cover the call (seq_q 128 < 300, seq_kv 128 < 300)",
        "b1 q4096 kv4096: declares 64x the work of the call's own class, over the slack 4 (GRAPHCACHE_CLASS_SLACK)",
    ]
    strict = ops.explain(prefill(300), TARGET, store, shape_classes="pow2", class_slack=1)
    assert strict.serving is None and "over the slack 1" in strict.not_serving[3]
    run = cli(
        "explain",
        str(_spec_file(tmp_path, prefill(300))),
        "--target",
        str(TARGET),
        env={"GRAPHCACHE_DIR": str(tmp_path / "store")},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "is served by the smallest larger stored class b1 h8 s1024 d64 fp16 bshd causal class" in run.stdout
    assert "b1 q4096 kv4096: declares 64x the work" in run.stdout


def _spec_file(tmp_path, s):  # noqa: ANN001, ANN202
    import json

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(s.to_dict()))
    return path


def test_warm_check_counts_a_spec_present_through_a_larger_stored_class(tmp_path):
    from graphcache import ops

    cache, _ = warmed(tmp_path, prefill(1000), prefill(3000))
    rows = ops.check([prefill(300), prefill(600), prefill(100)], TARGET, cache.store, shape_classes="pow2")
    assert [(r.present, r.served_by.seq_q if r.served_by else None) for r in rows] == [
        (True, 1024),  # 4x its own class (512)
        (True, 1024),
        (False, None),  # 1024 is 64x its own class (128), 4096 more
    ]
    strict = ops.check([prefill(300)], TARGET, cache.store, shape_classes="pow2", class_slack=1)
    assert not strict[0].present


def test_prefetch_counts_a_spec_present_through_a_larger_stored_class_and_fetches_that_class(tmp_path):
    from graphcache.stores import TieredStore

    server, _ = warmed(tmp_path, prefill(1000), prefill(3000))
    local = DiskStore(tmp_path / "local")
    asked = [prefill(300), prefill(600), prefill(100)]
    report = GraphCache(TieredStore(local, server.store), shape_classes="pow2").prefetch(asked, TARGET)
    assert report.present == 2 and report.missing == (prefill(100),)  # 1024 is 64x its own class (128)
    assert {s: k.seq_q for s, k in report.served_by.items()} == {prefill(300): 1024, prefill(600): 1024}
    # What the worker then serves from its local store alone, with no build and no server.
    worker = GraphCache(local, FakeCompiler(), shape_classes="pow2")
    assert worker.load(prefill(300), build=False).spec.seq_q == 1024
    strict = GraphCache(TieredStore(DiskStore(tmp_path / "l2"), server.store), shape_classes="pow2", class_slack=1)
    assert strict.prefetch(asked, TARGET).missing == (prefill(300), prefill(100))  # 600's own class is 1024


def test_the_prefetch_command_counts_a_larger_stored_class_over_a_real_server(tmp_path):
    import json

    from graphcache import key_for
    from service.app import create_app
    from tests.servers import ServerThread

    server, _ = warmed(tmp_path, prefill(1000))
    path = tmp_path / "m.yaml"
    path.write_text(json.dumps({"graphs": [{"name": f"p{n}", **prefill(n).to_dict()} for n in (300, 600)]}))
    app = create_app(Settings(cache_dir=server.store.path, write_tokens=("w",)), store=server.store)
    with ServerThread(app) as srv:
        env = {"GRAPHCACHE_TOKEN": "w", "GRAPHCACHE_DIR": str(tmp_path / "local")}
        out = cli("prefetch", str(path), "--target", str(TARGET), "--server", srv.url, "--strict", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    klass = class_of(prefill(1000), "pow2")
    assert f"class {klass.summary()} serves 2" in out.stdout
    assert DiskStore(tmp_path / "local").exists(key_for(klass, TARGET))
