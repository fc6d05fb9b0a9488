"""The FastAPI app over a Store (and a compiler where the host has a GPU).

``create_app`` only wires the parts together; each lives in its own module:

- ``service.reader``: the raw artifact read path (stored bytes verified before
  they are served, quarantine of corrupt entries);
- ``service.state``: what routes share, and GET/HEAD of one artifact;
- ``service.asgi``: the ASGI layers in front of FastAPI (artifact fast path,
  header limits, request metrics);
- ``service.intake``: request bodies before any route (token from the head,
  size limits, deadline, upload budget, JSON checks);
- ``service.routes``: the FastAPI routes by resource;
- ``service.docs``: Swagger UI at /docs from packaged assets (no CDN);
- ``service.auth``, ``service.models``, ``service.errors``, ``service.metrics``.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI

from graphcache.settings import Settings
from graphcache.stores import Store, open_store
from service import docs
from service.asgi import ArtifactFastPath, GraphcacheApp, RequestMetrics
from service.errors import install_handlers
from service.intake import BodyGate
from service.routes import artifacts, batch, builds, catalog, health, status
from service.state import State

__all__ = ["GraphcacheApp", "create_app", "create_app_from_env"]


def create_app(
    settings: Settings | None = None, *, store: Store | None = None, compiler: Any = None, from_env: bool = False
) -> GraphcacheApp:
    """The service over ``store`` (default: the one ``settings`` names).

    ``compiler`` builds for POST /v1/build; by default a CudnnCompiler is
    tried on first use, and the route answers 503 with the reason where this
    host has no GPU. ``from_env``: the settings and the store are those the
    environment names (``create_app_from_env``), so a helper process can open
    the store again (service.checker: a manifest's coverage is checked there).
    """
    settings = settings or Settings.from_env()
    store = store if store is not None else open_store(settings)
    state = State(settings, store, compiler, checker=from_env)
    options: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        # FastAPI's native OpenTelemetry hook looks up the environment on
        # every request (~30 us); we export Prometheus metrics instead.
        options["telemetry"] = {"tracing": False, "metrics": False, "logs": False}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(state.housekeeping)
                yield
                tasks.cancel_scope.cancel()
        finally:
            state.scans.close()
            state.checker.close()

    app = GraphcacheApp(
        title="graphcache",
        lifespan=lifespan,
        version="0.1.0",
        description="Prebuilt cuDNN attention graphs, keyed by spec and target, verified end to end.",
        # Swagger UI from the service's own assets (service.docs), not a CDN;
        # ReDoc has no packaged assets, so it is not offered.
        docs_url=None,
        redoc_url=None,
        **options,
    )
    app.state.gc = state
    install_handlers(app)
    for module in (artifacts, catalog, batch, builds, health, status):
        module.add_routes(app, state)
    docs.add_routes(app)
    app.add_middleware(RequestMetrics, metrics=state.metrics)
    app.gate = BodyGate(state)
    app.fast_path = ArtifactFastPath(state)
    app.batch_path = batch.BatchFastPath(state, app.routed)
    return app


def create_app_from_env() -> GraphcacheApp:
    """uvicorn factory: ``uvicorn --factory service.app:create_app_from_env``."""
    return create_app(Settings.from_env(), from_env=True)
