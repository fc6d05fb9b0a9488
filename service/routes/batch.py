"""POST /v1/batch: many artifacts in one streamed answer (graphcache.batch frames it).

A worker that starts needs every graph of its model, often 50-200 plans of
tens of KiB; one request instead of one each saves the per-request cost on
both sides. Entries are verified exactly as on a single GET and the answer is
streamed entry by entry, never held whole.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import StreamingResponse

from graphcache.batch import ABSENT, ENVELOPE, MAGIC, MEDIA_TYPE, end_record, record, record_head
from graphcache.errors import StoreError
from graphcache.key import is_key
from service.errors import ServiceError
from service.models import ErrorBody, error_responses
from service.reader import Unverified
from service.state import State

log = logging.getLogger("graphcache.service")

FLUSH = 512 * 1024  # small entries are sent together, up to this many bytes a write
CHUNK = 256 * 1024  # large entries are read from their file this much at a time


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
            **error_responses(400, 401, 403, 422),
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
        return BatchResponse(_records(state, unique), media_type=MEDIA_TYPE, headers={"cache-control": "no-store"})


class BatchResponse(StreamingResponse):
    """A StreamingResponse that closes its generator however the stream
    ends: when the client goes away mid-stream Starlette cancels the sending
    task, and the generator (holding an open file for a large entry) would
    otherwise wait for the garbage collector to be closed."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def _records(state: State, keys: list[str]) -> AsyncIterator[bytes]:
    reader, metrics = state.reader, state.metrics
    yield MAGIC
    pending: list[bytes] = []
    size = found = absent = 0
    for key in keys:
        try:
            entry = reader.lookup(key)
        except (StoreError, OSError) as exc:
            # The status line is sent: this key is reported, the others still served.
            metrics.store_errors.inc()
            pending.append(record(ABSENT, key, f"unavailable: {exc}".encode()))
            absent += 1
            continue
        served = entry
        if isinstance(entry, Unverified):
            served = await anyio.to_thread.run_sync(reader.verify, key, entry)
            if served is None:
                metrics.misses.inc()
                pending.append(record(ABSENT, key, b"quarantined: failed verification"))
                absent += 1
                continue
        if served is None:
            metrics.misses.inc()
            pending.append(record(ABSENT, key, b"absent"))
            absent += 1
            continue
        assert not isinstance(served, Unverified)
        metrics.hits.inc()
        state.count_served(served)
        found += 1
        pending.append(record_head(ENVELOPE, key, served.size))
        size += len(pending[-1])
        if served.handle is None:
            assert served.data is not None
            pending.append(served.data)
            size += served.size
            if size >= FLUSH:
                yield b"".join(pending)
                pending.clear()
                size = 0
            continue
        # A large verified file: streamed from the open handle, a chunk at a time.
        yield b"".join(pending)
        pending.clear()
        size = 0
        with served.handle as fh:
            left = served.size
            while left:
                chunk = os.read(fh.fileno(), min(CHUNK, left))
                if not chunk:
                    raise OSError(f"{key}: file ended {left} bytes early")
                left -= len(chunk)
                yield chunk
    pending.append(end_record(found, absent))
    yield b"".join(pending)
