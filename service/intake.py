"""Request bodies, taken in before any route sees them.

Every request that declares a body (a Content-Length above 0, or chunked)
passes here first (``BodyGate``), in this order, each step answered at once
and the connection closed (``connection: close``: what the client still sends
is never read):

1. the route's token is checked from the head (401/403), before any body
   byte is read;
2. the declared size against the route's own limit (413; see ``rule_for``):
   an upload GRAPHCACHE_MAX_UPLOAD, a batch what GRAPHCACHE_MAX_BATCH keys
   take, /v1/resolve and /v1/build ``SPEC_BODY_MAX``, a manifest posted to
   the status page ``MANIFEST_BODY_MAX``, every other route ``SMALL_BODY_MAX``;
3. the budgets (503 with Retry-After), two of them, so that no body of
   another route can take an upload's room: an upload (PUT of an artifact)
   takes GRAPHCACHE_UPLOAD_BUDGET, every other body GRAPHCACHE_BODY_BUDGET.
   An upload whose token was checked (write tokens set) has its declared
   size (the route's limit when chunked) reserved up front, before any body
   byte is read; every other body, and uploads where writes are open, is
   charged as its bytes arrive, so a client that declares a body and sends
   nothing holds nothing of either;
4. the body is read within its hard deadline, GRAPHCACHE_UPLOAD_TIMEOUT
   from the end of the head (408), and never past the limit (413);
5. a JSON route's body must parse, as UTF-8 JSON nested at most
   ``service.errors.MAX_JSON_DEPTH`` levels (400 ``bad_json`` naming what
   is wrong).

The route then gets the body as one message; an upload's body is instead
written to a temporary file as it arrives, its envelope checked on the way,
and the route gets that (``service.upload``; memory per upload is one
``SPOOL_CHUNK``, so the upload budget bounds disk in flight, not memory).
While a body is arriving its
request is listed in the protocol's ``arriving`` set (service.transport), so
slow senders do not count against --limit-concurrency: they are bounded by
the budgets and their deadline instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from graphcache.errors import StoreError, StoreFull
from graphcache.key import is_key
from graphcache.settings import SettingsError
from service.errors import JSON, RAW_BODY, ServiceError, bad_json, body, from_library, json_problem
from service.metrics import route_label
from service.state import State
from service.transport import ARRIVING
from service.upload import SPOOL_CHUNK, UPLOAD, Upload

log = logging.getLogger("graphcache.service")
SPEC_BODY_MAX = 64 * 1024  # /v1/resolve, /v1/build: a spec and a target are a few hundred bytes
MANIFEST_BODY_MAX = 1024 * 1024  # POST /: a manifest for the status page (service.routes.status)
SMALL_BODY_MAX = 4 * 1024  # routes that take no body (purge, pin, DELETE, GET): what a proxy may add
BATCH_BODY_PER_KEY = 128  # a key is 64 hex characters, quoted, with a separator and indentation
BATCH_BODY_SLACK = 4096
ARTIFACTS = "/v1/artifacts/"


@dataclass(frozen=True)
class Rule:
    need: str | None  # the token a route needs ("read", "write", "admin"), None: its own affair
    limit: int  # bytes
    json: bool  # the body must be JSON (checked here)
    what: str  # the limit's name in a 413
    upload: bool = False  # an artifact upload (GRAPHCACHE_UPLOAD_BUDGET); else GRAPHCACHE_BODY_BUDGET


def batch_body_max(max_batch: int) -> int:
    return BATCH_BODY_SLACK + BATCH_BODY_PER_KEY * max_batch


def rule_for(state: State, method: str, path: str) -> Rule:
    """What a request's body may be, from its head alone."""
    small = Rule(None, SMALL_BODY_MAX, False, f"{SMALL_BODY_MAX} bytes (this route takes no body)")
    if path.startswith(ARTIFACTS):
        rest = path[len(ARTIFACTS) :]
        if method == "PUT" and "/" not in rest:
            return Rule("write", state.settings.max_upload, False, "GRAPHCACHE_MAX_UPLOAD", upload=True)
        if rest.endswith("/pin") and method in ("POST", "DELETE"):
            return Rule("write", small.limit, False, small.what)
        if method == "DELETE" and "/" not in rest:
            return Rule("admin", small.limit, False, small.what)
        return small
    if method != "POST":
        return small
    if path == "/v1/batch":
        limit = batch_body_max(state.settings.max_batch)
        return Rule("read", limit, False, f"{limit} bytes, what GRAPHCACHE_MAX_BATCH keys take; split the batch")
    if path == "/v1/resolve":
        return Rule("read", SPEC_BODY_MAX, True, f"{SPEC_BODY_MAX} bytes for a spec and a target")
    if path == "/v1/build":
        return Rule("write", SPEC_BODY_MAX, True, f"{SPEC_BODY_MAX} bytes for a spec")
    if path == "/v1/purge":
        return Rule("admin", small.limit, False, small.what)
    if path == "/":
        return Rule("read", MANIFEST_BODY_MAX, False, f"{MANIFEST_BODY_MAX} bytes for a manifest")
    return small


def largest_read_body(max_batch: int) -> tuple[int, str]:
    """The largest body a route other than an upload takes, and what it is."""
    batch = batch_body_max(max_batch)
    if batch > MANIFEST_BODY_MAX:
        return batch, "a batch of GRAPHCACHE_MAX_BATCH keys"
    return MANIFEST_BODY_MAX, "a manifest posted to /"


class Budget:
    """Bytes of request bodies in flight in this worker (one event loop)."""

    def __init__(self, limit: int, variable: str, code: str, what: str) -> None:
        self.limit = limit
        self.used = 0
        self.variable = variable  # the setting, named in a 503
        self.code = code
        self.what = what  # what it holds, in a 503

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size

    def refusal(self, size: int, *, whole: bool = False) -> ServiceError:
        """The 503 of a body whose ``size`` bytes (``whole``: the whole body,
        else the next bytes that arrived) do not fit."""
        what = f"this body of {size} bytes" if whole else f"{size} bytes more"
        detail = (
            f"the server holds {self.used} bytes of {self.what} in flight; {what} would pass "
            f"{self.variable} ({self.limit} bytes); retry shortly"
        )
        return ServiceError(503, self.code, detail, {"retry-after": "1"})


class Hold:
    """What one request holds of a budget; ``release`` gives it all back."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.size = 0

    def take(self, size: int) -> bool:
        if not self.budget.take(size):
            return False
        self.size += size
        return True

    def release(self) -> None:
        self.budget.give(self.size)
        self.size = 0


class BodyGate:
    """Reads a request's body for the routes, as the module says."""

    def __init__(self, state: State) -> None:
        self.state = state
        settings = state.settings
        largest, which = largest_read_body(settings.max_batch)
        if settings.body_budget < largest:
            raise SettingsError(
                f"GRAPHCACHE_BODY_BUDGET={settings.body_budget} is below the largest body a read route takes "
                f"({largest} bytes, {which}): such a body could never be taken in; raise it"
            )
        self.uploads = Budget(settings.upload_budget, "GRAPHCACHE_UPLOAD_BUDGET", "upload_budget", "uploads")
        self.bodies = Budget(settings.body_budget, "GRAPHCACHE_BODY_BUDGET", "body_budget", "request bodies")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any, app: Callable[..., Any]) -> None:
        """Take the body in, then ``app(scope, replay, send)``; or answer an error and close."""
        state = self.state
        headers = dict(scope["headers"])
        rule = rule_for(state, scope["method"], scope["path"])
        declared_text = headers.get(b"content-length")
        path = scope["path"]
        try:
            if path.startswith(ARTIFACTS) and not is_key(path[len(ARTIFACTS) :].removesuffix("/pin")):
                raise ServiceError(400, "invalid_key", "a key is 64 lowercase hex characters")
            if rule.need is not None:
                state.auth.check(headers.get(b"authorization"), rule.need)
            if declared_text is not None and not declared_text.strip().isdigit():
                raise ServiceError(400, "bad_request", "Content-Length must be a number of bytes")
            declared = int(declared_text) if declared_text is not None else None
            if declared is not None and declared > rule.limit:
                state.metrics.rejected.labels("too_large").inc()
                raise _too_large(declared, rule)
            if rule.upload and declared and (err := await self._no_room(declared)) is not None:
                raise err
        except ServiceError as err:
            await self._refuse(scope, send, err)
            return
        hold = Hold(self.uploads if rule.upload else self.bodies)
        # Room is promised up front only to a writer known by its token: an
        # upload it begins is not cut halfway for want of room. Anyone else
        # holds only what it has sent.
        upfront = rule.upload and not state.auth.write_open
        if upfront and not hold.take(reserve := declared if declared is not None else rule.limit):
            state.metrics.rejected.labels("budget").inc()
            await self._refuse(scope, send, hold.budget.refusal(reserve, whole=True))
            return
        # An upload goes to a file as it arrives (service.upload), never whole into memory.
        upload = Upload(state.store, path[len(ARTIFACTS) :], declared) if rule.upload else None
        try:
            data = await self._read(scope, receive, send, rule, None if upfront else hold, upload)
            if data is None:
                return
            if upload is not None:
                scope[UPLOAD] = upload
            else:
                scope[RAW_BODY] = data
            await app(scope, replay(data, receive), send)
        finally:
            hold.release()
            if upload is not None:
                upload.discard()  # unless the store took it: refused, cut short, or gone

    async def _no_room(self, declared: int) -> ServiceError | None:
        """The 507 of an upload the store cannot take at its declared size
        (a Redis whose maxmemory cannot hold it: RedisStore.room_for), before
        any byte of it is read, so none reaches the store."""
        room_for = getattr(self.state.store, "room_for", None)
        if room_for is None:
            return None
        try:
            why = await self.state.store_call(room_for, declared)
        except StoreError:
            return None  # Redis did not answer: the put will say so
        if why is None:
            return None
        self.state.metrics.rejected.labels("store_full").inc()
        return from_library(StoreFull(why, needed=declared))

    async def _read(
        self, scope: dict[str, Any], receive: Any, send: Any, rule: Rule, charge: Hold | None, upload: Upload | None
    ) -> bytes | None:
        """The body (b"" for an ``upload``: its bytes went to the upload's
        file, ``SPOOL_CHUNK`` at a time, from a worker thread), or None when
        it was answered (the client went away, a limit, the deadline);
        ``charge``: the budget its bytes are charged to as they arrive (None:
        reserved up front)."""
        state = self.state
        chunks: list[bytes] = []
        held = size = 0
        more = True
        try:
            with anyio.fail_after(state.settings.upload_timeout):
                while more:
                    message = await receive()
                    if message["type"] != "http.request":
                        return None  # the client went away
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > rule.limit:
                        state.metrics.rejected.labels("too_large").inc()
                        await self._refuse(scope, send, _too_large(size, rule))
                        return None
                    if charge is not None and chunk and not charge.take(len(chunk)):
                        state.metrics.rejected.labels("budget" if rule.upload else "body_budget").inc()
                        await self._refuse(scope, send, charge.budget.refusal(len(chunk)))
                        return None
                    if chunk:
                        chunks.append(chunk)
                        held += len(chunk)
                    more = message.get("more_body", False)
                    if upload is not None and chunks and (held >= SPOOL_CHUNK or not more):
                        await anyio.to_thread.run_sync(upload.write, chunks)
                        chunks, held = [], 0
        except TimeoutError:
            state.metrics.rejected.labels("timeout").inc()
            detail = (
                f"the request body did not arrive within {state.settings.upload_timeout:g}s "
                f"(GRAPHCACHE_UPLOAD_TIMEOUT; {size} bytes came)"
            )
            await self._refuse(scope, send, ServiceError(408, "timeout", detail))
            return None
        except asyncio.CancelledError:
            # uvicorn cancels the requests still open when its shutdown grace
            # ends (SIGTERM): a body still arriving then is an expected end,
            # said in one line, not a traceback of the cancellation. This is
            # the request's outermost frame of its own: nothing above it waits.
            declared = dict(scope["headers"]).get(b"content-length", b"?").decode("latin-1")
            log.warning(
                "%s %s: the server shut down while its body was arriving (%d of %s bytes came); nothing was "
                "stored, and the client is answered 503 if it still listens",
                scope["method"],
                scope["path"],
                size,
                declared,
            )
            with contextlib.suppress(Exception), anyio.move_on_after(1):
                detail = "the server is shutting down; retry the request (on another replica, or once it is back)"
                await refuse(send, ServiceError(503, "shutting_down", detail, {"retry-after": "1"}))
            return None
        finally:
            arrived(scope)
        if upload is not None:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if rule.json and data:
            problem = json_problem(data)
            if problem is not None:
                await self._refuse(scope, send, bad_json(problem), close=False)
                return None
        return data

    async def _refuse(self, scope: dict[str, Any], send: Any, err: ServiceError, *, close: bool = True) -> None:
        """``refuse``, counted in graphcache_requests_total as the route would count it."""
        self.state.metrics.requests.labels(route_label(scope["path"]), scope["method"], str(err.status)).inc()
        await refuse(send, err, close=close)


def arrived(scope: dict[str, Any]) -> None:
    """Take a request off the protocol's list of bodies arriving
    (service.transport), once its body has come or it is answered."""
    listed = scope.get("extensions", {}).get(ARRIVING)
    if listed is not None:
        listed["requests"].discard(listed["token"])


def _too_large(size: int, rule: Rule) -> ServiceError:
    return ServiceError(
        413, "too_large", f"the request body of {size} bytes or more is over this route's limit: {rule.what}"
    )


async def refuse(send: Any, err: ServiceError, *, close: bool = True) -> None:
    """An error answer; ``close``: and the connection closed after it (the
    body, unread, is not read)."""
    data = body(err.code, err.detail, **err.extra)
    headers = [(b"content-type", JSON), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in err.headers.items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def replay(data: bytes, receive: Any) -> Any:
    """A receive that gives the body read, then what the client sends next
    (a disconnect)."""
    given = False

    async def replayed() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()

    return replayed


def plain_keys(data: bytes, limit: int) -> list[str] | None:
    """The keys of a well-formed batch request, or None to let the route judge it."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if type(parsed) is not dict or len(parsed) != 1:
        return None
    keys = parsed.get("keys")
    if type(keys) is not list or not 0 < len(keys) <= limit:
        return None
    for key in keys:
        if type(key) is not str or not is_key(key):
            return None
    return keys
