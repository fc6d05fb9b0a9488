"""Hardening, round two (issue 27): request bodies bounded and authenticated
from the head, slow senders cut and closed, malformed JSON a 400, signatures
checked on what is served, and a client that cannot verify an entry leaves
the server's copy alone. Servers are `graphcache serve` as a user starts it
(or the same uvicorn configuration in a thread), on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from graphcache import GraphCache
from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import ServerThread, raw_gets, serve_one_worker, slow_sender

ROOT = Path(__file__).resolve().parents[1]
WRITE, READ = "w-token", "r-token"
GiB = 1024**3


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def answer_of(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (or 10 s pass)."""
    sock.settimeout(10)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# -- item 1: bodies bounded, tokens checked from the head ------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server with write and read tokens over a DiskStore holding one entry."""
    folder = tmp_path_factory.mktemp("guarded")
    art = make_artifact(spec(), size=10_000)
    store = DiskStore(folder)
    store.put(art.key, art.encode())
    store.close()
    env = {"GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_READ_TOKENS": READ, "GRAPHCACHE_DIR": str(folder)}
    with serve_one_worker(env) as (url, proc):
        yield url, proc, art


@pytest.mark.parametrize("path", ["/v1/build", "/v1/resolve", "/v1/batch", "/v1/artifacts/" + "a" * 64])
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_2_gib_body_without_a_token_gets_401_at_once_and_no_memory(guarded, path, framing):
    url, proc, _ = guarded
    method = "PUT" if path.startswith("/v1/artifacts/") else "POST"
    before = rss(proc.pid)
    length = f"content-length: {2 * GiB}" if framing == "length" else "transfer-encoding: chunked"
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n{length}\r\n\r\n".encode()
        )
        piece = b"[" * 65536
        sent = 0
        with contextlib.suppress(OSError):  # the server closes once it has answered
            for _ in range(16):  # 1 MiB of the 2 GiB
                sock.sendall(piece if framing == "length" else b"10000\r\n" + piece + b"\r\n")
                sent += len(piece)
        answer = answer_of(sock)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
    assert b"connection: close" in answer.lower()
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "unauthorized"
    assert rss(proc.pid) - before < 32 * 1024**2


def test_every_body_route_has_its_own_limit_413_before_reading(guarded):
    url, _, art = guarded
    cases = [
        ("POST", "/v1/resolve", READ, 64 * 1024, "a spec and a target"),
        ("POST", "/v1/build", WRITE, 64 * 1024, "a spec"),
        ("POST", "/v1/batch", READ, 4096 + 128 * 1024, "GRAPHCACHE_MAX_BATCH"),
        ("PUT", f"/v1/artifacts/{art.key}", WRITE, 64 * 1024**2, "GRAPHCACHE_MAX_UPLOAD"),
        ("POST", "/v1/purge?target=x", WRITE, 4096, "takes no body"),
        ("POST", "/", READ, 1024**2, "for a manifest"),
    ]
    for method, path, token, limit, named in cases:
        with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
            head = f"{method} {path} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {token}\r\n"
            sock.sendall(f"{head}content-type: application/json\r\ncontent-length: {limit + 1}\r\n\r\n".encode())
            answer = answer_of(sock)  # nothing of the body sent: the answer comes from the head
        assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:300])
        assert named.encode() in answer, (path, answer[:300])
    # Counted as the routes count their own answers.
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert 'graphcache_requests_total{method="POST",route="/v1/resolve",status="413"}' in metrics


# -- item 6: malformed JSON is a 400 naming what is wrong --------------------------------------------


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        (b'{"keys": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deep"),
        (b"[" * 100 + b"]" * 100, "nested too deep"),
        (b'{"keys": ["\xff\xfe"]}', "not UTF-8"),
        (b'{"keys": [' + b"9" * 5000 + b"]}", "digits"),
        (b'{"keys": [1,', "Expecting value"),
    ],
    ids=["depth-5000", "depth-100", "encoding", "huge-number", "truncated"],
)
@pytest.mark.parametrize("path", ["/v1/batch", "/v1/resolve", "/v1/build"])
def test_malformed_json_of_any_shape_is_400_naming_it_on_every_route(guarded, path, raw, named):
    url, _, _ = guarded
    token = WRITE if path == "/v1/build" else READ
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    got = httpx.post(url + path, content=raw, headers=headers, timeout=10)
    assert got.status_code == 400 and got.json()["error"] == "bad_json", got.text[:300]
    assert named in got.json()["detail"], got.text[:300]
    assert httpx.get(url + "/healthz", timeout=10).status_code == 200


# -- item 7: the upload budget --------------------------------------------------------------------


def test_uploads_past_the_budget_get_503_with_retry_after_before_the_body(tmp_path):
    env = {
        "GRAPHCACHE_WRITE_TOKENS": WRITE,
        "GRAPHCACHE_DIR": str(tmp_path),
        "GRAPHCACHE_MAX_UPLOAD": str(1024**2),
        "GRAPHCACHE_UPLOAD_BUDGET": str(2 * 1024**2),
    }
    art = make_artifact(spec(batch=3), size=100_000)
    head = (
        f"PUT /v1/artifacts/{art.key} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {WRITE}\r\n"
        f"content-length: {1024**2}\r\n\r\n"
    ).encode()
    with serve_one_worker(env) as (url, _):
        held = [socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) for _ in range(2)]
        try:
            for sock in held:
                sock.sendall(head)  # two uploads of 1 MiB in flight: the budget is taken
            time.sleep(0.5)
            with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
                sock.sendall(head)
                answer = answer_of(sock)
            assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
            assert b"retry-after: 1" in answer.lower() and b"GRAPHCACHE_UPLOAD_BUDGET" in answer
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.5)  # the held uploads' budget is given back
        put = httpx.put(
            f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers={"authorization": f"Bearer {WRITE}"}
        )
        assert put.status_code == 201, put.text


# -- item 2: slow senders are cut and closed, and cannot hold the concurrency limit -----------------


def test_1000_slow_senders_leave_gets_at_0_errors_and_are_cut_408_and_closed(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2600:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2600:
        pytest.skip("ulimit -n is below the 2,600 descriptors 1,000 connections need on both ends")
    art = make_artifact(spec(batch=2), size=10_000)
    store = DiskStore(tmp_path)
    store.put(art.key, art.encode())
    store.close()
    env = {"GRAPHCACHE_DIR": str(tmp_path), "GRAPHCACHE_UPLOAD_TIMEOUT": "10"}
    with serve_one_worker(env, "--limit-concurrency", "256") as (url, _):
        port = port_of(url)
        errors: list[str] = []
        gets = 0

        def reads(done: threading.Event) -> None:
            nonlocal gets
            with httpx.Client(base_url=url, timeout=10) as client:
                while not done.is_set():
                    for path in ("/healthz", f"/v1/artifacts/{art.key}"):
                        try:
                            got = client.get(path)
                            if got.status_code != 200:
                                errors.append(f"{path}: {got.status_code} {got.text[:100]}")
                        except httpx.TransportError as exc:
                            errors.append(f"{path}: {exc!r}")
                        gets += 1

        async def main() -> list[str]:
            stop = asyncio.Event()
            senders = [asyncio.ensure_future(slow_sender(port, stop)) for _ in range(1000)]
            await asyncio.sleep(3)  # all connected, sending their bodies a byte a second
            done = threading.Event()
            reader = threading.Thread(target=reads, args=(done,))
            reader.start()
            await asyncio.sleep(4)
            done.set()
            await asyncio.to_thread(reader.join)
            await asyncio.sleep(8)  # past GRAPHCACHE_UPLOAD_TIMEOUT
            stop.set()
            return await asyncio.gather(*senders)

        answers = asyncio.run(main())
    assert gets > 20 and not errors, (gets, errors[:5])
    # Every slow sender was answered and closed by the server: 408 at its deadline.
    assert Counter(answers) == {"408": 1000}, Counter(answers)


def test_a_request_refused_over_the_concurrency_limit_is_closed(tmp_path):
    with serve_one_worker({"GRAPHCACHE_DIR": str(tmp_path)}, "--limit-concurrency", "2") as (url, _):
        # Open connections are bounded at 5 x --limit-concurrency (service.transport).
        idle = [socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) for _ in range(10)]
        try:
            with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
                sock.sendall(b"POST /v1/resolve HTTP/1.1\r\nhost: t\r\ncontent-length: 100000\r\n\r\n")
                answer = answer_of(sock)  # ends: the server closed the connection
            assert answer.startswith(b"HTTP/1.1 503") and b"connection: close" in answer.lower(), answer[:300]
        finally:
            for sock in idle:
                sock.close()


# -- item 5: a signing key protects clients and what the server serves ------------------------------


def test_a_signing_key_makes_signatures_required_by_default_and_0_warns(caplog):
    assert Settings.from_env({"GRAPHCACHE_SIGNING_KEY": "k1"}).require_signed is True
    with caplog.at_level(logging.WARNING, logger="graphcache.settings"):
        off = Settings.from_env({"GRAPHCACHE_SIGNING_KEY": "k1", "GRAPHCACHE_REQUIRE_SIGNED": "0"})
    assert off.require_signed is False and "GRAPHCACHE_REQUIRE_SIGNED=0" in caplog.text
    rotating = Settings.from_env({"GRAPHCACHE_SIGNING_KEY": "new, old"})
    assert rotating.signing_key == b"new" and rotating.verify_keys == (b"new", b"old")


def test_the_upload_budget_defaults_to_4_largest_uploads_and_may_not_be_below_one():
    from graphcache.settings import SettingsError

    assert Settings.from_env({"GRAPHCACHE_MAX_UPLOAD": "1000"}).upload_budget == 4000
    with pytest.raises(SettingsError, match="GRAPHCACHE_UPLOAD_BUDGET=999 is below GRAPHCACHE_MAX_UPLOAD=1000"):
        Settings.from_env({"GRAPHCACHE_MAX_UPLOAD": "1000", "GRAPHCACHE_UPLOAD_BUDGET": "999"})


def test_the_server_does_not_serve_unsigned_or_wrongly_signed_entries_planted_in_its_store(tmp_path):
    store = DiskStore(tmp_path)
    planted = {
        "unsigned": make_artifact(spec(batch=1)),
        "bad_signature": make_artifact(spec(batch=2)).signed(b"stranger"),
    }
    good = make_artifact(spec(batch=3)).signed(b"old")
    for art in [*planted.values(), good]:
        store.put(art.key, art.encode())
    settings = Settings.from_env({"GRAPHCACHE_SIGNING_KEY": "new,old", "GRAPHCACHE_DIR": str(tmp_path)})
    with ServerThread(create_app(settings, store=store)) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        for reason, art in planted.items():
            got = c.get(f"/v1/artifacts/{art.key}")
            assert got.status_code == 404 and reason in got.json()["detail"], got.text
            assert art.key in store.keys()  # left in the store: a signed upload replaces it
        assert c.get(f"/v1/artifacts/{good.key}").content == good.encode()  # the old key still verifies
        assert "graphcache_refused_total" in c.get("/metrics").text


# -- item 4: a client that cannot verify an entry leaves the server's copy --------------------------


def test_a_client_with_the_wrong_key_and_a_write_token_leaves_the_entry_on_the_server(tmp_path, monkeypatch):
    store = DiskStore(tmp_path / "server")
    settings = Settings(cache_dir=store.path, signing_key=b"k1", require_signed=True, write_tokens=(WRITE,))
    art = make_artifact(spec(batch=1)).signed(b"k1")
    store.put(art.key, art.encode())
    with ServerThread(create_app(settings, store=store)) as srv:
        for name, value in {
            "GRAPHCACHE_SERVER": srv.url,
            "GRAPHCACHE_TOKEN": WRITE,
            "GRAPHCACHE_SIGNING_KEY": "k2",  # a rotation reached this worker first
            "GRAPHCACHE_DIR": str(tmp_path / "worker"),
        }.items():
            monkeypatch.setenv(name, value)
        worker = GraphCache.from_env()
        assert worker.lookup(spec(batch=1), TARGET) is None  # refused here, never loaded
        assert worker.stats()["corrupt"] == 1
        assert httpx.head(f"{srv.url}/v1/artifacts/{art.key}").status_code == 200  # still on the server
        assert httpx.get(f"{srv.url}/v1/artifacts/{art.key}").content == art.encode()


# -- item 3: a healthy Redis is never reported down under load ----------------------------------------


def test_200_concurrent_readers_over_redis_on_one_worker_get_0_errors(private_redis):
    redis_srv = private_redis()
    arts = [make_artifact(spec(batch=b), size=64 * 1024) for b in range(1, 9)]
    # GRAPHCACHE_TIMEOUT raised: on a loaded 2-core machine a read may take
    # over 5 s; what is tested is that no read fails for want of a connection.
    env = {"GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_TIMEOUT": "30"}
    with serve_one_worker(env, "--store", redis_srv.url) as (url, _):
        for art in arts:
            put = httpx.put(
                f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers={"authorization": f"Bearer {WRITE}"}
            )
            assert put.status_code == 201, put.text

        async def main() -> list[list[tuple[int, bytes, float]]]:
            return await asyncio.gather(
                *(
                    raw_gets(port_of(url), [f"/v1/artifacts/{arts[(n + i) % len(arts)].key}" for i in range(10)])
                    for n in range(200)
                )
            )

        answers = [answer for reader in asyncio.run(main()) for answer in reader]
    statuses = Counter(status for status, _, _ in answers)
    errors = [data[:200] for status, data, _ in answers if status != 200]
    assert statuses == {200: 2000}, (statuses, errors[:3])
    stored = {art.encode() for art in arts}
    assert all(data in stored for _, data, _ in answers)


def test_the_redis_pool_is_sized_from_the_servers_concurrency(redis_url):
    from graphcache.stores.redis import RedisStore

    store = RedisStore(redis_url)
    art = make_artifact(spec(batch=5))
    store.put(art.key, art.encode())
    with ServerThread(create_app(Settings(), store=store), limit_concurrency=48) as srv:
        assert httpx.get(f"{srv.url}/v1/artifacts/{art.key}").content == art.encode()
        (client,) = store._async.values()  # noqa: SLF001 - the asyncio pool of the server's event loop
        assert client.connection_pool.max_connections == 48
    store.close()
