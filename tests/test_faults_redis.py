"""A hung Redis (issue 20): `graphcache serve --store redis://...` as a user
starts it, over a private redis-server that the test pauses with SIGSTOP.
Everything talks to 127.0.0.1; each test is bounded by GRAPHCACHE_TIMEOUT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from graphcache import GraphCache
from graphcache.errors import StoreUnavailable
from graphcache.stores import DiskStore, HttpStore, TieredStore
from tests.clirun import cli
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import free_port, wait_for_server

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 2.0  # GRAPHCACHE_TIMEOUT of the server under test
WRITE = "w-token"


@pytest.fixture
def hung(private_redis) -> Iterator[tuple[str, list[str], int]]:
    """The served URL, keys stored before Redis hung, and redis-server's pid
    (stopped; continued and stopped after the test)."""
    redis_srv = private_redis()
    port = free_port()
    env = {**os.environ, "GRAPHCACHE_TIMEOUT": str(TIMEOUT), "GRAPHCACHE_WRITE_TOKENS": WRITE}
    cmd = [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--workers", "2"]
    cmd += ["--store", redis_srv.url, "--log-level", "critical"]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(url, proc, healthy=True)
        keys = []
        for batch in range(1, 4):
            art = make_artifact(spec(batch=batch), size=20_000)
            put = httpx.put(
                f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers={"authorization": f"Bearer {WRITE}"}
            )
            assert put.status_code == 201, put.text
            keys.append(art.key)
        os.kill(redis_srv.proc.pid, signal.SIGSTOP)
        try:
            yield url, keys, redis_srv.proc.pid
        finally:
            os.kill(redis_srv.proc.pid, signal.SIGCONT)
    finally:
        proc.terminate()
        proc.wait(15)


def timed(fn, *args, **kwargs) -> tuple[float, httpx.Response]:  # noqa: ANN001, ANN002, ANN003
    start = time.monotonic()
    response = fn(*args, **kwargs)
    return time.monotonic() - start, response


def test_concurrent_reads_of_a_hung_redis_time_out_together_and_the_rest_answers_at_once(hung):
    url, keys, _ = hung
    results: list[tuple[float, httpx.Response]] = []

    def get(key: str) -> None:
        results.append(timed(httpx.get, f"{url}/v1/artifacts/{key}", timeout=30))

    # Six concurrent GETs over two workers: each answered 503 within the
    # timeout, not one after another (they were 2, 4, 6 s with the calls on
    # the event loop).
    threads = [threading.Thread(target=get, args=(keys[i % 3],)) for i in range(6)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(0.3)  # the GETs are waiting on Redis now
    # Routes that need no store answer at once, whatever the store does.
    for path in ("/openapi.json", "/metrics", "/docs"):
        took, answer = timed(httpx.get, f"{url}{path}", timeout=30)
        assert answer.status_code == 200 and took < 1.0, (path, took)
    for t in threads:
        t.join(30)
    total = time.monotonic() - start
    assert len(results) == 6
    for took, answer in results:
        assert answer.status_code == 503 and answer.json()["error"] == "store_unavailable", answer.text
        assert "GRAPHCACHE_TIMEOUT" in answer.json()["detail"]
        assert took < TIMEOUT + 1.5, took
    assert total < TIMEOUT + 1.5, total
    took, health = timed(httpx.get, f"{url}/healthz", timeout=30)
    assert health.status_code == 503 and took < TIMEOUT + 1.5


def test_a_batch_from_a_hung_redis_is_503_and_prefetch_fails_in_one_line(hung, tmp_path):
    url, keys, _ = hung
    got = httpx.post(f"{url}/v1/batch", json={"keys": keys}, timeout=30)
    assert got.status_code == 503, got.text[:300]
    assert got.json()["error"] == "store_unavailable"
    # The route (a body the fast path hands on) answers the same.
    routed = httpx.post(
        f"{url}/v1/batch",
        content=f'{{"keys": {keys!r}}}'.replace("'", '"'),
        timeout=30,
        headers={"content-type": "application/json; charset=utf-8", "x-pad": "1"},
    )
    assert routed.status_code == 503

    # GraphCache.prefetch: an error, not a report of everything missing.
    local = DiskStore(tmp_path / "local")
    cache = GraphCache(TieredStore(local, HttpStore(url, timeout=10)))
    with pytest.raises(StoreUnavailable, match="503"):
        cache.prefetch([spec(batch=b) for b in range(1, 4)], TARGET)

    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "graphs:\n  - name: m\n    batch: [1, 2, 3]\n    heads_q: 8\n    seq_q: 128\n    head_dim: 64\n    mask: causal\n"
    )
    env = {"GRAPHCACHE_DIR": str(tmp_path / "worker"), "GRAPHCACHE_TIMEOUT": "10"}
    out = cli("prefetch", str(manifest), "--server", url, "--target", str(TARGET), env=env, timeout=60)
    assert out.returncode != 0, out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "503" in lines[0] and "did not answer" in lines[0], out.stderr
    assert "missing" not in out.stdout

    # warm --check against the 503: says why.
    out = cli("warm", str(manifest), "--check", "--target", str(TARGET), "--server", url, env=env, timeout=60)
    assert out.returncode != 0
    assert "did not answer" in out.stderr and "GRAPHCACHE_TIMEOUT" in out.stderr, out.stderr


# -- persistence ---------------------------------------------------------------------------


def shipped_redis_args(data_dir: Path) -> list[str]:
    """docker/compose.yaml's redis-server arguments, as shipped, with its
    data folder pointed at ``data_dir``."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    command = list(compose["services"]["redis"]["command"])
    assert command[0] == "redis-server"
    args = command[1:]
    if "--dir" in args:
        at = args.index("--dir")
        del args[at : at + 2]
    return [*args, "--dir", str(data_dir)]


def start_redis(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    import shutil

    import redis

    port = free_port()
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_timeout=1)
    deadline = time.monotonic() + 15
    while True:
        try:
            if client.ping():
                return proc, url
        except redis.exceptions.BusyLoadingError:
            pass
        except redis.ConnectionError:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}") from None
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)


def test_redis_restarted_with_the_shipped_settings_keeps_every_entry_pinned_ones_included(tmp_path):
    import shutil

    from graphcache.stores.redis import RedisStore

    if not (shutil.which("redis-server") or os.path.exists("/usr/bin/redis-server")):
        pytest.skip("needs redis-server (Debian package redis-server; scripts/test.sh installs it)")
    args = shipped_redis_args(tmp_path)
    proc, url = start_redis(args)
    try:
        store = RedisStore(url)
        arts = [make_artifact(spec(batch=b), size=30_000) for b in range(1, 9)]
        for i, art in enumerate(arts):
            store.put(art.key, art.encode(), pin=i % 2 == 0)
        store.close()
        time.sleep(1.5)  # appendfsync everysec: what a crash may lose is the last second
        proc.send_signal(signal.SIGKILL)  # a crash, not a clean shutdown
        proc.wait(10)
        proc, url = start_redis(args)
        store = RedisStore(url)
        for i, art in enumerate(arts):
            assert store.get(art.key) == art.encode(), i
            assert store.pinned(art.key) == (i % 2 == 0), i
        store.close()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_redis_out_of_memory_refuses_uploads_with_507_and_serves_reads(private_redis, tmp_path):
    """Redis at maxmemory with nothing it may evict (here noeviction) refuses writes (OOM)."""
    from graphcache.settings import Settings
    from graphcache.stores.redis import RedisStore
    from service.app import create_app
    from tests.servers import ServerThread

    redis_srv = private_redis("--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
    store = RedisStore(redis_srv.url)
    with ServerThread(create_app(Settings(), store=store)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        stored = {}
        for batch in range(1, 40):
            art = make_artifact(spec(batch=batch), size=256 * 1024)
            got = c.put(f"/v1/artifacts/{art.key}", content=art.encode())
            if got.status_code != 201:
                break
            stored[art.key] = art.encode()
        assert stored and got.status_code == 507, got.text
        assert got.json()["error"] == "store_full" and "out of memory" in got.json()["detail"]
        for key, data in stored.items():
            assert c.get(f"/v1/artifacts/{key}").content == data
        assert c.get("/v1/stats").json()["uploads_rejected"] == {"store_full": 1}
        # Healthy (reads are served) but not writable, and why, as on a full disk.
        health = c.get("/healthz")
        assert health.status_code == 200 and health.json()["writable"] is False, health.text
        assert "out of memory" in health.json()["reason"]
        # Room made (entries removed): health says so at once, before any
        # upload succeeds (issue 27, item 8), and the next upload fits.
        for key in list(stored)[:2]:
            assert c.delete(f"/v1/artifacts/{key}").status_code == 204
        assert c.get("/healthz").json()["writable"] is True
        assert c.put(f"/v1/artifacts/{art.key}", content=art.encode()).status_code == 201
        assert c.get("/healthz").json()["writable"] is True
