"""service/transport.py: the body-pieces ASGI extension of `graphcache serve`'s
uvicorn protocol, driven through a real server on 127.0.0.1."""

from __future__ import annotations

import httpx
import pytest

from service.transport import EXTENSION, PIECES
from tests.servers import ServerThread


def _app(pieces: list[bytes], length: int, seen: dict):
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        seen["extension"] = EXTENSION in scope.get("extensions", {})
        headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(length).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if not seen["extension"]:  # as an app must where the server does not offer it
            await send({"type": "http.response.body", "body": b"".join(pieces)})
            return
        try:
            await send({"type": PIECES, "pieces": pieces, "more_body": False})
        except RuntimeError as exc:
            seen["error"] = str(exc)
            raise

    return app


def test_pieces_arrive_in_order_as_one_body_on_a_kept_alive_connection():
    pieces = [b"head", bytes(range(256)) * 1024, b"", b"tail" * 1000]
    body = b"".join(pieces)
    seen: dict = {}
    with ServerThread(_app(pieces, len(body), seen)) as srv, httpx.Client() as client:
        for _ in range(3):  # the connection stays usable after each answer
            response = client.get(srv.url + "/")
            assert response.status_code == 200 and response.content == body
    assert seen["extension"] is True


def test_pieces_past_the_content_length_are_refused_not_sent():
    seen: dict = {}
    with ServerThread(_app([b"x" * 100, b"y" * 100], 150, seen)) as srv:
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.url + "/").read()
    assert "longer than Content-Length" in seen["error"]


def test_the_extension_is_advertised_only_by_the_shipped_protocol():
    seen: dict = {}
    srv = ServerThread(_app([b"abc"], 3, seen))
    srv.server.config.http = "h11"  # uvicorn's other protocol: no extension, the app must not use it
    with srv:
        assert httpx.get(srv.url + "/").content == b"abc"
    assert seen["extension"] is False
