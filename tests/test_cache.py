from __future__ import annotations

import threading

import pytest

from graphcache import GraphCache, NotFound, NotSerializable
from graphcache.stores import DiskStore
from tests.fakes import TARGET, FakeCompiler, spec


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path / "store")


def test_miss_builds_stores_and_then_hits(store):
    compiler = FakeCompiler()
    cache = GraphCache(store, compiler)
    first = cache.get(spec())
    assert compiler.builds == 1 and store.exists(first.key)
    second = cache.get(spec())
    assert second == first and compiler.builds == 1
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["builds"], stats["corrupt"]) == (1, 1, 1, 0)


def test_sixteen_threads_missing_one_key_cause_one_build(store):
    compiler = FakeCompiler(delay=0.3)
    cache = GraphCache(store, compiler)
    barrier = threading.Barrier(16)
    results, errors = [], []

    def worker():
        barrier.wait()
        try:
            results.append(cache.get(spec()))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert compiler.builds == 1
    assert len(results) == 16 and len({r.key for r in results}) == 1


def test_corrupt_entry_is_counted_removed_and_rebuilt(store):
    compiler = FakeCompiler()
    cache = GraphCache(store, compiler)
    art = cache.get(spec())
    data = bytearray(store.get(art.key))
    data[-1] ^= 0xFF
    store.put(art.key, bytes(data))
    again = cache.get(spec())
    assert again.payload == art.payload
    stats = cache.stats()
    assert stats["corrupt"] == 1 and stats["builds"] == 2


def test_an_entry_for_another_key_is_corrupt(store):
    cache = GraphCache(store, FakeCompiler())
    a = cache.get(spec(batch=1))
    b = cache.get(spec(batch=2))
    store.put(b.key, store.get(a.key))  # the right bytes under the wrong key
    assert cache.get(spec(batch=2)).key == b.key
    assert cache.stats()["corrupt"] == 1


def test_unsupported_spec_is_remembered_not_rebuilt(store):
    compiler = FakeCompiler(unsupported={"sliding_window"})
    cache = GraphCache(store, compiler)
    window = spec(mask="sliding_window", window_left=16)
    for _ in range(3):
        with pytest.raises(NotSerializable, match="no serializable plan"):
            cache.get(window)
    assert compiler.builds == 1
    # A fresh cache over the same store knows too: the negative entry is stored.
    with pytest.raises(NotSerializable):
        GraphCache(store, compiler).get(window)
    assert compiler.builds == 1


def test_reader_without_compiler_gets_not_found_for_a_miss(store):
    cache = GraphCache(store)
    with pytest.raises(NotFound, match="no compiler"):
        cache.get(spec(), TARGET)
    GraphCache(store, FakeCompiler()).get(spec())
    assert cache.get(spec(), TARGET).spec == spec()


def test_signed_cache_refuses_unsigned_entries(store):
    GraphCache(store, FakeCompiler()).get(spec())  # unsigned entry
    strict = GraphCache(store, FakeCompiler(), signing_key=b"k", require_signed=True)
    art = strict.get(spec())  # unsigned one is corrupt for it: rebuilt and signed
    assert art.signature and strict.stats()["corrupt"] == 1
    assert strict.get(spec()).signature == art.signature


@pytest.mark.torch
def test_torch_fallback_when_no_gpu(store):
    import torch

    from graphcache.compilers.cudnn import CudnnCompiler

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cache = GraphCache(store, CudnnCompiler(), torch_fallback=True)
    s = spec(mask="causal")
    graph = cache.load(s, TARGET)
    assert graph.backend == "torch" and cache.stats()["fallbacks"] == 1
    q, k, v = (torch.randn(s.storage_shape(r), dtype=torch.float16) for r in "qkv")
    assert graph.execute(q, k, v).shape == s.storage_shape("o")


def test_unsupported_spec_kinds_are_remembered_as_they_were_raised(store):
    from graphcache import UnsupportedSpec

    class Refusing(FakeCompiler):
        def build(self, spec, target, uids=None):  # noqa: ANN001
            self.builds += 1
            raise UnsupportedSpec("cuDNN refused it at check_support")

    compiler = Refusing()
    for _ in range(2):
        with pytest.raises(UnsupportedSpec, match="check_support") as info:
            GraphCache(store, compiler).get(spec())
        assert not isinstance(info.value, NotSerializable)
    assert compiler.builds == 1


def test_build_false_is_a_miss_not_a_build(store):
    compiler = FakeCompiler()
    cache = GraphCache(store, compiler)
    with pytest.raises(NotFound, match="build=False"):
        cache.load(spec(), build=False)
    assert compiler.builds == 0 and cache.stats()["misses"] == 1
    cache.get(spec())
    assert cache.load(spec(), build=False) is not None and compiler.builds == 1


class _CudnnUpToTheGpu(FakeCompiler):
    """CudnnCompiler on a lent H200's stack up to the first step a CPU cannot
    run: a class spec goes through CudnnCompiler's own build, whose release
    check refuses it at preflight below cuDNN 9.21 (the run of 2026-12-04 on
    cuDNN 9.19 with frontend 1.28, whose stand-in, tests/cudnn_standins.py,
    records any graph made); everything else is FakeCompiler's build (the
    GPU steps)."""

    def __init__(self, target: str) -> None:
        from graphcache import Target
        from graphcache.compilers.cudnn import CudnnCompiler
        from tests.cudnn_standins import fe_1_27

        super().__init__(Target.parse(target))
        self.frontend = fe_1_27()  # 1.27-1.30's graph API (1.28 read)
        self.cudnn = CudnnCompiler(cudnn_module=self.frontend, canary=False)
        self.cudnn._target = self._target
        self.cudnn.preflight = lambda: None  # the GPU and cuDNN checks an H200 passes

    def build(self, spec, target, uids=None):  # noqa: ANN001, ANN201
        from graphcache.compilers.cudnn.releases import class_mechanism

        chosen = class_mechanism(spec, self._target)
        if chosen is not None and not chosen.serves:
            return self.cudnn.build(spec, target, uids)  # refused before any graph: no GPU step to stand in for
        return super().build(spec, target, uids)


@pytest.mark.parametrize(
    ("stack", "kind", "served_by"),
    [
        ("h200-sm90-mp132-cudnn9.19.0-fe1.28.0", "backward", "exact"),  # no override, and no padded backward
        ("h200-sm90-mp132-cudnn9.19.0-fe1.28.0", "forward", "padded"),  # no override: the padded class
        ("h200-sm90-mp132-cudnn9.21.0-fe1.28.0", "forward", "override"),
    ],
)
def test_a_class_refused_at_preflight_is_counted_unsupported_not_built(store, stack, kind, served_by):
    compiler = _CudnnUpToTheGpu(stack)
    exact = spec(seq_q=128 if kind == "backward" else 1, seq_kv=200, heads_kv=2, kind=kind)
    cache = GraphCache(store, compiler, shape_classes="pow2")
    graph = cache.load(exact)
    assert graph.spec.is_class is (served_by != "exact") and compiler.frontend.calls == []
    assert (graph.spec.mechanism == "padded") is (served_by == "padded")
    stats = cache.stats()
    assert (stats["builds"], stats["unsupported"]) == (1, 1 if served_by == "exact" else 0), stats
    again = GraphCache(store, compiler, shape_classes="pow2")
    again.load(exact)
    assert again.stats()["builds"] == 0, "the stored graph (and negative entry) answered a fresh cache"
