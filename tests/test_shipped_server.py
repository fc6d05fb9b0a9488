"""The server as `graphcache serve` ships it (uvloop, httptools), started as a
user starts it, on 127.0.0.1: path tricks, header limits, error bodies and
/docs with no internet. The suite's own servers (tests/servers.py) are built by
the same factory (service.server), checked last."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from service.server import uvicorn_options
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import ServerThread, wait_for_server

ROOT = Path(__file__).parent.parent
WRITE, ADMIN = "w-token", "a-token"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """`python -m graphcache serve` on a free port, over a DiskStore holding one artifact."""
    folder = tmp_path_factory.mktemp("shipped") / "cache"
    art = make_artifact(spec(), size=100_000)
    store = DiskStore(folder)
    store.put(art.key, art.encode())
    store.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_ADMIN_TOKENS": ADMIN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--cache-dir", str(folder)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(url, proc)
        yield port, url, art
    finally:
        proc.terminate()
        proc.wait(15)


def raw(port: int, method: str, path: str, headers: str = "") -> tuple[int, bytes]:
    """Status and body of a request sent as bytes: HTTP clients would
    normalise dot segments and refuse odd paths before sending them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        body = b"x" if method == "PUT" else b""
        sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: t\r\n{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b"\r\n", 1)[0].split()[1]), rest


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "../../etc/passwd",
        "..%2F..%2Fetc%2Fpasswd",
        "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "%252e%252e%252fetc",
        "a" * 65,
        "a" * 10_000,
        "A" * 64,
        "a" * 63 + "%00",
        "a" * 64 + "/../" + "b" * 64,
        "a" * 64 + "/%2e%2e/x",
        "a" * 64 + "?x=/../",
    ],
)
def test_path_tricks_are_400_on_the_shipped_server(shipped, path):
    port, url, art = shipped
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        status, body = raw(port, method, f"/v1/artifacts/{path}")
        if path.startswith("a" * 64 + "?"):  # a query is not part of the key: a plain miss
            assert status in (401, 404), (method, path, status)
            continue
        assert status == 400, (method, path, status, body[:200])
    assert httpx.get(f"{url}/v1/artifacts/{art.key}").status_code == 200, "the server still serves"


@pytest.mark.parametrize(
    "headers, status",
    [
        ("X-One: " + "a" * 15_000 + "\r\n", 200),
        ("X-One: " + "a" * 17_000 + "\r\n", 431),
        ("".join(f"X-H{i}: {'b' * 1000}\r\n" for i in range(20)), 431),  # many headers, 20 KB together
        ("X-One: " + "a" * 200_000 + "\r\n", 431),
    ],
    ids=["15k", "17k-one", "20k-many", "200k"],
)
def test_header_limits_on_the_shipped_server(shipped, headers, status):
    port, url, art = shipped
    got, body = raw(port, "GET", f"/v1/artifacts/{art.key}", headers)
    assert got == status
    if status == 431:
        assert b'"error": "headers_too_large"' in body
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200, "the server survives"


def test_error_bodies_are_json_with_an_actionable_detail(shipped):
    port, url, art = shipped

    def error(response: httpx.Response, status: int, code: str) -> str:
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/json")
        body = response.json()
        assert set(body) >= {"error", "detail"} and body["error"] == code
        return str(body["detail"])

    with httpx.Client(base_url=url, timeout=10) as c:
        bad = c.post("/v1/resolve", content=b"spec=1", headers={"content-type": "application/json"})
        assert "body is not JSON" in error(bad, 400, "bad_json")
        detail = error(c.post("/v1/resolve", json=[1, 2]), 422, "invalid_request")
        assert "body must be a JSON object" in detail
        detail = error(c.post("/v1/resolve", json={"spec": spec().to_dict(), "target": "h200"}), 422, "invalid_request")
        assert "target: expected GPU-smMAJORMINOR" in detail and "h200-sm90" in detail
        detail = error(
            c.post("/v1/resolve", json={"spec": spec().to_dict(), "target": str(TARGET), "x": 1}),
            422,
            "invalid_request",
        )
        assert "x: not a field of this request" in detail
        assert "/docs" in error(c.get("/nope"), 404, "not_found")
        assert "allowed: POST" in error(c.get("/v1/resolve"), 405, "method_not_allowed")
        key = "f" * 64
        denied = c.delete(f"/v1/artifacts/{key}", headers={"authorization": f"Bearer {WRITE}"})
        assert "not an admin token" in error(denied, 403, "forbidden")
        assert "needs an admin token" in error(c.delete(f"/v1/artifacts/{key}"), 401, "unauthorized")


def test_docs_work_with_no_internet(shipped):
    port, url, art = shipped
    page = httpx.get(f"{url}/docs")
    assert page.status_code == 200
    html = page.text
    assert not re.search(r"(?:src|href|url)\s*[=:(]\s*['\"]?(?:https?:)?//", html), "no asset from another host"
    assets = re.findall(r"(?:src|href)=\"([^\"]+)\"", html) + re.findall(r"url: '([^']+)'", html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets) and any(a.endswith(".css") for a in assets)
    for asset in assets:
        got = httpx.get(f"{url}{asset}")
        assert got.status_code == 200 and len(got.content) > 100, asset
    script = httpx.get(f"{url}/docs/assets/swagger-ui-bundle.js")
    assert "javascript" in script.headers["content-type"] and len(script.content) > 500_000
    assert httpx.get(f"{url}/openapi.json").json()["openapi"].startswith("3.")


def test_the_suite_servers_are_configured_as_graphcache_serve_ships_it(tmp_path):
    store = DiskStore(tmp_path)
    srv = ServerThread(create_app(Settings(cache_dir=store.path), store=store))
    config = srv.server.config
    shipped = uvicorn_options(host="127.0.0.1", port=srv.port)
    for name in ("loop", "http", "limit_concurrency", "timeout_keep_alive", "workers", "access_log"):
        assert getattr(config, name) == shipped[name], name
    # uvloop, and uvicorn's httptools protocol with the body-pieces extension
    # (service.transport): a uvicorn it no longer fits would fall back quietly.
    assert (config.loop, config.http) == ("uvloop", "service.transport:GraphcacheHttpProtocol")
    srv.sock.close()
