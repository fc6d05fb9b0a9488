"""POST /v1/batch: many artifacts in one streamed answer (graphcache.batch frames it).

A worker that starts needs every graph of its model, often 50-200 plans of
tens of KiB; one request instead of one each saves the per-request cost on
both sides. Entries are verified exactly as on a single GET; the answer is
sent entry by entry, with bounded memory (see ``send_batch``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import StreamingResponse

from graphcache.batch import ABSENT, ENVELOPE, MAGIC, MEDIA_TYPE, end_record, record, record_head
from graphcache.errors import CorruptArtifact, StoreError
from graphcache.key import is_key
from service.errors import ServiceError, bad_json, body, json_problem
from service.intake import plain_keys, refuse, replay
from service.models import ErrorBody, error_responses
from service.reader import Served, Unverified, file_chunks
from service.state import State
from service.transport import EXTENSION, PIECES

log = logging.getLogger("graphcache.service")

# Without service.transport's body-pieces extension (another ASGI server),
# envelopes are joined into writes of this size: one ASGI send per envelope
# took 4.5-5.5 ms for 100 x 64 KiB, writes of 1-2 MiB 6-9 ms (each waits for
# the client to drain), of 4 MiB 3.2-4.9 ms (docs/benchmarks.md).
WRITE = 4 * 1024 * 1024
# Bytes resolved before sending (then the length is known): a start-up batch
# of 100 plans of 64 KiB fits; a larger answer streams the rest, so
# concurrent batches stay cheap.
HELD_MAX = 8 * 1024 * 1024
HEADERS = [(b"content-type", MEDIA_TYPE.encode()), (b"cache-control", b"no-store")]


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[str] = Field(description="cache keys (64 lowercase hex), at most GRAPHCACHE_MAX_BATCH")


def add_routes(app: FastAPI, state: State) -> None:
    @app.post(
        "/v1/batch",
        summary="Fetch many artifacts in one streamed answer (read token)",
        response_class=Response,
        responses={
            200: {
                "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                "description": "GCBATCH1 records: each stored envelope, each absent key, then an end record "
                "(layout in graphcache/batch.py)",
            },
            413: {"model": ErrorBody, "description": "more keys than GRAPHCACHE_MAX_BATCH"},
            **error_responses(400, 401, 403, 422, 503),
        },
    )
    async def batch(request: Request, payload: BatchRequest) -> Response:
        state.auth.require(request, "read")
        keys = payload.keys
        if not keys:
            raise ServiceError(400, "empty_batch", "keys: the list is empty; give at least one key")
        limit = state.settings.max_batch
        if len(keys) > limit:
            raise ServiceError(
                413,
                "too_many_keys",
                f"keys: {len(keys)} keys asked for, at most {limit} in one batch (GRAPHCACHE_MAX_BATCH); split it",
            )
        bad = [k for k in keys if not is_key(k)]
        if bad:
            shown = ", ".join(repr(k[:80]) for k in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise ServiceError(400, "invalid_key", f"keys: {shown} is not a key; a key is 64 lowercase hex characters")
        state.metrics.batches.inc()
        unique = list(dict.fromkeys(keys))  # a duplicate is answered once
        return BatchResponse(state, unique)


class BatchFastPath:
    """POST /v1/batch in front of FastAPI, for the request every worker sends
    at start-up: a JSON ``{"keys": [...]}`` of valid keys, with a read token
    where one is needed. FastAPI's routing, dependency and validation
    machinery cost about as much as resolving a hundred entries; here the
    body is parsed and checked directly. The body was taken in by
    service.intake (token, size bound, deadline); a JSON body that does not
    parse is 400 ``bad_json`` naming what is wrong; anything else but that
    request (another content type, a bad token, a body that is not such an
    object, an empty, oversized or invalid key list) is handed to the
    FastAPI route with the body as read, so every other error is the
    route's own, word for word.
    """

    def __init__(self, state: State, fallback: Any) -> None:
        self.state = state
        self.fallback = fallback  # the FastAPI app's ASGI callable
        self.counter = state.metrics.requests.labels("/v1/batch", "POST", "200")

    @staticmethod
    def handles(scope: dict[str, Any]) -> bool:
        return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/batch"

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        state = self.state
        limit = state.settings.max_batch
        headers = dict(scope["headers"])
        # service.intake took the body in (token, size, deadline) and
        # hands it over in one message; none was declared: empty.
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        data = message.get("body", b"")
        ctype = headers.get(b"content-type", b"")
        keys = None
        if ctype.partition(b";")[0].strip().lower() == b"application/json" and state.auth.allows(
            headers.get(b"authorization"), "read"
        ):
            keys = plain_keys(data, limit)
            problem = None if keys is not None or not data else json_problem(data)
            if problem is not None:
                state.metrics.requests.labels("/v1/batch", "POST", "400").inc()
                await refuse(send, bad_json(problem), close=False)
                return
        if keys is None:
            await self.fallback(scope, replay(data, receive), send)
            return
        state.metrics.batches.inc()
        status = await send_batch(state, list(dict.fromkeys(keys)), scope, receive, send)
        if status == 200:
            self.counter.inc()
        else:
            state.metrics.requests.labels("/v1/batch", "POST", str(status)).inc()


class BatchResponse(Response):
    """The FastAPI route's answer: ``send_batch``."""

    def __init__(self, state: State, keys: list[str]) -> None:
        super().__init__(status_code=200, media_type=MEDIA_TYPE)
        self.state = state
        self.keys = keys

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send_batch(self.state, self.keys, scope, receive, send)


async def send_batch(state: State, keys: list[str], scope: Any, receive: Any, send: Any) -> int:
    """The batch answer, sent the cheapest way the entries allow; returns
    the status sent.

    A store that fails before the status line is sent makes the answer a 503
    (what it holds is unknown, not absent); one that fails later cuts the
    answer short, without its end record, which clients read as a failure.

    First the entries are resolved (looked up, verified where needed) while
    the bytes they hold stay under ``HELD_MAX`` and none needs its file
    streamed: then the size of the whole answer is known and it goes out
    with a Content-Length (chunked encoding cost clients a copy of every
    byte). Where the server offers the body-pieces extension
    (service.transport, as ``graphcache serve`` does), the held pieces go to
    the socket as they are, in one gathered write; elsewhere they are joined
    into writes of ``WRITE`` bytes. Past that budget, or at an entry to
    stream from its open file, the rest is streamed in chunks. Either way
    memory stays bounded (HELD_MAX plus one write); the generator (and any
    file it holds open) is closed however the answer ends, a client going
    away mid-stream included.
    """
    pieces: list[bytes] = [MAGIC]
    held = found = absent = 0
    served_list: list[Served] = []
    rest = 0
    carried: Served | None = None  # resolved at the budget's edge: streamed first, not resolved again
    try:
        for rest, key in enumerate(keys):  # noqa: B007 - rest: where streaming resumes
            # Hot entries of a DiskStore resolve here without a context
            # switch; an entry to verify (hashing) goes to a thread.
            served, absence = await _lookup(state, key)
            if isinstance(served, Unverified):
                served, absence = await _verify(state, key, served)
            if served is not None and (served.handle is not None or held + served.size > HELD_MAX):
                if served.handle is not None:
                    served.handle.close()  # reopened (and checked again) when its turn comes
                else:
                    carried = served
                break
            if served is None:
                pieces.append(record(ABSENT, key, absence))
                absent += 1
                continue
            assert served.data is not None
            pieces += (record_head(ENVELOPE, key, served.size), served.data)
            held += served.size
            found += 1
            served_list.append(served)
        else:
            rest = len(keys)
    except ServiceError as err:
        data = body(err.code, err.detail)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        return err.status
    _count(state, served_list, absent)
    if rest == len(keys):
        pieces.append(end_record(found, absent))
        length = sum(map(len, pieces))
        headers = [*HEADERS, (b"content-length", str(length).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if EXTENSION in scope.get("extensions", ()):
            await send({"type": PIECES, "pieces": pieces, "more_body": False})
            return 200
        for piece in _in_writes(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200
    stream = _stream(state, b"".join(pieces), keys[rest:], found, absent, carried)
    try:
        # StreamingResponse also stops the generator when the client goes away.
        headers_ = {k.decode(): v.decode() for k, v in HEADERS}
        await StreamingResponse(stream, headers=headers_)(scope, receive, send)
    finally:
        await stream.aclose()
    return 200


def _in_writes(pieces: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for piece in pieces:
        group.append(piece)
        size += len(piece)
        if size >= WRITE:
            out.append(b"".join(group))
            group, size = [], 0
    if group:
        out.append(b"".join(group))
    return out


async def _lookup(state: State, key: str) -> tuple[Served | Unverified | None, bytes]:
    """The entry of ``key`` as far as it is known without hashing, or None
    and why it is absent. Raises ServiceError (503) when the store fails:
    an entry it could not look up is unknown, never reported absent."""
    try:
        entry = await state.read_entry(key)
    except CorruptArtifact as exc:  # unreadable: set aside by the reader; the other keys are answered
        return None, f"quarantined: {exc.reason}".encode()
    except (StoreError, OSError) as exc:
        if isinstance(exc, OSError):
            state.metrics.store_errors.inc()  # store_call counted a StoreError
        raise ServiceError(503, "store_unavailable", f"the store did not answer for key {key}: {exc}") from exc
    return (entry, b"") if entry is not None else (None, b"absent")


async def _verify(state: State, key: str, entry: Unverified) -> tuple[Served | None, bytes]:
    served = await anyio.to_thread.run_sync(state.reader.verify, key, entry)
    if isinstance(served, Served):
        return served, b""
    return None, served.encode()


async def _resolve(state: State, key: str) -> tuple[Served | None, bytes]:
    """The verified entry of ``key``, or None and why it is absent."""
    entry, absence = await _lookup(state, key)
    if isinstance(entry, Unverified):
        return await _verify(state, key, entry)
    return entry, absence


def _count(state: State, served: list[Served], absent: int) -> None:
    """The per-artifact metrics, once per batch rather than per entry."""
    metrics = state.metrics
    if served:
        metrics.hits.inc(len(served))
        metrics.bytes_served.inc(sum(s.size for s in served))
        metrics.served_build_seconds.inc(sum(s.build_seconds for s in served))
        metrics.served_sizes.observe_many([s.size for s in served])
    if absent:
        metrics.misses.inc(absent)


async def _stream(
    state: State, first: bytes, keys: list[str], found: int, absent: int, carried: Served | None = None
) -> AsyncGenerator[bytes, None]:
    """The rest of a batch, from ``keys``; ``carried`` is the first key's
    entry when it was already resolved (in memory)."""
    yield first
    pending: list[bytes] = []
    size = 0
    for index, key in enumerate(keys):
        served: Served | None
        if index == 0 and carried is not None:
            served, absence = carried, b""
        else:
            try:
                served, absence = await _resolve(state, key)
            except ServiceError as err:
                # The status line is sent: the answer ends here without its
                # end record, so the client reports it cut short.
                log.warning("batch cut short at key %s: %s", key[:12], err.detail)
                yield b"".join(pending)
                return
        if served is None:
            _count(state, [], 1)
            pending.append(record(ABSENT, key, absence))
            absent += 1
            continue
        _count(state, [served], 0)
        found += 1
        pending.append(record_head(ENVELOPE, key, served.size))
        size += len(pending[-1])
        if served.handle is None:
            assert served.data is not None
            pending.append(served.data)
            size += served.size
            if size >= WRITE:
                yield b"".join(pending)
                pending.clear()
                size = 0
            continue
        # A large verified file: streamed from the open handle, a chunk at a time.
        # The handle is owned from here on: a client that goes away at the
        # next yield closes the generator, and with it this file, at once
        # (not whenever a reference cycle is collected).
        with served.handle as fh:
            yield b"".join(pending)
            pending.clear()
            size = 0
            for chunk in file_chunks(fh, served.size):
                yield chunk
    pending.append(end_record(found, absent))
    yield b"".join(pending)
