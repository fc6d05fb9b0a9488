"""HttpStore: a worker's client of the graphcache service, as a Store."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from graphcache.artifact import Artifact
from graphcache.errors import CorruptArtifact, StoreError, StoreUnavailable

log = logging.getLogger(__name__)


class HttpStore:
    """The service's artifact API as a Store, with timeouts always set.

    ``get`` verifies everything it downloads (envelope digest, and the key
    recomputed from the header) and returns None for a corrupt answer, so a
    worker never deserializes unverified bytes. When the service is down or
    slow, calls raise StoreUnavailable within ``timeout`` and, for
    ``retry_after`` seconds after that, at once (no worker waits on a dead
    server twice).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 5.0,
        *,
        retry_after: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry_after = retry_after
        headers = {"user-agent": "graphcache-httpstore"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
            transport=transport,
        )
        self._down_until = 0.0
        self._lock = threading.Lock()
        self.errors = 0
        self.corrupt = 0

    # -- transport ----------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if time.monotonic() < self._down_until:
            raise StoreUnavailable(f"{self.url} failed recently; retrying after {self.retry_after:.0f}s")
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.TransportError as exc:  # connect errors, timeouts, resets
            with self._lock:
                self.errors += 1
                self._down_until = time.monotonic() + self.retry_after
            # No log line here: the exception says it, and callers that carry
            # on without the service (TieredStore, GraphCache) log their own
            # warning; a CLI user gets one error line, not a warning and then it.
            raise StoreUnavailable(f"{self.url} did not answer: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            with self._lock:
                self.errors += 1
            raise StoreUnavailable(f"{self.url} answered {response.status_code}: {_detail(response)}")
        if response.status_code in (401, 403):
            raise StoreError(f"{self.url} refused the request ({response.status_code}): {_detail(response)}")
        return response

    # -- Store --------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """Verified artifact bytes, or None when absent or corrupt in transit."""
        response = self._request("GET", f"/v1/artifacts/{key}")
        if response.status_code == 404:
            return None
        _expect(response, 200)
        data = response.content
        try:
            Artifact.decode(data, expected_key=key)
        except CorruptArtifact as exc:
            with self._lock:
                self.corrupt += 1
            log.warning("corrupt artifact %s from %s refused: %s", key[:12], self.url, exc)
            return None
        return data

    def put(self, key: str, data: bytes) -> bool:
        response = self._request(
            "PUT",
            f"/v1/artifacts/{key}",
            content=data,
            headers={"content-type": "application/octet-stream"},
        )
        if response.status_code in (200, 201):
            return response.status_code == 201
        if response.status_code == 400:
            raise CorruptArtifact(f"server refused upload: {_detail(response)}", _code(response))
        raise StoreError(f"upload to {self.url} failed ({response.status_code}): {_detail(response)}")

    def exists(self, key: str) -> bool:
        response = self._request("HEAD", f"/v1/artifacts/{key}")
        return response.status_code == 200

    def delete(self, key: str) -> bool:
        response = self._request("DELETE", f"/v1/artifacts/{key}")
        if response.status_code == 404:
            return False
        _expect(response, 204)
        return True

    def keys(self) -> Iterator[str]:
        for item in self._pages({"limit": 1000, "keys_only": "true"}):
            yield item["key"]

    def headers(self, target: str | None = None) -> Iterator[dict[str, Any]]:
        """Every stored header (optionally of one target), page by page."""
        for item in self.items(target):
            if "header" in item:
                yield item["header"]

    def items(self, target: str | None = None) -> Iterator[dict[str, Any]]:
        """The listing route's items in key order: ``{key, size, header}``, or
        ``{key, corrupt}`` for an entry whose header the server cannot read.
        Headers only: no artifact is downloaded."""
        yield from self._pages({"limit": 200, **({"target": target} if target else {})})

    def _pages(self, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            response = self._request(
                "GET", "/v1/artifacts", params={**params, **({"cursor": cursor} if cursor else {})}
            )
            _expect(response, 200)
            page = response.json()
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def pin(self, key: str) -> bool:
        """Exempt an entry from eviction on the server (write token)."""
        response = self._request("POST", f"/v1/artifacts/{key}/pin")
        if response.status_code == 404:
            return False
        _expect(response, 200)
        return True

    def unpin(self, key: str) -> bool:
        """Make an entry evictable again on the server (write token)."""
        response = self._request("DELETE", f"/v1/artifacts/{key}/pin")
        if response.status_code == 404:
            return False
        _expect(response, 200)
        return True

    def purge(self, target: str | None, *, unsupported: bool = False, dry_run: bool = False) -> list[str]:
        """Remove every entry of ``target`` on the server, or with
        ``unsupported`` only its negative entries (of every target when
        ``target`` is None). Needs an admin token."""
        params = {"dry_run": str(dry_run).lower(), "unsupported": str(unsupported).lower()}
        if target is not None:
            params["target"] = target
        response = self._request("POST", "/v1/purge", params=params)
        _expect(response, 200)
        return list(response.json()["removed"])

    def resolve(self, spec: dict[str, Any], target: str) -> dict[str, Any]:
        """POST /v1/resolve: ``{key, present, ...}``."""
        response = self._request("POST", "/v1/resolve", json={"spec": spec, "target": target})
        _expect(response, 200)
        return dict(response.json())

    def ping(self) -> None:
        _expect(self._request("GET", "/healthz"), 200)

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"HttpStore({self.url!r})"


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text[:200]))
    except ValueError:
        return response.text[:200]


def _code(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", "corrupt"))
    except ValueError:
        return "corrupt"


def _expect(response: httpx.Response, status: int) -> None:
    if response.status_code != status:
        raise StoreError(
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code}: {_detail(response)}"
        )
