"""The FastAPI app over a Store (and a compiler where the host has a GPU).

Routes parse, call the library, and let ``service.errors`` map library errors
to status codes. Artifact GET/HEAD, the hot path, is answered by a small ASGI
layer in front of FastAPI (``ArtifactFastPath``): reading through the open
file handle and skipping FastAPI's routing and response machinery made it
several times faster (docs/benchmarks.md). FastAPI still declares those
routes, so they appear in the OpenAPI schema and serve if the layer is off.
"""

from __future__ import annotations

import hmac
import inspect
import json
import logging
import os
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import FastAPI, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from graphcache.artifact import Artifact
from graphcache.cache import GraphCache
from graphcache.errors import CorruptArtifact, GraphCacheError, NoGpu, StoreError
from graphcache.key import is_key, key_for
from graphcache.settings import Settings
from graphcache.spec import GraphSpec
from graphcache.stores import Store, open_store, stored_header
from graphcache.stores.disk import read_all
from graphcache.target import Target
from service.errors import ServiceError, body, from_library
from service.metrics import Metrics

log = logging.getLogger("graphcache.service")

ARTIFACTS = "/v1/artifacts/"
OCTET = b"application/octet-stream"
JSON = b"application/json"
VERIFIED_MEMO = 100_000
HOT_ITEM_MAX = 1024 * 1024
STREAM_MIN = 1024 * 1024  # verified entries from this size stream from the open file
STREAM_CHUNK = 256 * 1024
MAX_HEADER_BYTES = 16 * 1024
SUBRESOURCE = re.compile(r"[0-9a-f]{64}/[a-z]+$")  # used with match(path, pos): no ^


# -- auth -------------------------------------------------------------------------


class Auth:
    """Bearer tokens, compared in constant time. Unset read tokens: reads are
    open. Unset write tokens: writes are open (a warning at start). Admin
    actions need an admin token, or a write token when none is set."""

    def __init__(self, settings: Settings) -> None:
        self.admin = tuple(t.encode() for t in settings.admin_tokens)
        self.write = tuple(t.encode() for t in settings.write_tokens) + self.admin
        self.read = tuple(t.encode() for t in settings.read_tokens) + self.write
        self.read_open = not settings.read_tokens
        self.write_open = not settings.write_tokens and not settings.admin_tokens
        if self.write_open:
            log.warning("GRAPHCACHE_WRITE_TOKENS is unset: anyone who reaches this server may upload")

    def check(self, authorization: bytes | None, need: str) -> None:
        if need == "read" and self.read_open:
            return
        if need == "write" and self.write_open:
            return
        if need == "admin" and not self.admin:
            need = "write"
            if self.write_open:
                return
        allowed = {"read": self.read, "write": self.write, "admin": self.admin}[need]
        if not authorization:
            raise ServiceError(
                401,
                "unauthorized",
                f"this route needs a {need} token: send 'Authorization: Bearer TOKEN'",
                {"www-authenticate": "Bearer"},
            )
        scheme, _, token = authorization.partition(b" ")
        token = token.strip()
        ok = False
        for candidate in allowed:  # no early exit: constant time in the match position
            ok |= hmac.compare_digest(candidate, token)
        if scheme.lower() != b"bearer" or not ok:
            raise ServiceError(403, "forbidden", f"the token given is not a {need} token")


# -- reading verified artifacts -----------------------------------------------------


@dataclass(frozen=True)
class Served:
    """A verified entry: its bytes, or an open file to stream them from."""

    data: bytes | None
    etag: str
    size: int
    handle: Any = None


@dataclass(frozen=True)
class Unverified:
    data: bytes
    identity: tuple[int, ...] | None


class ArtifactReader:
    """Reads entries and verifies them before they are served.

    Verification hashes the payload (about 3 ms per 4 MiB here). For
    DiskStore entries kept in files, the reader remembers the file identity
    (inode, size, mtime, ctime) it verified: any rewrite of the file changes
    it, so a flipped or truncated file is verified again and never served.
    Verified large entries are streamed from the open file in chunks, so 64
    concurrent 4 MiB downloads do not hold 256 MiB; small ones are kept in
    memory (``hot_bytes``) while their file is unchanged. Corrupt entries are
    moved to a quarantine folder and counted.
    """

    def __init__(self, store: Store, metrics: Metrics, quarantine: Path | None, hot_bytes: int = 0) -> None:
        self.store = store
        self.metrics = metrics
        self.quarantine = quarantine
        self._open = getattr(store, "open", None)
        self._stat = getattr(store, "stat", None)
        self._memo: OrderedDict[str, tuple[tuple[int, ...], str]] = OrderedDict()
        self.hot_bytes = hot_bytes
        self._hot: OrderedDict[str, tuple[tuple[int, ...] | None, Served]] = OrderedDict()
        self._hot_size = 0

    def lookup(self, key: str) -> Served | Unverified | None:
        """Fast part, safe on the event loop: a Served entry when these exact
        bytes were verified before, else the bytes still to verify."""
        hot = self._hot.get(key)
        if hot is not None and self._stat is not None:
            if self._stat(key) == hot[0]:
                return hot[1]
            self._drop_hot(key)
            hot = None
        if self._open is None:
            # Redis and other byte stores: no file identity, so the bytes are
            # fetched every time; a hot copy lets an equal fetch skip the hash
            # (comparing is ~10x cheaper than SHA-256).
            data = self.store.get(key)
            if data is None:
                self._drop_hot(key)
                return None
            if hot is not None and hot[1].data == data:
                return hot[1]
            return Unverified(data, None)
        opened = self._open(key)
        if opened is None:
            return None
        value, identity = opened
        if identity is None:
            return Unverified(value, None)
        memo = self._memo.get(key)
        size = identity[1]
        if memo is not None and memo[0] == identity and size >= STREAM_MIN:
            return Served(None, memo[1], size, handle=value)
        with value:
            data = read_all(value, size)
        if memo is not None and memo[0] == identity:
            served = Served(data, memo[1], size)
            self._keep_hot(key, identity, served)
            return served
        return Unverified(data, identity)

    def verify(self, key: str, entry: Unverified) -> Served | None:
        """Slow part (hashing): the verified entry, or None after quarantining it."""
        try:
            artifact = Artifact.decode(entry.data, expected_key=key)
        except CorruptArtifact as exc:
            self._quarantine(key, entry.data, exc)
            return None
        served = Served(entry.data, artifact.payload_sha256, len(entry.data))
        if entry.identity is not None:
            self._memo[key] = (entry.identity, served.etag)
            self._memo.move_to_end(key)
            while len(self._memo) > VERIFIED_MEMO:
                self._memo.popitem(last=False)
            self.metrics.verified_cache.set(len(self._memo))
        if entry.identity is not None or self._open is None:
            self._keep_hot(key, entry.identity, served)
        return served

    def forget(self, key: str) -> None:
        self._memo.pop(key, None)
        self._drop_hot(key)

    def _keep_hot(self, key: str, identity: tuple[int, ...] | None, served: Served) -> None:
        """Keep a small verified entry; it is served again only while its file
        identity (DiskStore) or its bytes (other stores) are unchanged."""
        size = served.size
        if served.data is None or size > min(HOT_ITEM_MAX, self.hot_bytes):
            return
        if identity is None and self._open is not None:
            return  # an entry inline in DiskStore's index: no identity to check, verify each time
        self._drop_hot(key)
        self._hot[key] = (identity, served)
        self._hot_size += size
        while self._hot_size > self.hot_bytes:
            _, (_, old) = self._hot.popitem(last=False)
            self._hot_size -= old.size

    def _drop_hot(self, key: str) -> None:
        old = self._hot.pop(key, None)
        if old is not None:
            self._hot_size -= old[1].size

    def _quarantine(self, key: str, data: bytes, exc: CorruptArtifact) -> None:
        log.error("stored entry %s failed verification (%s): quarantined", key, exc)
        self.metrics.quarantined.labels(exc.reason).inc()
        self.forget(key)
        if self.quarantine is not None:
            try:
                self.quarantine.mkdir(parents=True, exist_ok=True)
                (self.quarantine / f"{key}.{int(time.time())}.{exc.reason}").write_bytes(data)
            except OSError as err:
                log.error("could not write quarantine copy of %s: %s", key, err)
        try:
            self.store.delete(key)
        except StoreError as err:
            log.error("could not remove corrupt entry %s: %s", key, err)


# -- state shared by routes and the fast path -------------------------------------------


class State:
    def __init__(self, settings: Settings, store: Store, compiler: Any) -> None:
        self.settings = settings
        self.store = store
        self.metrics = Metrics()
        self.auth = Auth(settings)
        quarantine = None
        if hasattr(store, "path"):
            quarantine = Path(store.path) / "quarantine"
        self.reader = ArtifactReader(store, self.metrics, quarantine, settings.hot_cache_bytes)
        self._compiler = compiler
        self._compiler_error: str | None = None
        self._cache: GraphCache | None = None
        self.started = time.time()

    def graph_cache(self) -> GraphCache:
        """The build path's controller; detects a GPU on first use (imports torch)."""
        if self._cache is not None:
            return self._cache
        if self._compiler is None:
            if self._compiler_error is None and not self.settings.build:
                self._compiler_error = "building is disabled on this server (GRAPHCACHE_BUILD=0)"
            if self._compiler_error is None:
                try:
                    from graphcache.compilers.cudnn import CudnnCompiler

                    compiler = CudnnCompiler()
                    compiler.target()
                    self._compiler = compiler
                except GraphCacheError as exc:
                    self._compiler_error = f"this server cannot build: {exc}"
            if self._compiler is None:
                raise NoGpu(self._compiler_error or "no compiler")
        self._cache = GraphCache(self.store, self._compiler, signing_key=self.settings.signing_key)
        return self._cache

    async def artifact(
        self, method: str, key: str, headers: dict[bytes, bytes]
    ) -> tuple[int, list[tuple[bytes, bytes]], Served | None]:
        """Status, headers and the entry (None: no body) for GET/HEAD of one
        artifact. When the entry has an open handle the caller streams from
        it and must close it."""
        self.auth.check(headers.get(b"authorization"), "read")
        if not is_key(key):
            raise ServiceError(
                400, "invalid_key", "a key is 64 lowercase hex characters (sha256 of the spec and target)"
            )
        try:
            found = self.reader.lookup(key)
        except (StoreError, OSError) as exc:
            self.metrics.store_errors.inc()
            raise ServiceError(503, "store_unavailable", f"the store did not answer: {exc}") from exc
        served = None
        if isinstance(found, Unverified):
            served = await anyio.to_thread.run_sync(self.reader.verify, key, found)
        elif found is not None:
            served = found
        if served is None:
            self.metrics.misses.inc()
            raise ServiceError(404, "not_found", f"no artifact stored for key {key}")
        self.metrics.hits.inc()
        etag = f'"{served.etag}"'.encode()
        not_modified = _etag_matches(headers.get(b"if-none-match"), etag)
        if (not_modified or method == "HEAD") and served.handle is not None:
            served.handle.close()
        if not_modified:
            return 304, [(b"etag", etag)], None
        out = [
            (b"content-type", OCTET),
            (b"content-length", str(served.size).encode()),
            (b"etag", etag),
            (b"cache-control", b"no-cache"),
        ]
        if method == "HEAD":
            return 200, out, None
        self.metrics.bytes_served.inc(served.size)
        return 200, out, served


def _etag_matches(header: bytes | None, etag: bytes) -> bool:
    if not header:
        return False
    for part in header.split(b","):
        tag = part.strip()
        if tag == b"*" or tag.removeprefix(b"W/") == etag:
            return True
    return False


# -- ASGI layers ------------------------------------------------------------------------


class ArtifactFastPath:
    """Answers GET/HEAD /v1/artifacts/{key} before FastAPI's middleware and
    routing (about 40 us a request here), counting its own request metrics."""

    def __init__(self, state: State) -> None:
        self.state = state
        self._counters: dict[tuple[str, int], Any] = {}

    @staticmethod
    def handles(scope: dict[str, Any]) -> bool:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            return False
        path = scope["path"]
        # /v1/artifacts/{key}/pin and the like belong to FastAPI (405 for GET);
        # any other slash in a key (../, an encoded %2F) is a bad key: 400 here.
        return path.startswith(ARTIFACTS) and not SUBRESOURCE.match(path, len(ARTIFACTS))

    async def serve(self, scope: dict[str, Any], send: Any) -> None:
        method = scope["method"]
        key = scope["path"][len(ARTIFACTS) :]
        try:
            status, out, served = await self.state.artifact(method, key, dict(scope["headers"]))
            payload = b"" if served is None else served.data
        except Exception as exc:  # noqa: BLE001 - every error becomes JSON, never a crash
            err = from_library(exc)
            if err.status >= 500 and not isinstance(exc, ServiceError):
                log.exception("GET %s failed", key[:80])
            data = body(err.code, err.detail)
            status, served = err.status, None
            out = [(b"content-type", JSON), (b"content-length", str(len(data)).encode())]
            out += [(k.encode(), v.encode()) for k, v in err.headers.items()]
            payload = data if method == "GET" else b""
        counter = self._counters.get((method, status))
        if counter is None:
            counter = self.state.metrics.requests.labels("/v1/artifacts/{key}", method, str(status))
            self._counters[(method, status)] = counter
        counter.inc()
        await send({"type": "http.response.start", "status": status, "headers": out})
        if served is None or served.handle is None:
            await send({"type": "http.response.body", "body": payload})
            return
        with served.handle as fh:
            await stream_file(fh, served.size, send)


async def send_error(send: Any, status: int, code: str, detail: str) -> None:
    data = body(code, detail)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", JSON), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def stream_file(fh: Any, size: int, send: Any) -> None:
    """Send an open file in chunks; each send waits for the socket to drain,
    so memory per download stays near one chunk."""
    sent = 0
    while sent < size:
        chunk = os.read(fh.fileno(), min(STREAM_CHUNK, size - sent))
        if not chunk:
            raise OSError(f"file ended at {sent} of {size} bytes")
        sent += len(chunk)
        await send({"type": "http.response.body", "body": chunk, "more_body": sent < size})


class GraphcacheApp(FastAPI):
    """FastAPI with the artifact fast path in front of everything."""

    fast_path: ArtifactFastPath | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if sum(len(k) + len(v) for k, v in scope["headers"]) > MAX_HEADER_BYTES:
                # httptools sets no limit of its own on a request's head.
                await send_error(send, 431, "headers_too_large", f"request headers exceed {MAX_HEADER_BYTES} bytes")
                return
            path = scope["path"]
            if (
                path.startswith(ARTIFACTS)
                and "/" in path[len(ARTIFACTS) :]
                and not SUBRESOURCE.match(path, len(ARTIFACTS))
            ):
                # A decoded %2F or ../ in a key, whatever the method.
                await send_error(send, 400, "invalid_key", "a key is 64 lowercase hex characters")
                return
        fast = self.fast_path
        if fast is not None and fast.handles(scope):
            await fast.serve(scope, send)
            return
        await super().__call__(scope, receive, send)


KNOWN_ROUTES = (
    "/v1/artifacts",
    "/v1/purge",
    "/v1/resolve",
    "/v1/build",
    "/v1/stats",
    "/healthz",
    "/metrics",
    "/docs",
    "/openapi.json",
    "/docs/oauth2-redirect",
    "/redoc",
)


class RequestMetrics:
    """Counts every request by route template, method and status."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._children: dict[tuple[str, str, int], Any] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = "/v1/artifacts/{key}" if path.startswith(ARTIFACTS) else path if path in KNOWN_ROUTES else "other"
        status = 500

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            labels = (route, scope["method"], status)
            child = self._children.get(labels)
            if child is None:
                child = self._children[labels] = self.metrics.requests.labels(route, scope["method"], str(status))
            child.inc()


# -- request bodies ---------------------------------------------------------------------


KEY_RE = r"^[0-9a-f]{64}$"
TARGET_RE = r"^[a-z0-9_]+-sm[0-9]{2,3}-cudnn[0-9]+(\.[0-9]+){1,3}-fe[0-9]+(\.[0-9]+){1,3}$"
KeyPath = Annotated[str, PathParam(description="cache key: 64 lowercase hex characters", pattern=KEY_RE)]
SPEC_FIELD = Field(description="GraphSpec fields", json_schema_extra=GraphSpec.json_schema())
TARGET_FIELD = Field(description="target text, e.g. h200-sm90-cudnn9.28.0-fe1.32.0", pattern=TARGET_RE)


class ResolveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any] = SPEC_FIELD
    target: str = TARGET_FIELD


class BuildRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any] = SPEC_FIELD


class ErrorBody(BaseModel):
    error: str = Field(description="short code, e.g. invalid_key, digest_mismatch, unauthorized")
    detail: str = Field(description="what went wrong and what to do")


class UploadResult(BaseModel):
    key: str
    created: bool
    size: int
    target: str
    spec: str


class PinResult(BaseModel):
    key: str
    pinned: bool


class PurgeResult(BaseModel):
    target: str
    removed: list[str]
    dry_run: bool


class ArtifactPage(BaseModel):
    items: list[dict[str, Any]]
    next_cursor: str | None


class ResolveResult(BaseModel):
    key: str
    present: bool
    target: str
    spec: dict[str, Any]


class BuildResult(BaseModel):
    key: str
    built: bool
    target: str


class Health(BaseModel):
    status: str
    store: str


_WHY = {
    400: "invalid key, a body that is not JSON, or an upload that failed verification (error = the reason)",
    401: "a token is needed: Authorization: Bearer TOKEN",
    403: "the token given does not allow this",
    404: "no such artifact",
    408: "the upload was not received within GRAPHCACHE_UPLOAD_TIMEOUT",
    409: "artifact built for another target",
    413: "upload above GRAPHCACHE_MAX_UPLOAD",
    422: "invalid request body or parameters (detail names the field)",
    501: "the store cannot do this",
    503: "the store (or, for builds, a GPU) is unavailable",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error responses, all with the ErrorBody shape."""
    return {code: {"model": ErrorBody, "description": _WHY[code]} for code in codes}


_ARTIFACT_HEADERS = {
    "ETag": {"description": "quoted payload sha256", "schema": {"type": "string"}},
    "Content-Length": {"description": "envelope size in bytes", "schema": {"type": "integer"}},
}
_OCTET_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _json(status: int, data: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(data), status_code=status, media_type="application/json", headers=headers)


def _error(err: ServiceError) -> Response:
    return Response(
        body(err.code, err.detail), status_code=err.status, media_type="application/json", headers=err.headers or None
    )


# -- the app -----------------------------------------------------------------------------


def create_app(settings: Settings | None = None, *, store: Store | None = None, compiler: Any = None) -> GraphcacheApp:
    """The service over ``store`` (default: the one ``settings`` names).

    ``compiler`` builds for POST /v1/build; by default a CudnnCompiler is
    tried on first use, and the route answers 503 with the reason where this
    host has no GPU.
    """
    settings = settings or Settings.from_env()
    store = store if store is not None else open_store(settings)
    state = State(settings, store, compiler)
    options: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        # FastAPI's native OpenTelemetry hook looks up the environment on
        # every request (~30 us); we export Prometheus metrics instead.
        options["telemetry"] = {"tracing": False, "metrics": False, "logs": False}
    app = GraphcacheApp(
        title="graphcache",
        version="0.1.0",
        description="Prebuilt cuDNN attention graphs, keyed by spec and target, verified end to end.",
        **options,
    )
    app.state.gc = state

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        return _error(exc)

    @app.exception_handler(GraphCacheError)
    async def _library_error(request: Request, exc: GraphCacheError) -> Response:
        return _error(from_library(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        if any(tuple(e.get("loc", ()))[:2] == ("path", "key") for e in exc.errors()):
            return _error(ServiceError(400, "invalid_key", "a key is 64 lowercase hex characters"))
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in exc.errors()
        )
        return _error(ServiceError(422, "invalid_request", problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return _error(ServiceError(exc.status_code, code, str(exc.detail), headers))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(from_library(exc))

    def auth(request: Request, need: str) -> None:
        value = request.headers.get("authorization")
        state.auth.check(value.encode() if value is not None else None, need)

    @app.get(
        "/v1/artifacts/{key}",
        response_class=Response,
        summary="Download an artifact (verified before it is served)",
        responses={
            200: {
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                "description": "the artifact envelope",
                "headers": _ARTIFACT_HEADERS,
            },
            304: {"description": "If-None-Match matched the ETag"},
            **errors(400, 401, 403, 404, 503),
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
            200: {"description": "stored", "headers": _ARTIFACT_HEADERS},
            304: {"description": "not modified"},
            **errors(400, 401, 403, 404, 503),
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
            **errors(400, 401, 403, 408, 413, 503),
        },
        openapi_extra=_OCTET_BODY,
    )
    async def put_artifact(key: KeyPath, request: Request) -> Response:
        auth(request, "write")
        try:
            with anyio.fail_after(settings.upload_timeout):
                data = await _read_limited(request, settings.max_upload, state)
        except TimeoutError:
            state.metrics.rejected.labels("timeout").inc()
            raise ServiceError(
                408, "timeout", f"the upload took longer than {settings.upload_timeout:g}s (GRAPHCACHE_UPLOAD_TIMEOUT)"
            ) from None
        try:
            artifact = await anyio.to_thread.run_sync(_verify_upload, data, key, settings.signing_key)
        except CorruptArtifact as exc:
            state.metrics.rejected.labels(exc.reason).inc()
            raise ServiceError(400, exc.reason, f"upload refused: {exc}") from exc
        try:
            created = await anyio.to_thread.run_sync(store.put, key, data)
        except StoreError as exc:
            state.metrics.store_errors.inc()
            raise ServiceError(503, "store_unavailable", str(exc)) from exc
        state.reader.forget(key)
        state.metrics.uploads.labels("created" if created else "identical").inc()
        return _json(
            201 if created else 200,
            {
                "key": key,
                "created": created,
                "size": len(data),
                "target": str(artifact.target),
                "spec": artifact.spec.summary(),
            },
        )

    @app.delete(
        "/v1/artifacts/{key}",
        status_code=204,
        response_class=Response,
        summary="Remove an artifact (admin token)",
        responses={204: {"description": "removed"}, **errors(400, 401, 403, 404, 503)},
    )
    async def delete_artifact(key: KeyPath, request: Request) -> Response:
        auth(request, "admin")
        removed = await anyio.to_thread.run_sync(store.delete, key)
        state.reader.forget(key)
        if not removed:
            raise ServiceError(404, "not_found", f"no artifact stored for key {key}")
        return Response(status_code=204)

    @app.post(
        "/v1/artifacts/{key}/pin",
        summary="Exempt an artifact from eviction (write token)",
        response_model=PinResult,
        responses=errors(400, 401, 403, 404, 501, 503),
    )
    async def pin_artifact(key: KeyPath, request: Request) -> Response:
        auth(request, "write")
        pin = getattr(store, "pin", None)
        if pin is None:
            raise ServiceError(501, "not_supported", f"{store!r} cannot pin entries")
        if not await anyio.to_thread.run_sync(pin, key):
            raise ServiceError(404, "not_found", f"no artifact stored for key {key}")
        return _json(200, {"key": key, "pinned": True})

    @app.post(
        "/v1/purge",
        summary="Remove every artifact of a retired target (admin token)",
        response_model=PurgeResult,
        responses=errors(401, 403, 422, 503),
    )
    async def purge(
        request: Request,
        target: Annotated[str, Query(pattern=TARGET_RE, description="the retired target's text form")],
        dry_run: bool = False,
    ) -> Response:
        auth(request, "admin")
        from graphcache.ops import purge as purge_entries

        tgt = Target.parse(target)
        removed = await anyio.to_thread.run_sync(lambda: purge_entries(store, tgt, dry_run=dry_run))
        for key in removed:
            state.reader.forget(key)
        return _json(200, {"target": str(tgt), "removed": removed, "dry_run": dry_run})

    @app.get(
        "/v1/artifacts",
        summary="List artifacts (headers, or keys only), paged by key",
        response_model=ArtifactPage,
        responses=errors(401, 403, 422, 503),
    )
    async def list_artifacts(
        request: Request,
        target: Annotated[str | None, Query(pattern=TARGET_RE, description="only this target")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: Annotated[str | None, Query(pattern=KEY_RE, description="next_cursor of the previous page")] = None,
        keys_only: bool = False,
    ) -> Response:
        auth(request, "read")
        items, next_cursor = await anyio.to_thread.run_sync(_page, store, target, limit, cursor, keys_only)
        return _json(200, {"items": items, "next_cursor": next_cursor})

    @app.post(
        "/v1/resolve",
        summary="The key of a spec on a target, and whether it is stored",
        response_model=ResolveResult,
        responses=errors(400, 401, 403, 422, 503),
    )
    async def resolve(request: Request, payload: ResolveRequest) -> Response:
        auth(request, "read")
        spec = GraphSpec.from_dict(payload.spec)
        target = Target.parse(payload.target)
        key = key_for(spec, target)
        present = await anyio.to_thread.run_sync(store.exists, key)
        return _json(200, {"key": key, "present": present, "target": str(target), "spec": spec.to_dict()})

    @app.post(
        "/v1/build",
        summary="Build a spec on this host's GPU and store it (write token)",
        response_model=BuildResult,
        responses=errors(400, 401, 403, 409, 422, 503),
    )
    async def build(request: Request, payload: BuildRequest) -> Response:
        auth(request, "write")
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
        return _json(200, {"key": artifact.key, "built": built, "target": str(artifact.target)})

    @app.get("/healthz", summary="Whether the store answers", response_model=Health, responses=errors(503))
    async def healthz() -> Response:
        try:
            with anyio.fail_after(5):
                await anyio.to_thread.run_sync(_ping, store)
        except (StoreError, OSError, TimeoutError) as exc:
            state.metrics.store_errors.inc()
            return _error(ServiceError(503, "store_unavailable", f"{store!r} did not answer: {exc}"))
        return _json(200, {"status": "ok", "store": repr(store)})

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
        return _json(
            200,
            {
                "store": repr(store),
                "uptime_seconds": round(time.time() - state.started, 1),
                "hits": value("graphcache_hits_total"),
                "misses": value("graphcache_misses_total"),
                "bytes_served": value("graphcache_bytes_served_total"),
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

    app.add_middleware(RequestMetrics, metrics=state.metrics)
    app.fast_path = ArtifactFastPath(state)
    return app


def create_app_from_env() -> GraphcacheApp:
    """uvicorn factory: ``uvicorn --factory service.app:create_app_from_env``."""
    return create_app(Settings.from_env())


# -- helpers -----------------------------------------------------------------------------


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route accepts at this path (several routes share one)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _raw_headers(request: Request) -> dict[bytes, bytes]:
    return dict(request.scope["headers"])


async def _read_limited(request: Request, limit: int, state: State) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ServiceError(400, "bad_request", "Content-Length must be a number")
        if int(declared) > limit:
            state.metrics.rejected.labels("too_large").inc()
            raise ServiceError(
                413,
                "too_large",
                f"upload of {declared} bytes exceeds the limit of {limit} bytes (GRAPHCACHE_MAX_UPLOAD)",
            )
    chunks = bytearray()
    async for chunk in request.stream():
        chunks += chunk
        if len(chunks) > limit:
            state.metrics.rejected.labels("too_large").inc()
            raise ServiceError(413, "too_large", f"upload exceeds the limit of {limit} bytes (GRAPHCACHE_MAX_UPLOAD)")
    return bytes(chunks)


def _verify_upload(data: bytes, key: str, signing_key: bytes | None) -> Artifact:
    """The server never trusts what it is sent: full decode, key recomputed,
    the path key matched, and the signature checked when signing is on."""
    artifact = Artifact.decode(data, expected_key=key)
    if signing_key:
        artifact.verify_signature(signing_key)
    return artifact


def _page(
    store: Store, target: str | None, limit: int, cursor: str | None, keys_only: bool = False
) -> tuple[list[dict[str, Any]], str | None]:
    keys = sorted(k for k in store.keys() if cursor is None or k > cursor)
    if keys_only and target is None:
        page = keys[:limit]
        return [{"key": k} for k in page], (page[-1] if len(keys) > limit else None)
    items: list[dict[str, Any]] = []
    last = None
    for key in keys:
        try:
            header = stored_header(store, key)
        except CorruptArtifact as exc:
            last = key
            items.append({"key": key, "corrupt": str(exc)})
        else:
            if header is None:
                continue
            last = key
            if target is not None and header.get("target_text") != target:
                continue
            items.append({"key": key} if keys_only else {"key": key, "size": header["payload_size"], "header": header})
        if len(items) >= limit:
            break
    more = last is not None and any(k > last for k in keys)
    return items, (last if more else None)


def _ping(store: Store) -> None:
    ping = getattr(store, "ping", None)
    if ping is not None:
        ping()
    else:
        store.exists("0" * 64)
