"""How graphcache is served: one uvicorn configuration for ``graphcache serve``
and for the test suite's servers, so the tests run the stack users run
(uvloop, httptools, the same limits) and a difference cannot creep in."""

from __future__ import annotations

from typing import Any

import uvicorn

from service.transport import PROTOCOL

SHUTDOWN_GRACE = 10.0


def uvicorn_options(
    *,
    host: str,
    port: int,
    workers: int = 1,
    log_level: str = "info",
    limit_concurrency: int = 1024,
    timeout_keep_alive: int = 5,
    shutdown_grace: float = SHUTDOWN_GRACE,
) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config``.

    Request bodies are bounded by GRAPHCACHE_MAX_UPLOAD and
    GRAPHCACHE_UPLOAD_TIMEOUT in the app, and request heads by the app's
    16 KiB limit (431); ``shutdown_grace`` is how long open requests get on
    shutdown (tests shorten it to stop quickly, nothing else differs).
    """
    return {
        "host": host,
        "port": port,
        "workers": workers,
        "loop": "uvloop",
        "http": PROTOCOL,  # httptools, plus writev of many buffers (service.transport)
        # No WebSocket route: an Upgrade request is answered as plain HTTP (the
        # API's JSON), not handed to a WebSocket library that refuses it with
        # an empty text/plain 403.
        "ws": "none",
        "log_level": log_level,
        "access_log": False,
        "timeout_keep_alive": timeout_keep_alive,
        "timeout_graceful_shutdown": shutdown_grace,
        "limit_concurrency": limit_concurrency,
    }


def config(app: Any, **options: Any) -> uvicorn.Config:
    """A uvicorn.Config of ``app`` (an ASGI app, or an import string with
    ``factory=True``) with ``uvicorn_options(**options)``."""
    factory = bool(options.pop("factory", False))
    return uvicorn.Config(app, factory=factory, **uvicorn_options(**options))
