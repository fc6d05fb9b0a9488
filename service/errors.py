"""The one place where errors become status codes and JSON bodies."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from graphcache.errors import (
    BuildError,
    CorruptArtifact,
    GraphCacheError,
    ManifestTooLarge,
    NoGpu,
    NotFound,
    NotSerializable,
    SpecError,
    StoreError,
    StoreFull,
    TargetError,
    TargetMismatch,
    UnsupportedGpu,
    UnsupportedSpec,
)
from graphcache.target import FORM as TARGET_FORM

log = logging.getLogger("graphcache.service")


class ServiceError(Exception):
    """An error with its HTTP status and short code."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra or {}  # more fields of the JSON body, beside error and detail


def from_library(exc: Exception) -> ServiceError:
    """Map a library error to a ServiceError (status, code, detail)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, CorruptArtifact):
        return ServiceError(400, exc.reason, str(exc))
    if isinstance(exc, SpecError):
        field = f"spec.{exc.field}" if exc.field else "spec"
        return ServiceError(422, "invalid_spec", f"{field}: {exc}")
    if isinstance(exc, TargetError):
        return ServiceError(422, "invalid_target", f"target: {exc}")
    if isinstance(exc, NotFound):
        return ServiceError(404, "not_found", str(exc))
    if isinstance(exc, (NoGpu, UnsupportedGpu)):
        return ServiceError(503, "no_gpu", str(exc))
    if isinstance(exc, TargetMismatch):
        return ServiceError(409, "target_mismatch", str(exc))
    if isinstance(exc, (UnsupportedSpec, NotSerializable)):
        return ServiceError(422, "unsupported", str(exc))
    if isinstance(exc, StoreFull):
        # 507 Insufficient Storage: this write did not fit; reads still work.
        room = {"free_bytes": exc.free, "stored_bytes": exc.stored, "entries": exc.entries, "needed_bytes": exc.needed}
        return ServiceError(507, "store_full", str(exc), extra={k: v for k, v in room.items() if v is not None})
    if isinstance(exc, StoreError):
        return ServiceError(503, "store_unavailable", str(exc))
    if isinstance(exc, BuildError):
        # The build host failed (driver, NVRTC, memory, a plan that failed its
        # checks): the server's fault, not the request's; nothing was stored.
        return ServiceError(500, "build_failed", str(exc))
    if isinstance(exc, ManifestTooLarge):
        return ServiceError(413, "too_many_specs", str(exc), extra={"limit": exc.limit})
    if isinstance(exc, GraphCacheError):
        return ServiceError(400, "bad_request", str(exc))
    return ServiceError(500, "internal", f"internal error ({type(exc).__name__}); see the server log")


JSON = b"application/json"


def body(code: str, detail: str, **extra: Any) -> bytes:
    return json.dumps({"error": code, "detail": detail, **extra}).encode()


async def send_error(send: Any, status: int, code: str, detail: str) -> None:
    """An error answer straight to an ASGI ``send`` (the layers in front of FastAPI)."""
    data = body(code, detail)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", JSON), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


def json_response(status: int, data: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data), status_code=status, media_type="application/json", headers=headers)


def error_response(err: ServiceError) -> Response:
    return Response(
        body(err.code, err.detail, **err.extra),
        status_code=err.status,
        media_type="application/json",
        headers=err.headers or None,
    )


def install_handlers(app: FastAPI) -> None:
    """Every error a route raises answers JSON ``{"error", "detail"}``."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        return error_response(exc)

    @app.exception_handler(GraphCacheError)
    async def _library_error(request: Request, exc: GraphCacheError) -> Response:
        return error_response(from_library(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        if any(tuple(e.get("loc", ()))[:2] == ("path", "key") for e in exc.errors()):
            return error_response(ServiceError(400, "invalid_key", "a key is 64 lowercase hex characters"))
        errors = list(exc.errors())
        bad = next((e for e in errors if e.get("type") == "json_invalid"), None)
        why = "" if bad is None else (bad.get("ctx") or {}).get("error", "")
        raw = request.scope.get(RAW_BODY)
        if bad is not None and isinstance(raw, bytes):
            # The same words as the layers in front of FastAPI (service.intake
            # keeps the body as it came: FastAPI's has been decoded).
            why = _not_json(raw) or why
        if bad is None and isinstance(exc.body, (bytes, bytearray)) and exc.body:
            # Sent under another Content-Type, the body reached validation as
            # bytes; what is not JSON is bad_json whatever the header said.
            why = _not_json(bytes(exc.body))
        if bad is not None or why:
            return error_response(bad_json(why))
        ctype = request.headers.get("content-type") or "none"
        if isinstance(exc.body, (bytes, bytearray)) and exc.body and "json" not in ctype:
            # JSON under another Content-Type: FastAPI does not read it, and
            # "must be a JSON object" would be wrong about a body that is one.
            return error_response(
                ServiceError(
                    422,
                    "invalid_request",
                    f"the body is JSON but was sent with Content-Type: {ctype}: "
                    "send it with Content-Type: application/json",
                )
            )
        return error_response(ServiceError(422, "invalid_request", "; ".join(_problem(e) for e in errors)))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        detail = str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}: the API is listed at /docs"
        if exc.status_code == 405:
            allowed = _allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            detail = f"{request.method} is not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
        return error_response(ServiceError(exc.status_code, code, detail, headers))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(from_library(exc))


def _not_json(data: bytes) -> str:
    """Why ``data`` is not JSON ('' when it is)."""
    return json_problem(data) or ""


MAX_JSON_DEPTH = 32
RAW_BODY = "graphcache.body"  # scope key: a request's body as service.intake read it


def json_problem(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """What is wrong with ``data`` as a JSON body (None: nothing): its
    encoding, its syntax, numbers Python will not convert, or nesting deeper
    than ``max_depth``. Never raises."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8: byte {exc.start} is 0x{data[exc.start]:02x}"
    try:
        value = json.loads(text)
    except RecursionError:
        return f"nested too deep (more than {max_depth} levels)"
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except ValueError as exc:
        return str(exc)
    if _depth(value, max_depth) > max_depth:
        return f"nested too deep (more than {max_depth} levels)"
    return None


def _depth(value: Any, stop: int) -> int:
    """Nesting depth of a parsed value (iterative; stops past ``stop``)."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        level += 1
        if level > deepest:
            deepest = level
            if deepest > stop:
                return deepest
        todo.extend((child, level) for child in item if isinstance(child, (dict, list)))
    return deepest


def bad_json(problem: str) -> ServiceError:
    """The 400 for a body that is not JSON, saying why."""
    return ServiceError(
        400,
        "bad_json",
        f"body is not JSON ({problem}): send a JSON object with Content-Type: application/json; "
        "see /docs for this route's fields",
    )


def _problem(error: Any) -> str:
    """One validation problem as 'field: what to do' (pydantic's own words
    name a regex or an internal type where a person needs the form)."""
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]
    field = ".".join(loc) or "body"
    kind = error.get("type", "")
    if kind in ("model_attributes_type", "dict_type") and not loc:
        return "body must be a JSON object (Content-Type: application/json); see /docs for this route's fields"
    if kind == "string_pattern_mismatch" and loc and loc[-1] == "target":
        return f"{field}: expected {TARGET_FORM}"
    if kind == "string_pattern_mismatch" and loc and loc[-1] in ("key", "cursor"):
        return f"{field}: a key is 64 lowercase hex characters"
    if kind == "extra_forbidden":
        return f"{field}: not a field of this request; see /docs for the fields it takes"
    if kind == "missing":
        return f"{field}: required"
    return f"{field}: {error.get('msg')}"


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route accepts at this path (several routes share one)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)
