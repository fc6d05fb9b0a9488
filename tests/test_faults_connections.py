"""Connections (issue 20): sockets that send nothing, half a request head or
garbage, idle keep-alive, the concurrency limit, and bodies that are not
JSON, against `graphcache serve` as a user starts it, on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes import TARGET, spec
from tests.servers import ServerThread, serve_one_worker

HEAD_TIMEOUT = 1.0
LIMIT = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[int, str]]:
    folder = tmp_path_factory.mktemp("conn") / "cache"
    env = {"GRAPHCACHE_HEADER_TIMEOUT": str(HEAD_TIMEOUT)}
    args = ["--cache-dir", str(folder), "--timeout-keep-alive", "1", "--limit-concurrency", str(LIMIT)]
    with serve_one_worker(env, *args) as (url, _):
        yield int(url.rsplit(":", 1)[1]), url


def read_all(sock: socket.socket, within: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it closed."""
    start = time.monotonic()
    sock.settimeout(within)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {within}s") from None
    return data, time.monotonic() - start


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        data, took = read_all(sock, HEAD_TIMEOUT + 4)
    assert data == b"" and took >= HEAD_TIMEOUT * 0.9


def test_half_a_request_head_gets_408_json_and_is_closed(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        data, _ = read_all(sock, HEAD_TIMEOUT + 4)
    status, headers, body = split(data)
    assert status == 408 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == "timeout" and "GRAPHCACHE_HEADER_TIMEOUT" in json.loads(body)["detail"]


def test_an_idle_keep_alive_connection_is_closed(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        data, took = read_all(sock, 5)
    assert data.startswith(b"HTTP/1.1 200") and took < 4  # --timeout-keep-alive 1


def test_a_malformed_request_gets_uvicorns_400_as_json(server):
    port, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost t\r\n\r\n")  # no colon
        data, _ = read_all(sock, 5)
    status, headers, body = split(data)
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == "bad_request"


def test_a_websocket_upgrade_request_gets_the_apis_json_not_a_plain_text_403(server):
    """The API has no WebSocket route; uvicorn's WebSocket library answered an
    Upgrade request with an empty text/plain 403 of its own."""
    port, _ = server
    upgrade = b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    upgrade += b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    for path, status in (("/healthz", 200), ("/nope", 404)):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n".encode() + upgrade + b"\r\n")
            data, _ = read_all(sock, 5)
        got, headers, body = split(data)
        assert got == status and headers["content-type"] == "application/json", data[:300]
        assert status == 200 or json.loads(body)["error"] == "not_found"


def test_idle_sockets_hold_the_concurrency_limit_only_until_the_header_timeout(server):
    port, url = server
    # Open connections are bounded at 5 x --limit-concurrency (service.transport:
    # requests whose body is arriving do not count against the limit itself).
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(5 * LIMIT)]
    try:
        time.sleep(0.2)
        over = httpx.get(f"{url}/healthz", timeout=10)
        assert over.status_code == 503 and over.headers["content-type"] == "application/json"
        assert over.json()["error"] == "overloaded" and "--limit-concurrency" in over.json()["detail"]
        assert over.headers["retry-after"] == "1"  # documented: a client knows when to come back
        time.sleep(HEAD_TIMEOUT + 0.5)  # the idle ones are closed by now
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None, "application/json"])
def test_a_body_that_is_not_json_is_400_bad_json_whatever_its_content_type(server, ctype):
    _, url = server
    headers = {} if ctype is None else {"content-type": ctype}
    for path in ("/v1/resolve", "/v1/batch"):
        got = httpx.post(f"{url}{path}", content=b"spec=1&target=2", headers=headers, timeout=10)
        assert got.status_code == 400, (path, ctype, got.text)
        assert got.json()["error"] == "bad_json", (path, ctype, got.text)
    # JSON under another Content-Type is not bad JSON: served under JSON's
    # own, else a 422 that says which header to send (not "must be a JSON object").
    good = json.dumps({"spec": spec().to_dict(), "target": str(TARGET)}).encode()
    got = httpx.post(f"{url}/v1/resolve", content=good, headers=headers, timeout=10)
    if ctype == "application/json":
        assert got.status_code == 200, got.text
    else:
        assert got.status_code == 422 and got.json()["error"] == "invalid_request", got.text
        assert "is JSON" in got.json()["detail"] and "Content-Type: application/json" in got.json()["detail"]


def test_an_app_that_fails_before_answering_gets_a_json_500():
    async def broken(scope, receive, send):  # noqa: ANN001, ANN202
        if scope["type"] == "lifespan":
            message = await receive()
            while message["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
                message = await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        raise RuntimeError("boom")

    with ServerThread(broken) as srv:
        got = httpx.get(f"{srv.url}/x", timeout=10)
    assert got.status_code == 500 and got.headers["content-type"] == "application/json"
    assert got.json()["error"] == "internal"


@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_a_bad_header_timeout_is_refused_naming_the_variable(value):
    from graphcache.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="GRAPHCACHE_HEADER_TIMEOUT"):
        Settings.from_env({"GRAPHCACHE_HEADER_TIMEOUT": value})
    assert Settings.from_env({"GRAPHCACHE_HEADER_TIMEOUT": "2.5"}).header_timeout == 2.5
    assert Settings.from_env({}).header_timeout == 10
