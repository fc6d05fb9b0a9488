"""Trust, round three (issue 33): a client without a token cannot take the
upload budget, a reader who never reads is cut at the send deadline, and
uploads stream to a temporary file instead of memory. Every server is
`graphcache serve` as a user starts it, one worker, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from graphcache.stores import DiskStore
from tests.fakes import make_artifact, spec
from tests.servers import serve_one_worker

WRITE = "w-token"
AUTH = {"authorization": f"Bearer {WRITE}"}
MiB = 1024**2


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def answer_of(sock: socket.socket, timeout: float = 10) -> bytes:
    """What the server sends until it closes the connection (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


# -- item 1: bodies of read routes cannot take the upload budget --------------------------------------


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_260_held_unauthenticated_bodies_leave_an_authenticated_put_at_201(tmp_path, framing):
    """260 manifests declared to POST / (open: no read tokens), none sent:
    they once reserved 260 MiB of the 256 MiB upload budget, and every PUT
    was a 503 for as long as they held."""
    env = {"GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_DIR": str(tmp_path)}
    length = f"content-length: {MiB}" if framing == "length" else "transfer-encoding: chunked"
    head = f"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n{length}\r\n\r\n".encode()
    stored = make_artifact(spec(batch=4), size=10_000)
    with serve_one_worker(env) as (url, _):
        assert httpx.put(f"{url}/v1/artifacts/{stored.key}", content=stored.encode(), headers=AUTH).status_code == 201
        held = []
        try:
            for _ in range(260):
                sock = socket.create_connection(("127.0.0.1", port_of(url)), timeout=10)
                sock.sendall(head)
                held.append(sock)
            time.sleep(1.0)  # every head read and its body awaited
            art = make_artifact(spec(batch=3), size=100_000)
            put = httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers=AUTH, timeout=10)
            assert put.status_code == 201, put.text
            # Reads with and without a body go on too.
            assert httpx.get(f"{url}/v1/artifacts/{art.key}", timeout=10).content == art.encode()
            batch = httpx.post(f"{url}/v1/batch", json={"keys": [art.key, stored.key]}, timeout=10)
            assert batch.status_code == 200, batch.text
            # The held bodies are still held: none was answered yet.
            for sock in held[:5]:
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
        finally:
            for sock in held:
                sock.close()


def test_read_bodies_past_the_body_budget_get_503_and_uploads_go_on(tmp_path):
    """GRAPHCACHE_BODY_BUDGET bounds the bytes of read-route bodies one
    worker holds, charged as they arrive; past it 503 body_budget, closed."""
    env = {
        "GRAPHCACHE_WRITE_TOKENS": WRITE,
        "GRAPHCACHE_DIR": str(tmp_path),
        "GRAPHCACHE_BODY_BUDGET": str(2 * MiB),
    }
    head = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 1048576\r\n\r\n"
    with serve_one_worker(env) as (url, _):
        held = [socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) for _ in range(2)]
        try:
            for sock in held:  # two manifests of 1 MiB, all but their last byte sent: the budget is used
                sock.sendall(head + b" " * (MiB - 1))
            time.sleep(1.0)
            with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
                sock.sendall(head + b" " * 1000)
                answer = answer_of(sock)
            assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
            assert b"retry-after: 1" in answer.lower() and b"connection: close" in answer.lower()
            got = json.loads(answer.partition(b"\r\n\r\n")[2])
            assert got["error"] == "body_budget" and "GRAPHCACHE_BODY_BUDGET" in got["detail"], got
            art = make_artifact(spec(batch=5), size=100_000)
            put = httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers=AUTH, timeout=10)
            assert put.status_code == 201, put.text
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.5)  # the held bodies' bytes are given back
        assert httpx.post(f"{url}/v1/batch", json={"keys": ["a" * 64]}, timeout=10).status_code == 200


def test_where_writes_are_open_a_declared_upload_holds_only_what_it_sent(tmp_path):
    """No write tokens: anyone may upload, so no upload is promised room up
    front; one that declares its size and sends nothing holds nothing."""
    env = {
        "GRAPHCACHE_DIR": str(tmp_path),
        "GRAPHCACHE_MAX_UPLOAD": str(MiB),
        "GRAPHCACHE_UPLOAD_BUDGET": str(2 * MiB),
    }
    head = f"PUT /v1/artifacts/{'a' * 64} HTTP/1.1\r\nhost: t\r\ncontent-length: {MiB}\r\n\r\n".encode()
    with serve_one_worker(env) as (url, _):
        held = [socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) for _ in range(4)]
        try:
            for sock in held:
                sock.sendall(head)
            time.sleep(1.0)
            art = make_artifact(spec(batch=6), size=100_000)
            put = httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), timeout=10)
            assert put.status_code == 201, put.text
        finally:
            for sock in held:
                sock.close()


def test_the_body_budget_is_checked_at_start():
    from graphcache.settings import Settings, SettingsError

    assert Settings.from_env({}).body_budget == 16 * MiB
    assert Settings.from_env({"GRAPHCACHE_BODY_BUDGET": "4194304"}).body_budget == 4 * MiB
    for value in ("0", "-1", "lots"):
        with pytest.raises(SettingsError, match="GRAPHCACHE_BODY_BUDGET"):
            Settings.from_env({"GRAPHCACHE_BODY_BUDGET": value})


def test_a_body_budget_below_the_largest_read_body_fails_the_server_at_start(tmp_path):
    from graphcache.settings import Settings, SettingsError
    from service.app import create_app

    settings = Settings.from_env({"GRAPHCACHE_BODY_BUDGET": str(MiB - 1), "GRAPHCACHE_DIR": str(tmp_path)})
    with pytest.raises(SettingsError, match="GRAPHCACHE_BODY_BUDGET=1048575 is below"):
        create_app(settings, store=DiskStore(Path(tmp_path)))
