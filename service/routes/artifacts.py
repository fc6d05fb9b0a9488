"""Routes for one artifact: GET/HEAD (see service.asgi for the fast path), PUT, DELETE, pin and unpin."""

from __future__ import annotations

import anyio
from fastapi import FastAPI, Request, Response

from graphcache.envelope_check import EnvelopeCheck
from graphcache.errors import CorruptArtifact, StoreError, StoreFull
from graphcache.stores.disk import read_all
from service.errors import ServiceError, from_library, json_response
from service.models import (
    ARTIFACT_HEADERS,
    OCTET_BODY,
    KeyPath,
    PinResult,
    UploadResult,
    error_responses,
)
from service.state import State
from service.upload import handed


def add_routes(app: FastAPI, state: State) -> None:
    @app.get(
        "/v1/artifacts/{key}",
        response_class=Response,
        summary="Download an artifact (verified before it is served)",
        responses={
            200: {
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                "description": "the artifact envelope",
                "headers": ARTIFACT_HEADERS,
            },
            304: {"description": "If-None-Match matched the ETag"},
            **error_responses(400, 401, 403, 404, 503),
        },
    )
    async def get_artifact(key: KeyPath, request: Request) -> Response:
        # Served by ArtifactFastPath; this route documents it and serves if the layer is bypassed.
        status, headers, served = await state.artifact("GET", key, _raw_headers(request))
        payload = b""
        if served is not None and served.handle is not None:
            with served.handle:
                payload = read_all(served.handle, served.size)
        elif served is not None and served.data is not None:
            payload = served.data
        return Response(payload, status_code=status, headers={k.decode(): v.decode() for k, v in headers})

    @app.head(
        "/v1/artifacts/{key}",
        response_class=Response,
        summary="Whether an artifact is stored (no body)",
        responses={
            200: {"description": "stored", "headers": ARTIFACT_HEADERS},
            304: {"description": "not modified"},
            **error_responses(400, 401, 403, 404, 503),
        },
    )
    async def head_artifact(key: KeyPath, request: Request) -> Response:
        status, headers, _ = await state.artifact("HEAD", key, _raw_headers(request))
        return Response(b"", status_code=status, headers={k.decode(): v.decode() for k, v in headers})

    @app.put(
        "/v1/artifacts/{key}",
        summary="Upload an artifact (write token); the server verifies it before storing",
        status_code=201,
        response_model=UploadResult,
        responses={
            200: {"model": UploadResult, "description": "identical artifact already stored"},
            **error_responses(400, 401, 403, 408, 413, 503, 507),
        },
        openapi_extra=OCTET_BODY,
    )
    async def put_artifact(key: KeyPath, request: Request) -> Response:
        state.auth.require(request, "write")
        # service.intake took the body in: within GRAPHCACHE_MAX_UPLOAD (413),
        # GRAPHCACHE_UPLOAD_TIMEOUT (408) and GRAPHCACHE_UPLOAD_BUDGET (503),
        # written to a file and checked on the way (service.upload).
        upload = handed(request.scope)
        try:
            if upload is None:  # no body was declared: nothing to store
                EnvelopeCheck().finish(expected_key=key)
                raise AssertionError("an empty body verified")  # pragma: no cover - finish raises
            checked = await anyio.to_thread.run_sync(upload.verify, key, state.settings.verify_keys)
        except CorruptArtifact as exc:
            state.metrics.rejected.labels(exc.reason).inc()
            raise ServiceError(400, exc.reason, f"upload refused: {exc}") from exc
        except StoreFull as exc:  # the disk filled while the file was written
            state.metrics.rejected.labels("store_full").inc()
            raise from_library(exc) from exc
        except StoreError as exc:
            raise ServiceError(503, "store_unavailable", str(exc)) from exc
        try:
            # A local disk's write is not cut short (it would go on and land
            # after a 503); a remote store's is bounded by GRAPHCACHE_TIMEOUT.
            created = await state.store_call(upload.publish, bounded=not state.local)
        except StoreFull as exc:
            state.metrics.rejected.labels("store_full").inc()
            raise from_library(exc) from exc
        except StoreError as exc:
            raise ServiceError(503, "store_unavailable", str(exc)) from exc
        state.reader.forget(key)
        state.metrics.uploads.labels("created" if created else "identical").inc()
        return json_response(
            201 if created else 200,
            {
                "key": key,
                "created": created,
                "size": checked.size,
                "target": str(checked.target),
                "spec": checked.spec.summary(),
            },
        )

    @app.delete(
        "/v1/artifacts/{key}",
        status_code=204,
        response_class=Response,
        summary="Remove an artifact (admin token)",
        responses={204: {"description": "removed"}, **error_responses(400, 401, 403, 404, 503, 507)},
    )
    async def delete_artifact(key: KeyPath, request: Request) -> Response:
        state.auth.require(request, "admin")
        removed = await state.store_call(state.store.delete, key, bounded=not state.local)
        state.reader.forget(key)
        if not removed:
            raise ServiceError(404, "not_found", f"no artifact stored for key {key}")
        return Response(status_code=204)

    @app.post(
        "/v1/artifacts/{key}/pin",
        summary="Exempt an artifact from eviction (write token)",
        response_model=PinResult,
        responses=error_responses(400, 401, 403, 404, 501, 503, 507),
    )
    async def pin_artifact(key: KeyPath, request: Request) -> Response:
        return await _set_pin(state, request, key, pinned=True)

    @app.delete(
        "/v1/artifacts/{key}/pin",
        summary="Make a pinned artifact evictable again (write token)",
        response_model=PinResult,
        responses=error_responses(400, 401, 403, 404, 501, 503, 507),
    )
    async def unpin_artifact(key: KeyPath, request: Request) -> Response:
        return await _set_pin(state, request, key, pinned=False)


async def _set_pin(state: State, request: Request, key: str, *, pinned: bool) -> Response:
    state.auth.require(request, "write")
    change = getattr(state.store, "pin" if pinned else "unpin", None)
    if change is None:
        raise ServiceError(
            501, "not_supported", f"{state.store!r} cannot {'pin' if pinned else 'pin or unpin'} entries"
        )
    if not await state.store_call(change, key, bounded=not state.local):
        raise ServiceError(404, "not_found", f"no artifact stored for key {key}")
    return json_response(200, {"key": key, "pinned": pinned})


def _raw_headers(request: Request) -> dict[bytes, bytes]:
    return dict(request.scope["headers"])
