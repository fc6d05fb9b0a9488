"""Routes from a spec: its key (resolve), and building it on this host (build)."""

from __future__ import annotations

import time

import anyio
from fastapi import FastAPI, Request, Response

from graphcache.errors import GraphCacheError
from graphcache.key import key_for
from graphcache.spec import GraphSpec
from graphcache.target import Target
from service.errors import ServiceError, json_response
from service.models import BuildRequest, BuildResult, ResolveRequest, ResolveResult, error_responses
from service.state import State


def add_routes(app: FastAPI, state: State) -> None:
    @app.post(
        "/v1/resolve",
        summary="The key of a spec on a target, and whether it is stored",
        response_model=ResolveResult,
        responses=error_responses(400, 401, 403, 422, 503),
    )
    async def resolve(request: Request, payload: ResolveRequest) -> Response:
        state.auth.require(request, "read")
        spec = GraphSpec.from_dict(payload.spec)
        target = Target.parse(payload.target)
        key = key_for(spec, target)
        present = await state.store_call(state.store.exists, key)
        return json_response(200, {"key": key, "present": present, "target": str(target), "spec": spec.to_dict()})

    @app.post(
        "/v1/build",
        summary="Build a spec on this host's GPU and store it (write token)",
        response_model=BuildResult,
        responses=error_responses(400, 401, 403, 409, 422, 500, 503, 507),
    )
    async def build(request: Request, payload: BuildRequest) -> Response:
        state.auth.require(request, "write")
        spec = GraphSpec.from_dict(payload.spec)
        cache = state.graph_cache()
        start = time.perf_counter()
        try:
            artifact, built = await anyio.to_thread.run_sync(cache.ensure, spec)
        except GraphCacheError:
            state.metrics.builds.labels("failed").inc()
            raise
        if built:
            state.metrics.builds.labels("built").inc()
            state.metrics.build_seconds.observe(time.perf_counter() - start)
            unwritable = state.unwritable()
            if unwritable is not None and not await state.store_call(state.store.exists, artifact.key):
                # GraphCache keeps a build it could not store (for a worker); a
                # server that was asked to store it says it did not.
                raise ServiceError(507, "store_full", f"built {artifact.key}, but nothing was stored: {unwritable}")
        return json_response(200, {"key": artifact.key, "built": built, "target": str(artifact.target)})
