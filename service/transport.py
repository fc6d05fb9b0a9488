"""Where bytes leave the process: uvicorn's httptools protocol with one ASGI
extension, ``graphcache.body_pieces``, that hands many buffers to the socket
in one gathered write (writev) instead of joining them first.

A batch answer is a hundred or more stored envelopes held in memory. Joining
them into one body before an ASGI send copied every byte once more in the
process, about 0.75 ms for 100 x 64 KiB here (memory-bound: the pieces are
no longer in the CPU's caches), and sending them one ASGI message each paid
uvicorn's per-message work and a flow-control wait per piece (4.5-5.5 ms).
With the extension the server writes the pieces as they are: the kernel
copies them into the socket once, as it copies a file nginx sends.

The extension is advertised the ASGI way, in ``scope["extensions"]``; an app
that finds it absent (another server, uvicorn's h11 protocol) joins and
sends ordinary body messages. The message::

    {"type": "graphcache.response.body_pieces", "pieces": [bytes, ...], "more_body": bool}

is a body message whose body is the pieces in order, allowed after an
``http.response.start`` with a Content-Length and counted against it. The
transport queues the pieces by reference, so the app must not change them
(bytes cannot be changed); like a body message, the send first waits for
the client to drain what the transport holds past its limit.

It leans on uvicorn's ``RequestResponseCycle`` (its ``transport``, ``flow``
and response state) and the protocol's ``_start_asgi_task`` (uvicorn 0.45 on); where either is
missing (a uvicorn this was not written against), ``PROTOCOL`` is uvicorn's
own httptools and the app takes its ordinary path.

The protocol is also where connections are policed before the app sees a
request: one that has not sent a complete request head within
GRAPHCACHE_HEADER_TIMEOUT seconds is closed (408 when it had begun one), so
idle sockets cannot use up the concurrency limit; and the answers uvicorn
itself gives (400 for a malformed request, 503 over the concurrency limit,
500 when the app fails before answering) are the API's JSON error bodies.

A request refused over the limit is closed after its 503. The limit counts
requests being answered: requests whose body is still arriving (listed in
``scope["extensions"]["graphcache.arriving"]`` until service.intake has the
body) are left out, so slow senders cannot hold it: each is cut at its
deadline (GRAPHCACHE_UPLOAD_TIMEOUT, 408 and closed); at most
``ARRIVING_PER_LIMIT`` x --limit-concurrency of them are taken in, and open
connections are bounded at (1 + ``ARRIVING_PER_LIMIT``) x the limit.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from graphcache.settings import DEFAULT_HEADER_TIMEOUT

EXTENSION = "graphcache.body_pieces"
ARRIVING = "graphcache.arriving"  # the requests whose body is arriving (service.intake)
ARRIVING_PER_LIMIT = 4
SERVER = "graphcache.server"  # how this server runs: {"limit_concurrency": N or None}
PIECES = "graphcache.response.body_pieces"
_CYCLE_STATE = (
    "transport",
    "flow",
    "disconnected",
    "response_started",
    "response_complete",
    "chunked_encoding",
    "expected_content_length",
)


def _error(status: int, code: str, detail: str, *, close: bool = True, retry_after: int | None = None) -> bytes:
    """A whole HTTP/1.1 error answer with the API's JSON body."""
    data = json.dumps({"error": code, "detail": detail}).encode()
    head = httptools_impl.STATUS_LINE[status] + b"content-type: application/json\r\n"
    head += b"content-length: %d\r\n" % len(data)
    if retry_after is not None:
        head += b"retry-after: %d\r\n" % retry_after
    if close:
        head += b"connection: close\r\n"
    return head + b"\r\n" + data


async def over_limit(scope: Any, receive: Any, send: Any) -> None:
    """The answer past --limit-concurrency (uvicorn's own is plain text)."""
    data = json.dumps(
        {
            "error": "overloaded",
            "detail": "the server is at its concurrency limit (graphcache serve --limit-concurrency); retry shortly",
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    # Closed after the answer: a refused client that goes on sending is not
    # read, and its connection does not hold a place under the limit.
    headers += [(b"retry-after", b"1"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def header_timeout() -> float:
    """GRAPHCACHE_HEADER_TIMEOUT (checked by Settings when the app starts)."""
    try:
        value = float(os.environ.get("GRAPHCACHE_HEADER_TIMEOUT") or DEFAULT_HEADER_TIMEOUT)
    except ValueError:
        return DEFAULT_HEADER_TIMEOUT
    return value if value > 0 else DEFAULT_HEADER_TIMEOUT


class PiecesCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, plus the body-pieces message."""

    async def send_500_response(self) -> None:
        data = json.dumps({"error": "internal", "detail": "internal error; see the server log"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await self.send(
            {"type": "http.response.start", "status": 500, "headers": [*headers, (b"connection", b"close")]}
        )
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    async def send(self, message: Any) -> None:
        if message["type"] != PIECES:
            await super().send(message)
            return
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started or self.response_complete or self.chunked_encoding is not False:
            raise RuntimeError(f"{PIECES} needs a started response with a Content-Length")
        pieces = message["pieces"]
        if self.scope["method"] != "HEAD":
            size = sum(map(len, pieces))
            if size > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length.")
            self.expected_content_length -= size
            self.transport.writelines(pieces)
        if not message.get("more_body", False):
            await super().send({"type": "http.response.body", "body": b"", "more_body": False})


class GraphcacheHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose requests get ``PiecesCycle``, with
    a deadline for each request head and JSON bodies for its own errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout()
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_begun = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True
        if self._head_timer is None:  # a keep-alive connection's next request
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        self._head_begun = False
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A request still being answered (its next one pipelined behind
            # it): its own deadlines apply; look again later.
            self._arm_head_timer()
            return
        if self._head_begun:
            detail = f"no complete request head within {self.header_timeout:g}s (GRAPHCACHE_HEADER_TIMEOUT)"
            self.transport.write(_error(408, "timeout", detail))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        detail = f"malformed HTTP request ({msg.rstrip('.')}): send HTTP/1.1 with a valid request line and headers"
        self.transport.write(_error(400, "bad_request", detail))
        self.transport.close()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        arriving = self._arriving()
        body = declares_body(cycle.scope["headers"])
        if app is httptools_impl.service_unavailable:
            app = self.app if self._admits(len(arriving), body) else over_limit
        cycle.__class__ = PiecesCycle  # same state, one more message type
        extensions = cycle.scope.setdefault("extensions", {})
        extensions[EXTENSION] = {}  # type: ignore[index]
        extensions[SERVER] = {"limit_concurrency": self.limit_concurrency}  # type: ignore[index]
        if body and app is not over_limit:
            # Listed until its body has come (service.intake takes it off).
            arriving.add(cycle)
            extensions[ARRIVING] = {"requests": arriving, "token": cycle}  # type: ignore[index]
        super()._start_asgi_task(cycle, app)

    def _arriving(self) -> set[object]:
        """This server's requests whose body is still arriving: one set for
        every connection of the worker."""
        found: set[object] | None = getattr(self.server_state, "graphcache_arriving", None)
        if found is None:
            found = set()
            self.server_state.graphcache_arriving = found  # type: ignore[attr-defined]
        return found

    def _admits(self, arriving: int, body: bool) -> bool:
        """Whether a request uvicorn would refuse (its connections or tasks
        at --limit-concurrency) is taken after all: requests whose body is
        still arriving are not counted as being served (each is bounded by
        its deadline and the upload budget). Bounds: at most
        ARRIVING_PER_LIMIT x the limit of them, and (1 + ARRIVING_PER_LIMIT)
        x the limit of open connections (idle ones are closed at the header
        and keep-alive timeouts)."""
        limit = self.limit_concurrency
        if limit is None or len(self.connections) >= (1 + ARRIVING_PER_LIMIT) * limit:
            return False
        if body:
            return arriving < ARRIVING_PER_LIMIT * limit
        return len(self.tasks) - arriving < limit


def _compatible() -> bool:
    probe = RequestResponseCycle.__init__.__code__.co_names
    hooks = ("_start_asgi_task", "send_400_response", "on_message_begin", "on_headers_complete")
    return (
        all(hasattr(HttpToolsProtocol, name) for name in hooks)
        and hasattr(httptools_impl, "service_unavailable")
        and hasattr(httptools_impl, "STATUS_LINE")
        and all(name in probe for name in _CYCLE_STATE)
    )


def declares_body(headers: Any) -> bool:
    """Whether a request's head (ASGI's list of header pairs) declares a body."""
    for name, value in headers:
        if name == b"content-length":
            return bytes(value).strip() not in (b"0", b"")
        if name == b"transfer-encoding" and b"chunked" in bytes(value).lower():
            return True
    return False


# What service.server gives uvicorn as its HTTP protocol.
PROTOCOL = "service.transport:GraphcacheHttpProtocol" if _compatible() else "httptools"
