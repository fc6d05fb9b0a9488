"""Request and response bodies, and the OpenAPI descriptions shared by routes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from graphcache.spec import GraphSpec
from graphcache.target import PATTERN as TARGET_RE

KEY_RE = r"^[0-9a-f]{64}$"
KeyPath = Annotated[str, PathParam(description="cache key: 64 lowercase hex characters", pattern=KEY_RE)]
SPEC_FIELD = Field(description="GraphSpec fields", json_schema_extra=GraphSpec.json_schema())
TARGET_FIELD = Field(description="target text, e.g. h200-sm90-mp132-cudnn9.28.0-fe1.32.0", pattern=TARGET_RE)


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
    target: str | None
    removed: list[str]
    dry_run: bool
    unsupported: bool = False


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
    writable: bool = Field(description="whether an upload would be stored now (false: the disk is full)")
    reason: str | None = Field(None, description="why the store is not writable; null when it is")


_WHY = {
    400: "invalid key, a body that is not JSON, or an upload that failed verification (error = the reason)",
    401: "a token is needed: Authorization: Bearer TOKEN",
    403: "the token given does not allow this",
    404: "no such artifact",
    408: "the upload was not received within GRAPHCACHE_UPLOAD_TIMEOUT",
    409: "artifact built for another target",
    413: "a body over its route's limit (an upload above GRAPHCACHE_MAX_UPLOAD), or a manifest whose check costs "
    "more than GRAPHCACHE_MANIFEST_SECONDS",
    429: "this client has spent its share of the server's time on manifests (GRAPHCACHE_CLIENT_SECONDS); "
    "Retry-After says when to retry",
    422: "invalid request body or parameters (detail names the field), or a spec cuDNN does not support here",
    500: "the build failed on this host (driver, NVRTC, memory, a plan that failed its checks); nothing was stored",
    501: "the store cannot do this",
    503: "the store (or, for builds, a GPU) is unavailable",
    507: "the store is out of space (detail: how much it holds, what to free); reads still work",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for error responses, all with the ErrorBody shape."""
    return {code: {"model": ErrorBody, "description": _WHY[code]} for code in codes}


ARTIFACT_HEADERS = {
    "ETag": {"description": "quoted payload sha256", "schema": {"type": "string"}},
    "Content-Length": {"description": "envelope size in bytes", "schema": {"type": "integer"}},
}
OCTET_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
