"""Routes about the server itself: health, Prometheus metrics, counters as JSON."""

from __future__ import annotations

import os
import time
from typing import Any

import anyio
from fastapi import FastAPI, Response

from graphcache.errors import StoreError
from graphcache.stores import Store
from service.errors import ServiceError, error_response, json_response
from service.metrics import Totals
from service.models import Health, error_responses
from service.state import State


def add_routes(app: FastAPI, state: State) -> None:
    @app.get(
        "/healthz",
        summary="Whether the store answers (200 while reads are served), and whether it takes writes",
        response_model=Health,
        responses=error_responses(503),
    )
    async def healthz() -> Response:
        try:
            await state.store_call(_ping, state.store)
        except ServiceError as exc:  # no answer within GRAPHCACHE_TIMEOUT
            return error_response(exc)
        except (StoreError, OSError) as exc:
            if isinstance(exc, OSError):
                state.metrics.store_errors.inc()  # store_call counted a StoreError
            return error_response(ServiceError(503, "store_unavailable", f"{state.store!r} did not answer: {exc}"))
        # A full disk still serves every stored entry: healthy, not writable.
        reason = await anyio.to_thread.run_sync(state.unwritable)
        body = {"status": "ok", "store": repr(state.store), "writable": reason is None, "reason": reason}
        return json_response(200, body)

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "metrics"}},
    )
    async def metrics() -> Response:
        body = await anyio.to_thread.run_sync(state.metrics.render)  # every worker's file, where they share them
        return Response(body, media_type="text/plain; version=0.0.4")

    @app.get("/v1/stats", summary="Counters as JSON: the server's, summed over its workers")
    async def stats() -> Response:
        totals = await anyio.to_thread.run_sync(state.metrics.totals)
        return json_response(200, {"store": repr(state.store), **scope(state, totals.scope), **counters(totals)})


def counters(totals: Totals) -> dict[str, Any]:
    """The counters /v1/stats reports (and the status page shows)."""
    return {
        "hits": int(totals.value("graphcache_hits_total")),
        "misses": int(totals.value("graphcache_misses_total")),
        "bytes_served": int(totals.value("graphcache_bytes_served_total")),
        "served_build_seconds": round(totals.value("graphcache_served_build_seconds_total"), 3),
        "uploads": int(totals.value("graphcache_uploads_total", result="created")),
        "uploads_identical": int(totals.value("graphcache_uploads_total", result="identical")),
        # Reasons that happened (/metrics declares every one at 0 from the start).
        "uploads_rejected": {
            k: int(v) for k, v in totals.by("graphcache_uploads_rejected_total", "reason").items() if v
        },
        "quarantined": int(totals.sum("graphcache_quarantined_total")),
        "builds": int(totals.value("graphcache_builds_total", result="built")),
    }


def scope(state: State, counted: str) -> dict[str, Any]:
    """Whose figures these are: ``counters`` "server" (every worker's,
    ``workers`` of them where known) or "process" (this process's alone),
    the server's uptime, and the worker that answered."""
    server = state.metrics.server
    now = time.time()
    return {
        "counters": counted,
        "workers": server.workers if server is not None else 1,
        "uptime_seconds": round(now - (server.started if server is not None else state.started), 1),
        "worker": {"pid": os.getpid(), "uptime_seconds": round(now - state.started, 1)},
    }


def _ping(store: Store) -> None:
    ping = getattr(store, "ping", None)
    if ping is not None:
        ping()
    else:
        store.exists("0" * 64)
