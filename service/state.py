"""What the routes and the fast path share: settings, store, metrics, auth,
the reader, and the build path's controller."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from graphcache.cache import GraphCache
from graphcache.errors import CorruptArtifact, GraphCacheError, NoGpu, StoreError, StoreFull, UnreadableEntry
from graphcache.key import is_key
from graphcache.settings import Settings
from graphcache.stores import Store
from service import upload
from service.auth import Auth
from service.checker import Checker
from service.errors import ServiceError
from service.metrics import Metrics
from service.quota import ClientQuota
from service.reader import ArtifactReader, Served, Unverified
from service.scans import Scans

OCTET = b"application/octet-stream"
log = logging.getLogger("graphcache.service")
T = TypeVar("T")
# Threads for store calls, apart from anyio's default pool (verification,
# builds): calls to a hung store that time out keep their thread until the
# store's own timeout ends them, and must not starve the rest.
STORE_THREADS = 64
SWEEP_EVERY = 60.0  # seconds between two sweeps of the uploads' folder


class State:
    def __init__(self, settings: Settings, store: Store, compiler: Any, *, checker: bool = False) -> None:
        self.settings = settings
        self.store = store
        self.metrics = Metrics()
        self.auth = Auth(settings)
        quarantine = None
        if hasattr(store, "path"):
            quarantine = Path(store.path) / "quarantine"
        # With a signing key, what is served is verified against every key
        # (unless GRAPHCACHE_REQUIRE_SIGNED=0), not only what is uploaded.
        keys = settings.verify_keys if settings.require_signed else ()
        self.reader = ArtifactReader(
            store, self.metrics, quarantine, settings.hot_cache_bytes, keys, quarantine_bytes=settings.quarantine_size
        )
        self.metrics.watch_store(self.unwritable, store)
        self.scans = Scans(store, self.unwritable)  # whole-store reads, apart from store_call's pool
        self.quota = ClientQuota(settings.client_seconds, settings.manifest_seconds)  # manifests' CPU, per client
        self.checker = Checker(checker)  # manifests' coverage, in a process of its own where it can
        sweep = getattr(store, "sweep_orphans", None)
        if sweep is not None:
            # Value files a crash left behind (a write killed before it was
            # published) are room a full disk needs.
            try:
                sweep()
            except (OSError, sqlite3.Error) as exc:
                log.warning("could not sweep orphan files of %r: %s", store, exc)
        # The uploads' folder is the server's own, or the server does not start.
        upload.checked_folder(store)
        self.spool_age = upload.spool_age(settings.upload_timeout, settings.timeout)
        if hasattr(store, "spool_age"):
            store.spool_age = self.spool_age  # what its full-disk sweep removes too
        if swept := upload.sweep(store, self.spool_age):  # uploads a killed server was taking in
            log.warning("removed %d upload file(s) a stopped server left in %s", swept, upload.folder_for(store))
        # DiskStore is read on the event loop (an open() and a read of a
        # local file, the fast path); any other store only from threads.
        self.local = hasattr(store, "open")
        self._store_threads: anyio.CapacityLimiter | None = None
        self._compiler = compiler
        self._compiler_error: str | None = None
        self._cache: GraphCache | None = None
        self.started = time.time()
        # Artifact bytes are a pure function of their key, so any HTTP cache
        # may keep them; with read tokens, only the client's own cache may.
        if self.auth.read_open:
            self.cache_control = f"public, max-age={settings.http_max_age}".encode()
        else:
            self.cache_control = b"private"

    async def housekeeping(self) -> None:
        """While the server runs: upload files that outlived their upload
        (an upload that died) removed every ``SWEEP_EVERY`` seconds."""
        while True:
            await anyio.sleep(SWEEP_EVERY)
            try:
                await anyio.to_thread.run_sync(upload.sweep, self.store, self.spool_age)
            except OSError as exc:
                log.warning("could not sweep upload files: %s", exc)

    async def store_call(self, fn: Callable[..., T], *args: Any, bounded: bool = True) -> T:
        """``fn(*args)`` (a store call) in a thread, never on the event loop.

        ``bounded``: answered within GRAPHCACHE_TIMEOUT, else a 503 at once,
        however many requests wait on the same hung store (the thread is left
        to the store's own timeout). Store errors count in store_errors.
        """
        if self._store_threads is None:
            self._store_threads = anyio.CapacityLimiter(STORE_THREADS)
        limit = self.settings.timeout
        try:
            if not bounded:
                return await anyio.to_thread.run_sync(fn, *args, limiter=self._store_threads)
            with anyio.fail_after(limit):
                return await anyio.to_thread.run_sync(fn, *args, limiter=self._store_threads, abandon_on_cancel=True)
        except TimeoutError:
            raise self._timed_out(limit) from None
        except StoreFull:
            raise
        except StoreError:
            self.metrics.store_errors.inc()
            raise

    def size_pools(self, concurrency: int) -> None:
        """Size the store's connection pools to ``concurrency`` requests at
        once (a RedisStore's asyncio pool, before its first read)."""
        if hasattr(self.store, "max_connections"):
            self.store.max_connections = max(1, concurrency)

    def _timed_out(self, limit: float) -> ServiceError:
        """The 503 of a store call past GRAPHCACHE_TIMEOUT, counted in store_errors."""
        self.metrics.store_errors.inc()
        return ServiceError(
            503, "store_unavailable", f"{self.store!r} did not answer within {limit:g}s (GRAPHCACHE_TIMEOUT)"
        )

    async def read_entry(self, key: str) -> Served | Unverified | None:
        """The reader's lookup of ``key`` the way the store allows: a local
        DiskStore on the event loop (an open() of a local file), a store with
        an asyncio read (Redis) on the loop without blocking it, bounded by
        GRAPHCACHE_TIMEOUT, any other through ``store_call``."""
        if self.local or self.reader.aget is None:
            try:
                return self.reader.lookup(key) if self.local else await self.store_call(self.reader.lookup, key)
            except UnreadableEntry:  # set aside: keep the quarantine within its bounds, off the event loop
                await anyio.to_thread.run_sync(self.reader.trim_quarantine)
                raise
        limit = self.settings.timeout
        try:
            with anyio.fail_after(limit):
                return await self.reader.alookup(key)
        except TimeoutError:
            raise self._timed_out(limit) from None
        except StoreError:
            self.metrics.store_errors.inc()
            raise

    def unwritable(self) -> str | None:
        """Why the store would refuse an upload now (out of space), or None."""
        check = getattr(self.store, "unwritable", None)
        return None if check is None else check()  # type: ignore[no-any-return]

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
            found = await self.read_entry(key)
        except CorruptArtifact as exc:  # unreadable (the reader set it aside)
            self.metrics.misses.inc()
            raise ServiceError(
                404, "not_found", f"no servable artifact for key {key} (quarantined: {exc.reason})"
            ) from None
        except (StoreError, OSError) as exc:
            self.metrics.store_errors.inc()
            raise ServiceError(503, "store_unavailable", f"the store did not answer: {exc}") from exc
        served: Served | None = None
        if isinstance(found, Unverified):
            checked = await anyio.to_thread.run_sync(self.reader.verify, key, found)
            if not isinstance(checked, Served):
                self.metrics.misses.inc()
                raise ServiceError(404, "not_found", f"no servable artifact for key {key} ({checked})")
            served = checked
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
            return 304, [(b"etag", etag), (b"cache-control", self.cache_control)], None
        out = [
            (b"content-type", OCTET),
            (b"content-length", str(served.size).encode()),
            (b"etag", etag),
            (b"cache-control", self.cache_control),
        ]
        if method == "HEAD":
            return 200, out, None
        self.count_served(served)
        return 200, out, served

    def count_served(self, served: Served) -> None:
        """Metrics for an artifact whose bytes are about to leave (GET, batch)."""
        self.metrics.bytes_served.inc(served.size)
        self.metrics.served_build_seconds.inc(served.build_seconds)
        self.metrics.served_sizes.observe(served.size)


def _etag_matches(header: bytes | None, etag: bytes) -> bool:
    if not header:
        return False
    for part in header.split(b","):
        tag = part.strip()
        if tag == b"*" or tag.removeprefix(b"W/") == etag:
            return True
    return False
