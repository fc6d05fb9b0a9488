"""Length classes: class specs, covers(), their keys, the pow2 policy and
GRAPHCACHE_SHAPE_CLASSES (issue 18, items 1-3)."""

from __future__ import annotations

import json

import pytest

from graphcache import GraphSpec, Target, key_for
from graphcache.errors import SpecError
from graphcache.settings import Settings, SettingsError
from graphcache.spec.classes import class_of, policy_from_env
from tests.clirun import cli

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")


def decode(**fields) -> GraphSpec:  # noqa: ANN003
    base = dict(batch=1, heads_q=8, heads_kv=2, seq_q=1, seq_kv=37, head_dim=64, dtype="bfloat16", layout="bhsd")
    return GraphSpec(**{**base, **fields})


def test_shapes_defaults_to_exact_and_a_bad_value_names_shapes():
    assert decode().shapes == "exact" and not decode().is_class
    with pytest.raises(SpecError, match="shapes='dynamic'.*allowed: exact.*class") as err:
        decode(shapes="dynamic")
    assert err.value.field == "shapes"
    with pytest.raises(SpecError) as err:
        GraphSpec.from_dict({**decode().to_dict(), "shapes": 1})
    assert err.value.field == "shapes"


def test_an_exact_specs_canonical_form_has_no_shapes_field_and_a_class_spec_round_trips():
    exact = decode()
    assert "shapes" not in json.loads(exact.canonical_json())
    assert GraphSpec.from_dict({**exact.to_dict(), "shapes": "exact"}) == exact
    klass = decode(seq_kv=128, shapes="class")
    assert json.loads(klass.canonical_json())["shapes"] == "class"
    assert GraphSpec.from_dict(json.loads(klass.canonical_json())) == klass
    assert "shapes" in GraphSpec.json_schema()["properties"]


def test_a_class_key_differs_from_every_exact_key_of_the_same_sizes():
    for spec in (decode(seq_kv=128), decode(batch=4, seq_q=256, seq_kv=256, mask="causal")):
        klass = spec.replace(shapes="class")
        assert key_for(klass, TARGET) != key_for(spec, TARGET)
    assert "class" in decode(shapes="class").summary()


def test_covers_takes_every_real_shape_up_to_the_maxima_with_the_other_fields_equal():
    klass = decode(batch=4, seq_kv=256, shapes="class")
    for b in (1, 3, 4):
        for skv in (1, 33, 129, 256):
            assert klass.covers(decode(batch=b, seq_kv=skv)), (b, skv)
    assert not klass.covers(decode(batch=5))
    assert not klass.covers(decode(seq_kv=257))
    assert not klass.covers(decode(seq_kv=37, mask="causal"))
    assert not klass.covers(decode(seq_kv=37, heads_kv=8))
    assert not klass.covers(decode(seq_kv=37, dtype="float16"))
    assert not klass.covers(decode(seq_kv=37, layout="bshd"))
    assert not klass.covers(klass), "a class spec is not a real shape"
    assert decode().covers(decode()) and not decode().covers(decode(seq_kv=38))


def test_covers_never_crosses_seq_q_1():
    prefill = decode(seq_q=128, seq_kv=128, mask="causal", shapes="class")
    assert prefill.covers(decode(seq_q=2, seq_kv=2, mask="causal"))
    assert not prefill.covers(decode(seq_q=1, seq_kv=2, mask="causal"))
    decode_class = decode(seq_q=1, seq_kv=128, shapes="class")
    assert decode_class.covers(decode(seq_q=1, seq_kv=100))
    assert not decode_class.covers(decode(seq_q=2, seq_kv=100))


@pytest.mark.parametrize(
    ("sizes", "declared"),
    [
        ((1, 1, 37), (1, 1, 128)),  # decode stays decode
        ((1, 1, 128), (1, 1, 128)),
        ((1, 1, 129), (1, 1, 256)),
        ((3, 1, 600), (4, 1, 1024)),
        ((1, 2, 2), (1, 128, 128)),  # any other seq_q: at least 128
        ((5, 200, 200), (8, 256, 256)),
        ((64, 513, 513), (64, 1024, 1024)),
        ((1, 8192, 8192), (1, 8192, 8192)),
        ((1, 4, 4000), (1, 128, 4096)),  # q and kv classed apart
    ],
)
def test_pow2_policy(sizes, declared):
    b, sq, skv = sizes
    spec = decode(batch=b, seq_q=sq, seq_kv=skv, mask="causal" if sq > 1 else "none")
    klass = class_of(spec, "pow2")
    assert (klass.batch, klass.seq_q, klass.seq_kv) == declared
    assert klass.is_class and klass.covers(spec)
    assert class_of(klass, "pow2") == klass


def test_exact_policy_and_dropout_keep_the_exact_spec():
    spec = decode(seq_kv=300)
    assert class_of(spec, "exact") == spec
    dropout = decode(seq_kv=300, dropout=0.1)
    assert class_of(dropout, "pow2") == dropout


def test_the_policy_comes_from_graphcache_shape_classes_and_a_bad_value_lists_the_allowed_ones(monkeypatch):
    assert policy_from_env({}) == "pow2"
    assert policy_from_env({"GRAPHCACHE_SHAPE_CLASSES": "exact"}) == "exact"
    monkeypatch.setenv("GRAPHCACHE_SHAPE_CLASSES", "exact")
    assert class_of(decode(seq_kv=300)) == decode(seq_kv=300)
    assert Settings.from_env().shape_classes == "exact"
    with pytest.raises(SettingsError, match="GRAPHCACHE_SHAPE_CLASSES='pow3'.*allowed: pow2.*exact"):
        Settings.from_env({"GRAPHCACHE_SHAPE_CLASSES": "pow3"})
    with pytest.raises(SettingsError, match="policy='linear'"):
        class_of(decode(), "linear")


def test_a_bad_policy_fails_the_cli_at_start_with_the_allowed_values(tmp_path):
    out = cli("serve", "--cache-dir", str(tmp_path), "--port", "1", env={"GRAPHCACHE_SHAPE_CLASSES": "pow3"})
    assert out.returncode != 0
    assert "GRAPHCACHE_SHAPE_CLASSES='pow3'" in out.stderr and "pow2" in out.stderr and "exact" in out.stderr
    assert "Traceback" not in out.stderr


# -- GraphCache.load under the policy (item 5) ---------------------------------------


def test_load_of_an_exact_spec_builds_and_returns_its_class_graph_once_for_the_whole_class(tmp_path):
    from graphcache import GraphCache
    from graphcache.stores import DiskStore
    from tests.fakes import FakeCompiler

    compiler = FakeCompiler(target=TARGET)
    cache = GraphCache(DiskStore(tmp_path / "s"), compiler, shape_classes="pow2")
    graphs = [cache.load(decode(seq_kv=n)) for n in (37, 38, 100, 128)]
    klass = decode(seq_kv=128, shapes="class")
    assert [g.spec for g in graphs] == [klass] * 4
    assert compiler.builds == 1 and cache.store.exists(key_for(klass, TARGET))
    assert not cache.store.exists(key_for(decode(seq_kv=37), TARGET))
    assert cache.load(decode(seq_kv=129)).spec == decode(seq_kv=256, shapes="class") and compiler.builds == 2


def test_a_class_refused_on_the_target_is_remembered_and_the_exact_graph_serves(tmp_path):
    from graphcache import GraphCache
    from graphcache.stores import DiskStore
    from tests.fakes import FakeCompiler

    compiler = FakeCompiler(target=TARGET, classes=False)
    cache = GraphCache(DiskStore(tmp_path / "s"), compiler, shape_classes="pow2")
    assert cache.load(decode(seq_kv=37)).spec == decode(seq_kv=37)
    # The class (refused, stored as a negative entry), its padded form (refused too), then the exact graph.
    assert compiler.builds == 3
    assert cache.lookup(decode(seq_kv=128, shapes="class")).unsupported
    assert cache.lookup(decode(seq_kv=128, shapes="class", mechanism="padded")).unsupported
    assert cache.load(decode(seq_kv=40)).spec == decode(seq_kv=40)
    assert compiler.builds == 4, "the negative entries answered: neither form of the class was tried again"


def test_a_class_whose_override_the_engine_refuses_is_served_by_its_padded_form(tmp_path):
    from graphcache import GraphCache
    from graphcache.stores import DiskStore
    from tests.fakes import FakeCompiler

    store = DiskStore(tmp_path / "s")
    compiler = FakeCompiler(target=TARGET, override=False)
    cache = GraphCache(store, compiler, shape_classes="pow2")
    graph = cache.load(decode(seq_kv=37))
    assert graph.spec == decode(seq_kv=128, shapes="class", mechanism="padded")
    assert cache.lookup(decode(seq_kv=128, shapes="class")).unsupported, "override's refusal is remembered"
    # A fresh worker over the same store: the negative entry, then the padded graph, nothing built.
    worker = FakeCompiler(target=TARGET, override=False)
    assert GraphCache(store, worker, shape_classes="pow2").load(decode(seq_kv=90)).spec.mechanism == "padded"
    assert worker.builds == 0


def test_build_false_takes_a_stored_class_else_a_stored_exact_graph_and_policy_exact_ignores_classes(tmp_path):
    from graphcache import GraphCache, NotFound
    from graphcache.stores import DiskStore
    from tests.fakes import FakeCompiler

    store = DiskStore(tmp_path / "s")
    exact_cache = GraphCache(store, FakeCompiler(target=TARGET), shape_classes="exact")
    assert exact_cache.load(decode(seq_kv=37)).spec == decode(seq_kv=37)
    classes = GraphCache(store, FakeCompiler(target=TARGET), shape_classes="pow2")
    assert classes.load(decode(seq_kv=37), build=False).spec == decode(seq_kv=37)  # no class stored yet
    with pytest.raises(NotFound):
        classes.load(decode(seq_kv=38), build=False)
    classes.get(decode(seq_kv=128, shapes="class"))
    assert classes.load(decode(seq_kv=37), build=False).spec.is_class
    assert exact_cache.load(decode(seq_kv=38), build=True).spec == decode(seq_kv=38)


def test_a_class_spec_with_dropout_is_refused_naming_shapes():
    with pytest.raises(SpecError, match="shapes='class' is not supported with dropout") as err:
        decode(shapes="class", dropout=0.1)
    assert err.value.field == "shapes"


def test_ragged_and_paged_specs_have_no_length_class():
    ragged = GraphSpec(batch=3, heads_q=8, heads_kv=2, seq_q=200, seq_kv=300, head_dim=64, layout="thd")
    assert class_of(ragged, "pow2") == ragged, "a thd graph serves many lengths through its offsets already"
    with pytest.raises(SpecError, match="shapes='class' is not supported with ragged or paged") as err:
        ragged.replace(shapes="class")
    assert err.value.field == "shapes"


def test_a_bad_shape_classes_argument_is_refused_naming_it(tmp_path):
    from graphcache import GraphCache, ops
    from graphcache.stores import DiskStore

    store = DiskStore(tmp_path)
    spec = GraphSpec(batch=1, heads_q=8, heads_kv=2, seq_q=1, seq_kv=40, head_dim=64)
    target = Target.parse("h200-sm90-mp132-cudnn9.28.0-fe1.32.0")
    for call in (
        lambda: GraphCache(store, shape_classes="Pow2"),
        lambda: ops.check([spec], target, store, shape_classes="Pow2"),
        lambda: ops.explain(spec, target, store, shape_classes="Pow2"),
    ):
        with pytest.raises(SettingsError, match=r"shape_classes='Pow2' is not a shape-class policy; allowed: pow2"):
            call()
