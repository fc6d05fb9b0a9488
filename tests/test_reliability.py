"""Faults: corrupt stores, crashes mid-write, load, signatures, limits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from graphcache import Artifact, GraphCache
from graphcache.settings import Settings
from graphcache.stores import DiskStore, HttpStore
from service.app import create_app
from tests.fakes import TARGET, FakeCompiler, make_artifact, spec
from tests.servers import ServerThread, wait_for_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def value_file(store: DiskStore, key: str) -> str:
    opened = store.open(key)
    assert opened is not None and opened[1] is not None
    opened[0].close()
    return opened[0].name


def quarantined(client: httpx.Client, reason: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f'graphcache_quarantined_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


CORRUPTIONS = {
    "flip": lambda data, other: data[:-100] + bytes([data[-100] ^ 0x10]) + data[-99:],
    "truncate": lambda data, other: data[: len(data) // 2],
    "replace": lambda data, other: other,  # a valid artifact, of another key
    "zero": lambda data, other: bytes(len(data)),
}
REASONS = {"flip": "digest_mismatch", "truncate": "truncated", "replace": "key_mismatch", "zero": "bad_magic"}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupted_files_are_never_served_and_are_quarantined(tmp_path, how):
    store = DiskStore(tmp_path / "s")
    art, other = make_artifact(spec(), size=400_000), make_artifact(spec(batch=2), size=400_000)
    store.put(art.key, art.encode())
    with (
        ServerThread(create_app(Settings(cache_dir=store.path), store=store)) as srv,
        httpx.Client(base_url=srv.url) as client,
    ):
        assert client.get(f"/v1/artifacts/{art.key}").status_code == 200  # verified once, remembered
        path = value_file(store, art.key)
        with open(path, "r+b") as fh:  # rewrite in place, as a bad disk or a stray process would
            bad = CORRUPTIONS[how](fh.read(), other.encode())
            fh.seek(0)
            fh.write(bad)
            fh.truncate()
        got = client.get(f"/v1/artifacts/{art.key}")
        assert got.status_code == 404 and got.json()["error"] == "not_found"
        assert quarantined(client, REASONS[how]) == 1
        assert client.get(f"/v1/artifacts/{art.key}").status_code == 404
        assert HttpStore(srv.url).get(art.key) is None


def test_small_entries_inside_the_index_are_verified_on_every_read(tmp_path):
    import sqlite3

    store = DiskStore(tmp_path / "s")
    art = make_artifact(spec(), size=1000)  # kept inline in diskcache's SQLite index
    store.put(art.key, art.encode())
    with (
        ServerThread(create_app(Settings(cache_dir=store.path), store=store)) as srv,
        httpx.Client(base_url=srv.url) as client,
    ):
        assert client.get(f"/v1/artifacts/{art.key}").status_code == 200
        data = bytearray(art.encode())
        data[-1] ^= 1
        with sqlite3.connect(tmp_path / "s" / "cache.db") as db:
            assert db.execute("UPDATE Cache SET value = ? WHERE key = ?", (bytes(data), art.key)).rowcount == 1
        assert client.get(f"/v1/artifacts/{art.key}").status_code == 404
        assert quarantined(client, "digest_mismatch") == 1


def test_corrupt_entry_in_redis_is_never_served(redis_store):
    art = make_artifact(spec(), size=50_000)
    redis_store.put(art.key, art.encode()[:-10])
    with ServerThread(create_app(Settings(), store=redis_store)) as srv, httpx.Client(base_url=srv.url) as client:
        assert client.get(f"/v1/artifacts/{art.key}").status_code == 404
        assert quarantined(client, "truncated") == 1
        assert not redis_store.exists(art.key)


def test_client_never_loads_a_corrupt_local_entry(tmp_path):
    store = DiskStore(tmp_path)
    compiler = FakeCompiler(size=100_000)
    cache = GraphCache(store, compiler)
    art = cache.get(spec())
    path = value_file(store, art.key)
    with open(path, "r+b") as fh:
        fh.seek(-1, 2)
        fh.write(b"\x00")
    loaded = GraphCache(store, compiler).get(spec())
    assert loaded.payload == art.payload and compiler.builds == 2  # rebuilt, never loaded the corrupt bytes


WRITER = r"""
import os, sys
from graphcache import Artifact, GraphSpec, Target
from graphcache.stores import DiskStore
store = DiskStore(sys.argv[1])
target = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
i = 0
print("writing", flush=True)
while True:
    i += 1
    art = Artifact(spec=GraphSpec(batch=i, heads_q=8, seq_q=64, head_dim=64), target=target,
                   payload=os.urandom(4 * 1024 * 1024))
    store.put(art.key, art.encode())
"""


def test_kill_9_during_large_puts_leaves_no_partial_entry(tmp_path):
    folder = tmp_path / "s"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(2.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    store = DiskStore(folder)  # opens cleanly
    keys = list(store.keys())
    assert keys, "some puts completed before the kill"
    for key in keys:
        Artifact.decode(store.get(key), expected_key=key)  # every readable entry is whole
    import sqlite3

    with sqlite3.connect(folder / "cache.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_load_test_script_finds_no_errors():
    out = subprocess.run(
        [sys.executable, "scripts/bench/load_test.py", "--readers", "16", "--writers", "4", "--duration", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "errors 0, lost 0, garbled 0" in out.stdout


# -- signatures -------------------------------------------------------------------------------


def test_server_with_a_signing_key_refuses_unsigned_and_wrongly_signed_uploads(tmp_path):
    store = DiskStore(tmp_path)
    with ServerThread(create_app(Settings(cache_dir=store.path, signing_key=b"k1"), store=store)) as srv:
        art = make_artifact(spec())
        url = f"{srv.url}/v1/artifacts/{art.key}"
        unsigned = httpx.put(url, content=art.encode())
        assert unsigned.status_code == 400 and unsigned.json()["error"] == "unsigned"
        wrong = httpx.put(url, content=art.signed(b"other").encode())
        assert wrong.status_code == 400 and wrong.json()["error"] == "bad_signature"
        assert httpx.put(url, content=art.signed(b"k1").encode()).status_code == 201
        assert list(store.keys()) == [art.key]


def test_builders_sign_and_require_signed_clients_refuse_unsigned(tmp_path, monkeypatch):
    store = DiskStore(tmp_path)
    unsigned = make_artifact(spec(batch=1))
    store.put(unsigned.key, unsigned.encode())
    store.close()
    monkeypatch.setenv("GRAPHCACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GRAPHCACHE_SIGNING_KEY", "k1")
    monkeypatch.setenv("GRAPHCACHE_REQUIRE_SIGNED", "1")
    compiler = FakeCompiler()
    cache = GraphCache.from_env(compiler)
    art = cache.get(spec(batch=1))  # the unsigned entry is refused (counted corrupt) and rebuilt, signed
    assert art.signature and cache.stats()["corrupt"] == 1 and compiler.builds == 1
    art.verify_signature(b"k1")
    reader = GraphCache.from_env()  # a worker with no compiler
    assert reader.get(spec(batch=1), TARGET).signature == art.signature
    monkeypatch.setenv("GRAPHCACHE_SIGNING_KEY", "k2")
    stranger = GraphCache.from_env()
    from graphcache import NotFound

    with pytest.raises(NotFound):
        stranger.get(spec(batch=1), TARGET)  # signed with another key: refused, never loaded
    assert stranger.stats()["corrupt"] == 1


def test_require_signed_without_a_key_is_a_clear_error(monkeypatch):
    from graphcache.settings import SettingsError

    monkeypatch.setenv("GRAPHCACHE_REQUIRE_SIGNED", "1")
    monkeypatch.delenv("GRAPHCACHE_SIGNING_KEY", raising=False)
    with pytest.raises(SettingsError, match="GRAPHCACHE_SIGNING_KEY"):
        Settings.from_env()


# -- limits -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["..", "..%2F..%2Fetc%2Fpasswd", "a" * 65, "a" * 10_000, "%2e%2e", "A" * 64, "a" * 63 + "%00"]
)
def test_path_tricks_in_keys_are_400(tmp_path, path):
    store = DiskStore(tmp_path)
    with ServerThread(create_app(Settings(cache_dir=store.path), store=store)) as srv:
        for method in ("GET", "HEAD", "PUT", "DELETE"):
            # A raw request: HTTP clients would normalise the dot segments away.
            assert raw_status(srv.port, method, f"/v1/artifacts/{path}") == 400, (method, path)


def raw_status(port: int, method: str, path: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        body = b"x" if method == "PUT" else b""
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        head = sock.recv(65536).split(b"\r\n", 1)[0]
    return int(head.split()[1])


def test_slow_upload_gets_408_and_nothing_is_stored(tmp_path):
    store = DiskStore(tmp_path)
    art = make_artifact(spec(), size=100_000)
    with ServerThread(create_app(Settings(cache_dir=store.path, upload_timeout=1.0), store=store)) as srv:

        def trickle():
            data = art.encode()
            for i in range(0, len(data), 20_000):
                time.sleep(0.5)
                yield data[i : i + 20_000]

        r = httpx.put(f"{srv.url}/v1/artifacts/{art.key}", content=trickle(), timeout=30)
        assert r.status_code == 408 and r.json()["error"] == "timeout"
    assert list(store.keys()) == []


def test_oversized_request_head_is_refused_and_the_server_survives(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRAPHCACHE_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--log-level", "critical"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(url)
        r = httpx.get(f"{url}/healthz", headers={"x-big": "a" * 200_000}, timeout=5)
        assert r.status_code == 431 and r.json()["error"] == "headers_too_large"
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)


def test_redis_entry_corrupted_after_being_served_is_not_served_again(redis_store):
    art = make_artifact(spec(), size=200_000)
    redis_store.put(art.key, art.encode())
    with ServerThread(create_app(Settings(), store=redis_store)) as srv, httpx.Client(base_url=srv.url) as client:
        for _ in range(2):  # verified, then served from the hot copy after an equal fetch
            assert client.get(f"/v1/artifacts/{art.key}").content == art.encode()
        data = bytearray(art.encode())
        data[-7] ^= 0x40
        redis_store.put(art.key, bytes(data))
        assert client.get(f"/v1/artifacts/{art.key}").status_code == 404
        assert quarantined(client, "digest_mismatch") == 1
