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
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

EXTENSION = "graphcache.body_pieces"
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


class PiecesCycle(RequestResponseCycle):
    """uvicorn's request/response cycle, plus the body-pieces message."""

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
    """uvicorn's httptools protocol whose requests get ``PiecesCycle``."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.__class__ = PiecesCycle  # same state, one more message type
        cycle.scope.setdefault("extensions", {})[EXTENSION] = {}  # type: ignore[index]
        super()._start_asgi_task(cycle, app)


def _compatible() -> bool:
    probe = RequestResponseCycle.__init__.__code__.co_names
    return hasattr(HttpToolsProtocol, "_start_asgi_task") and all(name in probe for name in _CYCLE_STATE)


# What service.server gives uvicorn as its HTTP protocol.
PROTOCOL = "service.transport:GraphcacheHttpProtocol" if _compatible() else "httptools"
