"""Routes about the server itself: health, Prometheus metrics, counters as JSON."""

from __future__ import annotations

import time

import anyio
from fastapi import FastAPI, Response

from graphcache.errors import StoreError
from graphcache.stores import Store
from service.errors import ServiceError, error_response, json_response
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
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/stats", summary="Counters as JSON")
    async def stats() -> Response:
        reg = state.metrics.registry

        def value(name: str, **labels: str) -> int:
            return int(reg.get_sample_value(name, labels) or 0)

        rejected = {
            s.labels["reason"]: int(s.value)
            for m in state.metrics.rejected.collect()
            for s in m.samples
            if s.name.endswith("_total")
        }
        return json_response(
            200,
            {
                "store": repr(state.store),
                "uptime_seconds": round(time.time() - state.started, 1),
                "hits": value("graphcache_hits_total"),
                "misses": value("graphcache_misses_total"),
                "bytes_served": value("graphcache_bytes_served_total"),
                "served_build_seconds": round(reg.get_sample_value("graphcache_served_build_seconds_total") or 0.0, 3),
                "uploads": value("graphcache_uploads_total", result="created"),
                "uploads_identical": value("graphcache_uploads_total", result="identical"),
                "uploads_rejected": rejected,
                "quarantined": sum(
                    int(s.value)
                    for m in state.metrics.quarantined.collect()
                    for s in m.samples
                    if s.name.endswith("_total")
                ),
                "builds": value("graphcache_builds_total", result="built"),
            },
        )


def _ping(store: Store) -> None:
    ping = getattr(store, "ping", None)
    if ping is not None:
        ping()
    else:
        store.exists("0" * 64)
