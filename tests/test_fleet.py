"""Stateless replicas over one Redis: shared cache, one build per key, retention."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from graphcache import GraphCache, ops
from graphcache.settings import Settings
from graphcache.stores import DiskStore, HttpStore, TieredStore
from graphcache.stores.redis import RedisStore
from service.app import create_app
from tests.fakes import OTHER_TARGET, TARGET, FakeCompiler, make_artifact, spec
from tests.servers import ServerThread

WRITE = "w"


def replica(url: str, compiler=None) -> ServerThread:  # noqa: ANN001
    store = RedisStore(url)
    return ServerThread(
        create_app(Settings(write_tokens=(WRITE,), admin_tokens=("a",)), store=store, compiler=compiler)
    )


def test_two_replicas_share_one_cache(redis_store, redis_url):
    with replica(redis_url) as one, replica(redis_url) as two:
        art = make_artifact(spec(), size=2 * 1024 * 1024)
        assert HttpStore(one.url, token=WRITE).put(art.key, art.encode()) is True
        assert HttpStore(two.url).get(art.key) == art.encode()
        assert HttpStore(two.url).exists(art.key)


def test_eight_concurrent_misses_across_two_replicas_build_once(redis_store, redis_url):
    compilers = [FakeCompiler(delay=0.5), FakeCompiler(delay=0.5)]
    with replica(redis_url, compilers[0]) as one, replica(redis_url, compilers[1]) as two:
        barrier = threading.Barrier(8)
        keys, built, errors = [], [], []

        def ask(url: str) -> None:
            barrier.wait()
            try:
                r = httpx.post(
                    f"{url}/v1/build",
                    json={"spec": spec().to_dict()},
                    headers={"authorization": f"Bearer {WRITE}"},
                    timeout=30,
                )
                r.raise_for_status()
                keys.append(r.json()["key"])
                built.append(r.json()["built"])
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=ask, args=(u,)) for u in [one.url, two.url] * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    assert len(keys) == 8 and len(set(keys)) == 1
    assert compilers[0].builds + compilers[1].builds == 1
    assert built.count(True) == 1, "exactly one answer says it built"


HOLDER = r"""
import sys, time
from graphcache.stores.lease import Lease
from graphcache.stores.redis import RedisStore
lease = Lease(RedisStore(sys.argv[1]).leases(), sys.argv[2], ttl=1.0)
assert lease.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_killed_builder_loses_its_lease_and_another_builds(redis_store, redis_url):
    key = make_artifact(spec()).key
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_url, key],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        compiler = FakeCompiler()
        cache = GraphCache(RedisStore(redis_url), compiler, lease_ttl=1.0)
        result = {}
        waiter = threading.Thread(target=lambda: result.setdefault("art", cache.get(spec())))
        waiter.start()
        time.sleep(2.0)  # the holder's heartbeat keeps the lease alive: nobody else builds
        assert waiter.is_alive() and compiler.builds == 0
        holder.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        waiter.join(20)
        assert not waiter.is_alive()
        assert compiler.builds == 1 and result["art"].key == key
        assert time.monotonic() - t0 < 5, "the lease must expire about 1 s after its holder died"
        assert cache.stats()["lease_waits"] == 1
    finally:
        holder.kill()
        holder.wait()


def test_disk_store_leases_work_across_processes(tmp_path):
    key = make_artifact(spec()).key
    leases = DiskStore(tmp_path).leases()
    assert leases.try_acquire(key, "a", 0.5)
    assert not DiskStore(tmp_path).leases().try_acquire(key, "b", 0.5)
    assert leases.renew(key, "a", 0.5) and not leases.renew(key, "b", 0.5)
    time.sleep(0.7)
    assert DiskStore(tmp_path).leases().try_acquire(key, "b", 0.5), "an expired lease can be taken"
    leases.release(key, "a")  # not the owner any more: no effect
    assert not leases.try_acquire(key, "c", 0.5)


def test_pinned_entries_survive_eviction_pressure_in_redis(private_redis):
    server = private_redis("--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru")
    store = RedisStore(server.url)
    pinned = [make_artifact(spec(batch=b), size=100_000) for b in (1, 2, 3)]
    for art in pinned:
        store.put(art.key, art.encode(), pin=True)
    flood = [make_artifact(spec(batch=b), size=100_000) for b in range(10, 90)]  # 8 MB into 4 MB
    for art in flood:
        # Every put must succeed: unpinned entries are evictable, so Redis
        # makes room by evicting them (an OOM here means nothing was evictable).
        store.put(art.key, art.encode())
    assert all(store.get(a.key) == a.encode() for a in pinned), "pinned entries must be kept"
    assert store.get(flood[-1].key) == flood[-1].encode(), "the newest entry must be stored"
    # Redis' LRU is approximate (sampled), so count rather than name the evicted ones.
    assert sum(store.exists(a.key) for a in flood) < len(flood) // 2, "unpinned entries must have been evicted"


def test_pinned_entries_survive_eviction_pressure_on_disk(tmp_path):
    store = DiskStore(tmp_path, size_limit=1024 * 1024, touch_interval=0)
    pinned = make_artifact(spec(batch=1), size=200_000)
    store.put(pinned.key, pinned.encode(), pin=True)
    flood = [make_artifact(spec(batch=b), size=200_000) for b in range(10, 30)]
    for art in flood:
        assert store.put(art.key, art.encode()) is True
    assert store.get(pinned.key) == pinned.encode() and store.pinned(pinned.key), "pinned entries must be kept"
    assert store.get(flood[-1].key) == flood[-1].encode(), "the newest entry must be stored"
    assert not store.exists(flood[0].key), "the oldest unpinned entry must have been evicted"
    assert sum(store.exists(a.key) for a in flood) <= 5  # 1 MiB holds the pinned one and about 4 more


@pytest.mark.parametrize("kind", ["disk", "redis", "server"])
def test_purge_removes_exactly_one_targets_entries(kind, tmp_path, request):
    if kind == "redis":
        store = request.getfixturevalue("redis_store")
    else:
        store = DiskStore(tmp_path / "s")
    keep = [make_artifact(spec(batch=b), TARGET) for b in (1, 2)]
    retired = [make_artifact(spec(batch=b), OTHER_TARGET) for b in (1, 2, 3)]
    for art in keep + retired:
        store.put(art.key, art.encode())
    if hasattr(store, "pin"):
        store.pin(retired[0].key)  # pinned or not, a retired target goes
    if kind == "server":
        app = create_app(Settings(cache_dir=store.path, admin_tokens=("a",)), store=store)
        with ServerThread(app) as srv:
            assert sorted(ops.purge(HttpStore(srv.url, token="a"), OTHER_TARGET, dry_run=True)) == sorted(
                a.key for a in retired
            )
            assert len(list(store.keys())) == 5
            removed = ops.purge(HttpStore(srv.url, token="a"), OTHER_TARGET)
            r = httpx.post(f"{srv.url}/v1/purge", params={"target": str(OTHER_TARGET)})
            assert r.status_code in (401, 403)
    else:
        removed = ops.purge(store, OTHER_TARGET)
    assert sorted(removed) == sorted(a.key for a in retired)
    assert sorted(store.keys()) == sorted(a.key for a in keep)


def test_cli_purge(tmp_path):
    store = DiskStore(tmp_path / "s")
    for art in (make_artifact(spec(), TARGET), make_artifact(spec(), OTHER_TARGET)):
        store.put(art.key, art.encode())
    store.close()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphcache.cli",
            "--cache-dir",
            str(tmp_path / "s"),
            "purge",
            "--target",
            str(OTHER_TARGET),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "removed 1 entry" in out.stdout
    assert list(DiskStore(tmp_path / "s").keys()) == [make_artifact(spec(), TARGET).key]


def test_redis_stopped_gives_503_health_and_the_client_falls_back(private_redis, tmp_path):
    server = private_redis()
    store = RedisStore(server.url, timeout=1)
    art = make_artifact(spec())
    store.put(art.key, art.encode())
    with ServerThread(create_app(Settings(), store=store)) as srv:
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
        server.stop()
        health = httpx.get(f"{srv.url}/healthz", timeout=10)
        assert health.status_code == 503 and health.json()["error"] == "store_unavailable"
        got = httpx.get(f"{srv.url}/v1/artifacts/{art.key}", timeout=10)
        assert got.status_code == 503 and got.json()["error"] == "store_unavailable"
        # A worker: local tier plus the replica; the replica's store is down.
        compiler = FakeCompiler()
        cache = GraphCache(TieredStore(DiskStore(tmp_path / "local"), HttpStore(srv.url, timeout=2)), compiler)
        t0 = time.monotonic()
        assert cache.get(spec()).key == art.key
        assert compiler.builds == 1 and time.monotonic() - t0 < 10


def test_replica_uses_graphcache_store_from_the_environment(redis_store, redis_url, monkeypatch):
    monkeypatch.setenv("GRAPHCACHE_STORE", redis_url)
    from service.app import create_app_from_env

    app = create_app_from_env()
    assert isinstance(app.state.gc.store, RedisStore)
    # and it serves from that Redis: an entry put there is downloadable
    art = make_artifact(spec())
    redis_store.put(art.key, art.encode())
    with ServerThread(app) as srv:
        got = httpx.get(f"{srv.url}/v1/artifacts/{art.key}")
        assert got.status_code == 200 and got.content == art.encode()
        assert httpx.get(f"{srv.url}/healthz").json()["store"] == repr(RedisStore(redis_url))
