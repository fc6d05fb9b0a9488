"""One contract every Store passes: DiskStore, RedisStore, HttpStore, TieredStore."""

from __future__ import annotations

import pytest

from graphcache import Artifact
from graphcache.settings import Settings
from graphcache.stores import DiskStore, HttpStore, Store, TieredStore
from service.app import create_app
from tests.fakes import make_artifact, spec
from tests.servers import ServerThread


@pytest.fixture(params=["disk", "redis", "http", "tiered"])
def store(request, tmp_path):
    kind = request.param
    if kind == "disk":
        yield DiskStore(tmp_path / "disk")
    elif kind == "redis":
        yield request.getfixturevalue("redis_store")
    else:
        backing = DiskStore(tmp_path / "server")
        with ServerThread(create_app(Settings(cache_dir=backing.path), store=backing)) as srv:
            http = HttpStore(srv.url)
            yield http if kind == "http" else TieredStore(DiskStore(tmp_path / "local"), http)


def test_is_a_store(store):
    assert isinstance(store, Store)


def test_absent(store):
    key = make_artifact(spec()).key
    assert store.get(key) is None
    assert not store.exists(key)
    assert store.delete(key) is False


def test_put_get_delete(store):
    art = make_artifact(spec(), size=70_000)
    data = art.encode()
    assert store.put(art.key, data) is True
    assert store.put(art.key, data) is False
    assert store.exists(art.key)
    assert store.get(art.key) == data
    assert art.key in set(store.keys())
    assert store.delete(art.key) is True
    assert store.get(art.key) is None and not store.exists(art.key)


def test_replacing_an_entry(store):
    first = make_artifact(spec(), size=1000)
    second = Artifact(spec=first.spec, target=first.target, payload=b"x" * 2000)
    store.put(first.key, first.encode())
    assert store.put(first.key, second.encode()) is True
    assert store.get(first.key) == second.encode()


def test_large_and_many(store):
    big = make_artifact(spec(), size=5 * 1024 * 1024)
    store.put(big.key, big.encode())
    arts = [make_artifact(spec(batch=b), size=3000) for b in range(2, 30)]
    for art in arts:
        store.put(art.key, art.encode())
    assert Artifact.decode(store.get(big.key), expected_key=big.key).payload == big.payload
    assert set(store.keys()) == {big.key} | {a.key for a in arts}


def test_stored_header_reads_the_header_of_an_entry(store):
    import pytest as _pytest

    from graphcache import CorruptArtifact
    from graphcache.artifact import read_header
    from graphcache.stores import stored_header

    big = make_artifact(spec(), size=5 * 1024 * 1024)
    store.put(big.key, big.encode())
    assert stored_header(store, big.key) == read_header(big.encode())
    assert stored_header(store, make_artifact(spec(batch=9)).key) is None
    bad = make_artifact(spec(batch=3))
    if isinstance(store, (HttpStore, TieredStore)):
        with _pytest.raises(CorruptArtifact):  # the service refuses to store it at all
            store.put(bad.key, b"NOPE!" + bad.encode()[5:])
        return
    store.put(bad.key, b"NOPE!" + bad.encode()[5:])
    with _pytest.raises(CorruptArtifact, match="bad magic"):
        stored_header(store, bad.key)
