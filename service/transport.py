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

Slow readers are bounded the same way, by a send deadline (nginx's
``send_timeout``): whenever what the server holds of an answer passes the
transport's high-water mark (uvloop's 64 KiB; ``pause_writing``), the client
has GRAPHCACHE_SEND_TIMEOUT seconds to drain it below the low-water mark
(``resume_writing``), and an answer handed over whole must be drained
completely within the same time; else the connection is closed (aborted: what
is unsent is dropped) and counted in ``graphcache_send_timeouts_total``.
Meanwhile an answer stalled on its reader does not count against
--limit-concurrency either (at most ``STALLED_PER_LIMIT`` x the limit of
them): 1,000 clients that never read hold no slot a reader who does needs.
What a stalled answer holds is what its writes queued: one 512 KiB chunk of
a large GET (service.reader.STREAM_CHUNK), or a batch answer of at most
8 MiB (service.routes.batch.HELD_MAX), mostly the hot cache's own bytes; in
the kernel, at most ``SEND_LOWAT`` unsent bytes per connection
(TCP_NOTSENT_LOWAT; without it Linux took about 3 MiB from each reader who
never reads, and 1,000 of them exhausted the host's TCP memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from typing import Any

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from graphcache.settings import DEFAULT_HEADER_TIMEOUT, DEFAULT_SEND_TIMEOUT

EXTENSION = "graphcache.body_pieces"
ARRIVING = "graphcache.arriving"  # the requests whose body is arriving (service.intake)
ARRIVING_PER_LIMIT = 4
STALLED_PER_LIMIT = 4
SEND_LOWAT = 128 * 1024  # unsent bytes of an answer the kernel holds per connection (TCP_NOTSENT_LOWAT)
NOTSENT_LOWAT: int | None = getattr(socket, "TCP_NOTSENT_LOWAT", None)  # Linux, macOS
# How this server runs: {"limit_concurrency": N or None, "send_timeouts": count}, and
# "on_send_timeout", which the app's metrics set to be told of each.
SERVER = "graphcache.server"
log = logging.getLogger("graphcache.service")
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
    return _seconds("GRAPHCACHE_HEADER_TIMEOUT", DEFAULT_HEADER_TIMEOUT)


def send_timeout() -> float:
    """GRAPHCACHE_SEND_TIMEOUT (checked by Settings when the app starts)."""
    return _seconds("GRAPHCACHE_SEND_TIMEOUT", DEFAULT_SEND_TIMEOUT)


def _seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


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
    a deadline for each request head and for each answer's drain, and JSON
    bodies for its own errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout()
        self.send_timeout = send_timeout()
        self._head_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._head_begun = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and NOTSENT_LOWAT is not None:
            # The kernel takes at most this much unsent of an answer (else ~3 MiB
            # each, autotuned: 1,000 readers who never read exhausted tcp_mem and
            # stalled every connection of the host, good ones too).
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, NOTSENT_LOWAT, SEND_LOWAT)
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
        self._disarm_send_timer()
        self._stalled().discard(self)
        super().connection_lost(exc)

    # -- the send deadline --------------------------------------------------

    def pause_writing(self) -> None:
        """The transport holds more of an answer than its high-water mark:
        the client has the send deadline to drain it."""
        super().pause_writing()
        if self.cycle is not None and not self.cycle.response_complete:
            self._stalled().add(self)  # its request waits on the client, not on the server
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stalled().discard(self)
        self._disarm_send_timer()
        self._watch_tail()

    def on_response_complete(self) -> None:
        self._stalled().discard(self)
        self._watch_tail()
        super().on_response_complete()

    def _watch_tail(self) -> None:
        """An answer written whole but not drained yet sits below the
        high-water mark, where no resume_writing will come: it must be gone
        within the deadline too (a close waits for it as long as it takes)."""
        cycle = self.cycle
        if self._send_timer is None and cycle is not None and cycle.response_complete:
            if self.transport.get_write_buffer_size():
                self._send_timer = self.loop.call_later(self.send_timeout, self._send_timed_out)

    def _disarm_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        if not self.flow.write_paused and not self.transport.get_write_buffer_size():
            return  # drained after all
        log.info(
            "closed %s: its answer was not drained within %gs (GRAPHCACHE_SEND_TIMEOUT)",
            f"{self.client[0]}:{self.client[1]}" if self.client else "a connection",
            self.send_timeout,
        )
        info = self._server_info()
        info["send_timeouts"] += 1
        if (counted := info.get("on_send_timeout")) is not None:
            counted()  # the app's metrics, summed over the server's workers
        self.transport.abort()  # what is unsent is dropped; connection_lost frees the request

    def _stalled(self) -> set[object]:
        """This server's connections whose answer waits for its client to read."""
        found: set[object] | None = getattr(self.server_state, "graphcache_stalled", None)
        if found is None:
            found = set()
            self.server_state.graphcache_stalled = found  # type: ignore[attr-defined]
        return found

    def _server_info(self) -> dict[str, Any]:
        """What every request of this server is told of it (``SERVER``)."""
        found: dict[str, Any] | None = getattr(self.server_state, "graphcache_server", None)
        if found is None:
            found = {"limit_concurrency": self.limit_concurrency, "send_timeouts": 0}
            self.server_state.graphcache_server = found  # type: ignore[attr-defined]
        return found

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
        extensions[SERVER] = self._server_info()  # type: ignore[index, assignment]
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
        still arriving, and answers stalled on a client that does not read,
        are not counted as being served (each is bounded by its deadline,
        and the bodies by their budgets). Bounds: at most ARRIVING_PER_LIMIT
        x the limit of arriving bodies, STALLED_PER_LIMIT x the limit of
        stalled answers left out, and (1 + ARRIVING_PER_LIMIT) x the limit of
        open connections (idle ones are closed at the header and keep-alive
        timeouts)."""
        limit = self.limit_concurrency
        if limit is None or len(self.connections) >= (1 + ARRIVING_PER_LIMIT) * limit:
            return False
        if body:
            return arriving < ARRIVING_PER_LIMIT * limit
        stalled = min(len(self._stalled()), STALLED_PER_LIMIT * limit)
        return len(self.tasks) - arriving - stalled < limit


def _compatible() -> bool:
    probe = RequestResponseCycle.__init__.__code__.co_names
    hooks = (
        "_start_asgi_task",
        "send_400_response",
        "on_message_begin",
        "on_headers_complete",
        "on_response_complete",
        "pause_writing",
        "resume_writing",
    )
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
