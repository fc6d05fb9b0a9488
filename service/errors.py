"""The one place where errors become status codes and JSON bodies."""

from __future__ import annotations

import json
from typing import Any

from graphcache.errors import (
    CorruptArtifact,
    GraphCacheError,
    NoGpu,
    NotFound,
    NotSerializable,
    SpecError,
    StoreError,
    TargetError,
    TargetMismatch,
    UnsupportedGpu,
    UnsupportedSpec,
)


class ServiceError(Exception):
    """An error with its HTTP status and short code."""

    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}


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
    if isinstance(exc, StoreError):
        return ServiceError(503, "store_unavailable", str(exc))
    if isinstance(exc, GraphCacheError):
        return ServiceError(400, "bad_request", str(exc))
    return ServiceError(500, "internal", f"internal error ({type(exc).__name__}); see the server log")


def body(code: str, detail: str, **extra: Any) -> bytes:
    return json.dumps({"error": code, "detail": detail, **extra}).encode()
