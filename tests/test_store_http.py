"""HttpStore and TieredStore against a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import pytest

from graphcache import GraphCache, StoreUnavailable
from graphcache.settings import Settings
from graphcache.stores import DiskStore, HttpStore, TieredStore
from service.app import create_app
from tests.fakes import FakeCompiler, make_artifact, spec
from tests.servers import ServerThread


@pytest.fixture
def server_store(tmp_path):
    return DiskStore(tmp_path / "server")


@pytest.fixture
def server(server_store):
    app = create_app(Settings(cache_dir=server_store.path, write_tokens=("w",)), store=server_store)
    with ServerThread(app) as srv:
        yield srv


def test_http_store_round_trip(server):
    store = HttpStore(server.url, token="w", timeout=5)
    art = make_artifact(spec(), size=100_000)
    assert store.get(art.key) is None and not store.exists(art.key)
    assert store.put(art.key, art.encode()) is True
    assert store.put(art.key, art.encode()) is False
    assert store.get(art.key) == art.encode() and store.exists(art.key)
    assert list(store.keys()) == [art.key]


def test_http_store_without_token_cannot_write(server):
    from graphcache import StoreError

    with pytest.raises(StoreError, match="401"):
        HttpStore(server.url).put(make_artifact(spec()).key, make_artifact(spec()).encode())


def test_http_store_refuses_corrupt_downloads(tmp_path):
    # A misbehaving server (or a proxy) that returns flipped bytes.
    art = make_artifact(spec(), size=50_000)
    bad = bytearray(art.encode())
    bad[-1] ^= 1

    async def app(scope, receive, send):
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/octet-stream")]}
        )
        await send({"type": "http.response.body", "body": bytes(bad)})

    with ServerThread(app) as srv:
        store = HttpStore(srv.url)
        assert store.get(art.key) is None
        assert store.corrupt == 1


def test_slow_server_times_out_and_then_fails_fast(tmp_path):
    async def slow(scope, receive, send):
        await asyncio.sleep(5)

    with ServerThread(slow) as srv:
        store = HttpStore(srv.url, timeout=0.5, retry_after=30)
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.get("a" * 64)
        assert time.monotonic() - t0 < 3
        t0 = time.monotonic()
        # The pause names the failure that started it (the first call's timeout), not a retry it does not make.
        with pytest.raises(
            StoreUnavailable, match=r"did not answer \(ReadTimeout: .*\); not asked again for another \d+s"
        ):
            store.get("a" * 64)
        assert time.monotonic() - t0 < 0.1


def test_tiered_round_trip_fills_the_local_tier(server, tmp_path):
    remote = HttpStore(server.url, token="w")
    art = make_artifact(spec(), size=80_000)
    remote.put(art.key, art.encode())
    local = DiskStore(tmp_path / "local")
    tiered = TieredStore(local, remote)
    assert not local.exists(art.key)
    assert tiered.get(art.key) == art.encode()
    assert local.exists(art.key)
    other = make_artifact(spec(batch=2))
    assert tiered.put(other.key, other.encode()) is True
    assert local.exists(other.key) and remote.exists(other.key)


def test_graph_cache_over_tiered_store_builds_once_for_the_fleet(server, tmp_path):
    compiler = FakeCompiler()
    worker_a = GraphCache(TieredStore(DiskStore(tmp_path / "a"), HttpStore(server.url, token="w")), compiler)
    worker_b = GraphCache(TieredStore(DiskStore(tmp_path / "b"), HttpStore(server.url, token="w")), compiler)
    assert worker_a.get(spec()).key == worker_b.get(spec()).key
    assert compiler.builds == 1
    assert worker_b.stats()["hits"] == 1


def test_server_stopped_mid_test_client_falls_back(server_store, tmp_path):
    app = create_app(Settings(cache_dir=server_store.path, write_tokens=("w",)), store=server_store)
    srv = ServerThread(app).start()
    compiler = FakeCompiler()
    local = DiskStore(tmp_path / "local")
    tiered = TieredStore(local, HttpStore(srv.url, token="w", timeout=1))
    cache = GraphCache(tiered, compiler)
    first = cache.get(spec(batch=1))  # built, stored locally and on the server
    srv.stop()
    t0 = time.monotonic()
    assert cache.get(spec(batch=1)).key == first.key  # the local tier answers
    second = cache.get(spec(batch=2))  # a miss: the server is down, build locally
    assert time.monotonic() - t0 < 5, "a dead server must never hang a worker"
    assert local.exists(second.key) and compiler.builds == 2
    assert tiered.remote_errors >= 1


def test_graph_cache_over_http_only_falls_back_to_building(server_store):
    app = create_app(Settings(cache_dir=server_store.path), store=server_store)
    srv = ServerThread(app).start()
    url = srv.url
    srv.stop()
    compiler = FakeCompiler()
    cache = GraphCache(HttpStore(url, timeout=1), compiler)
    art = cache.get(spec())
    assert art.spec == spec() and compiler.builds == 1
    assert cache.stats()["store_errors"] >= 1


def test_http_store_resolve_and_pin(server):
    from tests.fakes import TARGET

    store = HttpStore(server.url, token="w")
    art = make_artifact(spec())
    assert store.resolve(spec().to_dict(), str(TARGET)) == {
        "key": art.key,
        "present": False,
        "target": str(TARGET),
        "spec": spec().to_dict(),
    }
    store.put(art.key, art.encode())
    assert store.resolve(spec().to_dict(), str(TARGET))["present"] is True
    assert store.pin(art.key) is True
    assert store.pin(make_artifact(spec(batch=5)).key) is False
