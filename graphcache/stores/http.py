"""HttpStore: a worker's client of the graphcache service, as a Store."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx

from graphcache.artifact import Artifact
from graphcache.batch import ENVELOPE, BatchParser
from graphcache.envelope_check import EnvelopeCheck
from graphcache.errors import (
    AnswerTooLarge,
    CorruptArtifact,
    StoreError,
    StoreFull,
    StoreLocationError,
    StoreUnavailable,
)
from graphcache.settings import Settings
from graphcache.stores import answers
from graphcache.stores.base import shown_url

log = logging.getLogger(__name__)
# The largest answer a client reads unless told otherwise: the largest
# artifact a server of the default settings stores (GRAPHCACHE_MAX_UPLOAD).
DEFAULT_MAX_ARTIFACT = Settings().max_artifact


class HttpStore:
    """The service's artifact API as a Store, with timeouts always set.

    ``get`` verifies everything it downloads (envelope digest, and the key
    recomputed from the header) and returns None for a corrupt answer, so a
    worker never deserializes unverified bytes. When the service is down or
    slow, calls raise StoreUnavailable within ``timeout`` and, for
    ``retry_after`` seconds after that, at once (no worker waits on a dead
    server twice).

    Nothing a server sends is read past ``max_artifact`` bytes (default
    GRAPHCACHE_MAX_ARTIFACT, else GRAPHCACHE_MAX_UPLOAD: 64 MiB), whatever
    its Content-Length says or omits: an artifact, each record of a batch,
    a listing page. An artifact is read no further than its own envelope
    declares (its header, read as it arrives), and bytes that are no
    envelope stop the read at once. Past a bound: AnswerTooLarge (a
    StoreUnavailable) saying how much was sent and what the bound is.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 5.0,
        *,
        retry_after: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        max_artifact: int | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise StoreLocationError(f"server URL {url!r} must start with http:// or https://, e.g. http://cache:8080")
        self.url = url.rstrip("/")
        self.shown = shown_url(self.url)  # what messages and repr show: no userinfo, no query values
        self.retry_after = retry_after
        self.max_artifact = max_artifact or DEFAULT_MAX_ARTIFACT
        # identity: what is counted against max_artifact is what arrives, never
        # a small compressed body that expands past it.
        headers = {"user-agent": "graphcache-httpstore", "accept-encoding": "identity"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._client = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
            transport=transport,
        )
        self._down_until = 0.0
        self._down_because = ""  # the failure that started the pause, which every call in it names
        self._lock = threading.Lock()
        self.errors = 0
        self.corrupt = 0

    # -- transport ----------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer, its body read within ``max_artifact`` bytes (an error
        answer's first ``ERROR_PREFIX`` bytes), checked as ``_checked`` does."""
        self._check_down()
        try:
            with self._client.stream(method, path, **kwargs) as response:
                return self._checked(self._read(response))
        except httpx.TransportError as exc:  # connect errors, timeouts, resets
            raise self._unavailable(exc) from exc

    def _read(self, response: httpx.Response) -> httpx.Response:
        """``response`` with its body read within ``max_artifact`` (``answers.read``)."""
        return answers.read(response, self.max_artifact, shown=self.shown, pause=self._pause)

    def _bounded(self, response: httpx.Response, limit: int, bound: str, check: EnvelopeCheck | None = None) -> bytes:
        """The body, never read past its bound (``answers.bounded``); past it, this server is paused."""
        return answers.bounded(response, limit, bound, check, shown=self.shown, pause=self._pause)

    def _check_down(self) -> None:
        left = self._down_until - time.monotonic()
        if left > 0:
            raise StoreUnavailable(
                f"{self.shown} did not answer ({self._down_because}); not asked again for another {left:.0f}s"
            )

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        with self._lock:
            self.errors += 1
            self._down_until = time.monotonic() + self.retry_after
            self._down_because = f"{type(exc).__name__}: {exc}"
        # No log line here: the exception says it, and callers that carry
        # on without the service (TieredStore, GraphCache) log their own
        # warning; a CLI user gets one error line, not a warning and then it.
        return StoreUnavailable(f"{self.shown} did not answer: {type(exc).__name__}: {exc}")

    def _pause(self, because: str) -> None:
        """Count a failure of the server and ask it nothing for ``retry_after`` seconds."""
        with self._lock:
            self.errors += 1
            self._down_until = time.monotonic() + self.retry_after
            self._down_because = because

    def _checked(self, response: httpx.Response) -> httpx.Response:
        if response.status_code == 507:
            # Up and serving reads: its disk is full. Not a reason to stop asking it.
            raise StoreFull(f"{self.shown} is out of space (507): {answers.detail(response)}")
        if response.status_code >= 500:
            with self._lock:
                self.errors += 1
            raise StoreUnavailable(f"{self.shown} answered {response.status_code}: {answers.detail(response)}")
        if response.status_code in (401, 403):
            given = "is not one the server takes for this" if response.status_code == 403 else "is not set"
            raise StoreError(
                f"{self.shown} refused the request ({response.status_code}: {answers.detail(response)}): this client's "
                f"token, GRAPHCACHE_TOKEN, {given}; set it to one of the server's tokens (GRAPHCACHE_WRITE_TOKENS for "
                "uploads, GRAPHCACHE_READ_TOKENS for reads)"
            )
        return response

    # -- Store --------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """Verified artifact bytes, or None when absent or corrupt in transit.

        Read as it arrives and verified on the way (``EnvelopeCheck``): never
        past ``max_artifact`` bytes nor past the size the envelope's header
        declares (AnswerTooLarge), and not past the first bytes that are no
        envelope (None, counted in ``corrupt``)."""
        self._check_down()
        try:
            with self._client.stream("GET", f"/v1/artifacts/{key}") as response:
                if response.status_code != 200:
                    answer = self._checked(self._read(response))
                    if answer.status_code == 404:
                        return None
                    answers.expect(answer, 200)
                check = EnvelopeCheck()
                data = self._bounded(response, self.max_artifact, "the largest artifact this client reads", check)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        try:
            check.finish(expected_key=key)  # the checks Artifact.decode makes, on the bytes as they came
        except CorruptArtifact as exc:
            self._corrupt(key, exc)
            return None
        return data

    def _verified(self, key: str, data: bytes) -> bytes | None:
        try:
            Artifact.decode(data, expected_key=key)
        except CorruptArtifact as exc:
            self._corrupt(key, exc)
            return None
        return data

    def _corrupt(self, key: str, exc: CorruptArtifact) -> None:
        with self._lock:
            self.corrupt += 1
        log.warning("artifact %s from %s failed verification here (%s), not used: %s", key, self.shown, exc.reason, exc)

    def get_many(
        self, keys: Iterable[str], *, batch_size: int = 1024, progress: Callable[[str], None] | None = None
    ) -> dict[str, bytes]:
        """Verified bytes of every key the server holds (absent keys are left
        out), in one streamed POST /v1/batch per ``batch_size`` keys. Each
        envelope is verified as ``get`` verifies it; a corrupt one is dropped
        and counted in ``corrupt``. ``progress(key)`` is called as each key's
        answer arrives. Raises StoreUnavailable when the server fails or the
        answer is cut short (what it had not sent yet is unknown, not absent).
        """
        wanted = list(dict.fromkeys(keys))
        found: dict[str, bytes] = {}
        for start in range(0, len(wanted), batch_size):
            self._batch(wanted[start : start + batch_size], found, progress)
        return found

    def _batch(self, keys: list[str], found: dict[str, bytes], progress: Callable[[str], None] | None) -> None:
        self._check_down()
        asked = set(keys)
        answered = 0
        parser = BatchParser(max_record=self.max_artifact)
        fallback = ""
        try:
            with self._client.stream("POST", "/v1/batch", json={"keys": keys}) as response:
                if response.status_code != 200:
                    answer = self._read(response)  # an error's detail: a bounded prefix
                    if answer.status_code in (404, 405) and answers.code(answer) in ("not_found", "method_not_allowed"):
                        fallback = "single"
                    elif answer.status_code == 413 and len(keys) > 1:
                        fallback = "halve"
                    else:
                        answers.expect(self._checked(answer), 200)
                for chunk in () if fallback else response.iter_raw():
                    for rec in parser.feed(chunk):
                        if rec.key not in asked:
                            raise CorruptArtifact(
                                f"the batch answer names a key not asked for: {rec.key[:80]!r}", "bad_batch"
                            )
                        asked.discard(rec.key)
                        answered += 1
                        if rec.kind == ENVELOPE:
                            data = self._verified(rec.key, rec.body)
                            if data is not None:
                                found[rec.key] = data
                        if progress is not None:
                            progress(rec.key)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from exc
        except AnswerTooLarge as exc:  # a record longer than this client reads, refused from its head
            # An envelope past the artifact bound may be a larger plan; a longer note is no batch answer.
            hint = (
                "; if the service stores artifacts that large (GRAPHCACHE_MAX_UPLOAD), raise "
                "GRAPHCACHE_MAX_ARTIFACT here to match"
                if exc.limit == self.max_artifact
                else ""
            )
            raise AnswerTooLarge(
                f"{self.shown} answered POST /v1/batch with more than this client reads: {exc}{hint}",
                sent=exc.sent,
                limit=exc.limit,
            ) from exc
        except CorruptArtifact as exc:
            with self._lock:
                self.corrupt += 1
            raise StoreUnavailable(f"{self.shown} sent a broken batch answer: {exc}") from exc
        if fallback == "single":
            # A server from before /v1/batch: one GET per key.
            for key in keys:
                data = self.get(key)
                if data is not None:
                    found[key] = data
                if progress is not None:
                    progress(key)
            return
        if fallback == "halve":
            # The server allows fewer keys a batch (GRAPHCACHE_MAX_BATCH).
            half = len(keys) // 2
            self._batch(keys[:half], found, progress)
            self._batch(keys[half:], found, progress)
            return
        if not parser.complete:
            raise StoreUnavailable(f"{self.shown} cut the batch answer short after {answered} of {len(keys)} keys")

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
            raise CorruptArtifact(f"server refused upload: {answers.detail(response)}", answers.code(response))
        raise StoreError(f"upload to {self.shown} failed ({response.status_code}): {answers.detail(response)}")

    def exists(self, key: str) -> bool:
        response = self._request("HEAD", f"/v1/artifacts/{key}")
        return response.status_code == 200

    def delete(self, key: str) -> bool:
        response = self._request("DELETE", f"/v1/artifacts/{key}")
        if response.status_code == 404:
            return False
        answers.expect(response, 204)
        return True

    def discard(self, key: str) -> bool:
        """What a client does with an entry it could not verify: nothing on
        the server (GraphCache counts and logs it). The server verifies what
        it serves and quarantines what it finds corrupt; a client's failed
        check (a wrong signing key during a rotation) must not delete a good
        shared entry. ``delete`` is the admin's removal."""
        return False

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
            answers.expect(response, 200)
            page = response.json()
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def pin(self, key: str) -> bool:
        """Exempt an entry from eviction on the server (write token)."""
        return self._pin("POST", key)

    def unpin(self, key: str) -> bool:
        """Make an entry evictable again on the server (write token)."""
        return self._pin("DELETE", key)

    def _pin(self, method: str, key: str) -> bool:
        response = self._request(method, f"/v1/artifacts/{key}/pin")
        if response.status_code == 404:
            return False
        answers.expect(response, 200)
        return True

    def purge(self, target: str | None, *, unsupported: bool = False, dry_run: bool = False) -> list[str]:
        """Remove every entry of ``target`` on the server, or with
        ``unsupported`` only its negative entries (of every target when
        ``target`` is None). Needs an admin token."""
        params = {"dry_run": str(dry_run).lower(), "unsupported": str(unsupported).lower()}
        if target is not None:
            params["target"] = target
        response = self._request("POST", "/v1/purge", params=params)
        answers.expect(response, 200)
        return list(response.json()["removed"])

    def resolve(self, spec: dict[str, Any], target: str) -> dict[str, Any]:
        """POST /v1/resolve: ``{key, present, ...}``."""
        response = self._request("POST", "/v1/resolve", json={"spec": spec, "target": target})
        answers.expect(response, 200)
        return dict(response.json())

    def ping(self) -> None:
        answers.expect(self._request("GET", "/healthz"), 200)

    def check_write(self, retries: int = 0, retrying: Callable[[StoreUnavailable, float], None] | None = None) -> None:
        """That the service answers and takes this client's uploads, before
        anything is built for it. Stores nothing: it asks to unpin a key no
        artifact has, and the server checks the write token first. A service
        that does not answer (or answers 5xx: one still starting) is asked
        again up to ``retries`` times, 1, 2, 4, ... s apart, ``retrying(why,
        seconds)`` told before each wait. Raises StoreUnavailable (down: the
        reason) or StoreError (the token refused, naming GRAPHCACHE_TOKEN)."""
        for attempt in range(retries + 1):
            try:
                self._request("DELETE", f"/v1/artifacts/{'0' * 64}/pin")
                return
            except StoreUnavailable as exc:
                if attempt == retries:
                    raise
                wait = float(2**attempt)
                if retrying is not None:
                    retrying(exc, wait)
                time.sleep(wait)
                with self._lock:
                    self._down_until = 0.0  # asked again now, not after retry_after

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"HttpStore({self.shown!r})"
