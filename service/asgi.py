"""ASGI layers around FastAPI: the artifact fast path, header limits, and
request metrics.

Artifact GET/HEAD, the hot path, is answered here in front of FastAPI:
reading through the open file handle and skipping FastAPI's routing and
response machinery made it several times faster (docs/benchmarks.md). FastAPI
still declares those routes (service.routes.artifacts), so they appear in the
OpenAPI schema and serve if the layer is off.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI

from service.errors import JSON, ServiceError, body, from_library, send_error
from service.intake import BodyGate, arrived
from service.metrics import Metrics, route_label
from service.reader import file_chunks
from service.state import State
from service.transport import SERVER, declares_body

log = logging.getLogger("graphcache.service")

ARTIFACTS = "/v1/artifacts/"
MAX_HEADER_BYTES = 16 * 1024
SUBRESOURCE = re.compile(r"[0-9a-f]{64}/[a-z]+$")  # used with match(path, pos): no ^


class ArtifactFastPath:
    """Answers GET/HEAD /v1/artifacts/{key} before FastAPI's middleware and
    routing (about 40 us a request here), counting its own request metrics."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._counters: dict[tuple[str, int], Any] = {}

    @staticmethod
    def handles(scope: dict[str, Any]) -> bool:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            return False
        path = scope["path"]
        # /v1/artifacts/{key}/pin and the like belong to FastAPI (405 for GET);
        # any other slash in a key (../, an encoded %2F) is a bad key: 400 here.
        return path.startswith(ARTIFACTS) and not SUBRESOURCE.match(path, len(ARTIFACTS))

    async def serve(self, scope: dict[str, Any], send: Any) -> None:
        method = scope["method"]
        key = scope["path"][len(ARTIFACTS) :]
        try:
            status, out, served = await self.state.artifact(method, key, dict(scope["headers"]))
            payload = b"" if served is None else served.data
        except Exception as exc:  # noqa: BLE001 - every error becomes JSON, never a crash
            err = from_library(exc)
            if err.status >= 500 and not isinstance(exc, ServiceError):
                log.exception("GET %s failed", key[:80])
            data = body(err.code, err.detail)
            status, served = err.status, None
            out = [(b"content-type", JSON), (b"content-length", str(len(data)).encode())]
            out += [(k.encode(), v.encode()) for k, v in err.headers.items()]
            if method == "HEAD":
                # A HEAD answer has no body: the header says why (warm --check reads it).
                out.append((b"x-graphcache-error", _header_text(f"{err.code}: {err.detail}")))
            payload = data if method == "GET" else b""
        counter = self._counters.get((method, status))
        if counter is None:
            counter = self.state.metrics.requests.labels("/v1/artifacts/{key}", method, str(status))
            self._counters[(method, status)] = counter
        counter.inc()
        await send({"type": "http.response.start", "status": status, "headers": out})
        if served is None or served.handle is None:
            await send({"type": "http.response.body", "body": payload})
            return
        with served.handle as fh:
            await stream_file(fh, served.size, send)


def _header_text(text: str, limit: int = 300) -> bytes:
    """``text`` as a header value: printable ASCII, one line, bounded."""
    clean = "".join(c if " " <= c <= "~" else "?" for c in text)
    return clean[:limit].encode("ascii")


async def stream_file(fh: Any, size: int, send: Any) -> None:
    """Send an open file in chunks; each send waits for the socket to drain,
    so memory per download stays near one chunk."""
    sent = 0
    for chunk in file_chunks(fh, size):
        sent += len(chunk)
        await send({"type": "http.response.body", "body": chunk, "more_body": sent < size})


class GraphcacheApp(FastAPI):
    """FastAPI with the artifact fast path in front of everything."""

    fast_path: ArtifactFastPath | None = None
    batch_path: Any = None  # service.routes.batch.BatchFastPath
    gate: BodyGate | None = None  # every request body passes it first (service.intake)
    sized = False  # whether the store's pools were sized to the server's concurrency

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._serve(scope, receive, send)
        finally:
            arrived(scope)  # however it was answered, its body is no longer awaited

    async def _serve(self, scope: Any, receive: Any, send: Any) -> None:
        if not self.sized and scope["type"] == "http":
            # The first request says how many requests a worker serves at
            # once (--limit-concurrency): the store's pools are sized to it.
            self.sized = True
            server = scope.get("extensions", {}).get(SERVER)
            if server is not None:
                self.state.gc.metrics.watch_server(server)  # its send timeouts, in /metrics
            limit = (server or {}).get("limit_concurrency")
            if limit:
                self.state.gc.size_pools(limit)
        if scope["type"] == "http":
            headers = scope["headers"]
            if sum(len(k) + len(v) for k, v in headers) > MAX_HEADER_BYTES:
                # httptools sets no limit of its own on a request's head.
                await send_error(send, 431, "headers_too_large", f"request headers exceed {MAX_HEADER_BYTES} bytes")
                return
            path = scope["path"]
            if (
                path.startswith(ARTIFACTS)
                and "/" in path[len(ARTIFACTS) :]
                and not SUBRESOURCE.match(path, len(ARTIFACTS))
            ):
                # A decoded %2F or ../ in a key, whatever the method.
                await send_error(send, 400, "invalid_key", "a key is 64 lowercase hex characters")
                return
            if self.gate is not None and declares_body(headers):
                await self.gate(scope, receive, send, self.dispatch)
                return
        await self.dispatch(scope, receive, send)

    async def dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        """The fast paths, else FastAPI."""
        fast = self.fast_path
        if fast is not None and fast.handles(scope):
            await fast.serve(scope, send)
            return
        batch = self.batch_path
        if batch is not None and batch.handles(scope):
            await batch.serve(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def routed(self, scope: Any, receive: Any, send: Any) -> None:
        """FastAPI's own handling, past the fast paths (their fallback)."""
        await super().__call__(scope, receive, send)


class RequestMetrics:
    """Counts every request by route template, method and status."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._children: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = route_label(scope["path"])
        status = 500

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            labels = (route, scope["method"], status)
            child = self._children.get(labels)
            if child is None:
                child = self._children[labels] = self.metrics.requests.labels(route, scope["method"], str(status))
            child.inc()
