"""Whole-store reads, kept from the calls that must answer.

The status page's holdings (every stored header), the artifact listing,
purge and a manifest's coverage read the whole store. Once they ran in the
64-thread pool that health, uploads, DELETE and pin use, unbounded and past
the client's departure: 64 status-page GETs on a 20,000-entry store held
every thread, and /healthz answered 503 for 170 s. Here:

- they run in threads of their own (``SCAN_THREADS``; the rest wait
  without holding a thread), never the store pool, at a lower CPU priority
  than the server's other threads (``SCAN_NICE``): on a busy host the event
  loop and the store calls are scheduled first;
- each is bounded in time (``SCAN_DEADLINE``: a 503 with Retry-After past
  it), told to stop when its time is up or its client goes away (the thread
  looks at a ``Stop`` between entries and gives up), and, where its caller
  gives one, by a budget of the thread's own CPU time (``OverBudget``: a
  manifest's coverage, ``service.quota``);
- each gives way to the event loop: after ``PACE_WORK`` seconds of work it
  sleeps ``PACE_REST`` (at its next look at the ``Stop``). Python runs one
  thread at a time, and a thread that never sleeps keeps the loop waiting
  for its turn at every request (16 manifests checked at once took the
  GETs' p99 from 8.5 to 136 ms; so paced, it stays as it was quiet);
- the status page's holdings and store facts come from a snapshot taken at
  most every ``SNAPSHOT_AGE`` seconds (and at most a quarter of the time:
  a snapshot that took 3 s to read is served 12 s), one refresh at a time:
  the first page after that starts a refresh and every page until it ends
  is answered from the snapshot before (or, with none yet, waits for it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from graphcache.errors import GraphCacheError
from graphcache.stores import Store, stored_headers
from graphcache.stores.space import free_bytes
from service.errors import ServiceError

log = logging.getLogger("graphcache.service")
T = TypeVar("T")

SCAN_THREADS = 2  # whole-store reads running at once (per worker)
SCAN_NICE = 10  # added to the scan threads' nice value (Linux: per thread)
SCAN_DEADLINE = 60.0  # seconds one may take, its wait for a thread included
SNAPSHOT_AGE = 5.0  # seconds the status page's holdings are served before they are read again
SNAPSHOT_SHARE = 4  # ... and at least this many times the last read's own time (a read takes at most 1/4 of the time)
PACE_WORK = 0.002  # seconds a scan thread works before it sleeps ...
PACE_REST = 0.002  # ... this long, so the event loop runs meanwhile


class Stopped(Exception):
    """A whole-store read was told to stop (its deadline, its client gone)."""


class OverBudget(Exception):
    """A whole-store read spent its budget of CPU time and was stopped."""

    def __init__(self, spent: float, budget: float) -> None:
        super().__init__(f"stopped after {spent:.2f} s of CPU time, over its {budget:g} s")
        self.spent = spent
        self.budget = budget


class Stop:
    """What a whole-store read in a thread looks at between entries: whether
    to stop (told to, its deadline, its ``budget`` of the thread's CPU
    seconds spent), and when to give way to the event loop (``pace``)."""

    def __init__(self, deadline: float, budget: float | None = None, *, pace: bool = True) -> None:
        self.until = time.monotonic() + deadline
        self.pacing = pace  # False in a process of its own (service.checker): no event loop to give way to
        self.event = threading.Event()
        self.why = "its deadline passed"
        self.budget = budget
        self.spent = 0.0  # CPU seconds of the thread running the read, so far
        self._cpu = 0.0  # time.thread_time() when the read began in its thread
        self._slice = 0.0  # time.perf_counter() when its current slice of work began

    def set(self, why: str) -> None:
        self.why = why
        self.event.set()

    def begin(self) -> None:
        """In the read's own thread, before its work: where its CPU time and its first slice start."""
        self._cpu = time.thread_time()
        self._slice = time.perf_counter()

    @property
    def over_budget(self) -> bool:
        return self.budget is not None and self.spent > self.budget

    def tally(self) -> None:
        """``spent`` brought up to now (in the read's own thread)."""
        self.spent = time.thread_time() - self._cpu

    def _stopped(self) -> bool:
        self.tally()
        return self.event.is_set() or time.monotonic() > self.until or self.over_budget

    def pace(self) -> None:
        """Sleep ``PACE_REST`` once ``PACE_WORK`` seconds of work have passed since the last sleep."""
        if self.pacing and time.perf_counter() - self._slice >= PACE_WORK:
            time.sleep(PACE_REST)
            self._slice = time.perf_counter()

    def check(self) -> None:
        """Raise Stopped when told to stop, past the deadline or the budget; else pace."""
        if self._stopped():
            raise Stopped(self.why)
        self.pace()

    def __call__(self) -> bool:
        """True when it should stop (a ``cancelled`` for manifest.expand); paces as ``check`` does."""
        if self._stopped():
            return True
        self.pace()
        return False


@dataclass
class TargetRow:
    """The entries one target holds."""

    count: int = 0
    bytes: int = 0
    pinned: int = 0
    negative: int = 0


@dataclass
class Holdings:
    """What the store holds, by target text, and the store's own facts."""

    targets: dict[str, TargetRow] = field(default_factory=dict)
    corrupt: int = 0
    store: dict[str, Any] = field(default_factory=dict)
    taken: float = 0.0  # time.time() of the read


def holdings(store: Store, unwritable: Callable[[], str | None], stop: Stop) -> Holdings:
    """Every entry's header, counted by target (``stored_headers``: a full
    scan of headers, or the store's own listing), and the store's facts."""
    found = Holdings(taken=time.time())
    is_pinned = getattr(store, "pinned", None)
    pinned_keys = getattr(store, "pinned_keys", None)
    if pinned_keys is not None:  # one query, not one per entry
        is_pinned = pinned_keys().__contains__

    def corrupt(_key: str) -> None:
        found.corrupt += 1

    for header in stored_headers(store, corrupt):
        stop.check()
        row = found.targets.setdefault(str(header.get("target_text", "?")), TargetRow())
        row.count += 1
        row.bytes += int(header.get("payload_size") or 0)
        row.negative += bool(header.get("unsupported"))
        row.pinned += bool(is_pinned is not None and is_pinned(str(header.get("key", ""))))
    found.store = store_facts(store, unwritable)
    return found


def store_facts(store: Store, unwritable: Callable[[], str | None]) -> dict[str, Any]:
    folder = getattr(store, "path", None)
    volume = getattr(store, "volume", None)
    try:
        size: int | None = int(volume()) if callable(volume) else None
    except (GraphCacheError, OSError):
        size = None
    reason = unwritable()
    return {
        "kind": type(store).__name__,
        "where": repr(store),
        "size": size,
        "free": free_bytes(folder) if folder is not None else None,
        "writable": reason is None,
        "reason": reason,
    }


class Scans:
    """The whole-store reads of one server worker."""

    def __init__(self, store: Store, unwritable: Callable[[], str | None]) -> None:
        self.store = store
        self.unwritable = unwritable
        self._pool: ThreadPoolExecutor | None = None
        self._snapshot: Holdings | None = None
        self._taken = 0.0  # monotonic time of the snapshot
        self._age = 0.0  # how long it is served, past SNAPSHOT_AGE (SNAPSHOT_SHARE x its read's time)
        self._refreshed: anyio.Event | None = None  # set when the refresh under way ends
        self._error: ServiceError | None = None  # why the last refresh failed

    async def run(self, fn: Callable[..., T], *args: Any, watch: Any = None, stop: Stop | None = None) -> T:
        """``fn(*args, stop)`` in a scan thread, bounded by SCAN_DEADLINE
        (waiting for a thread included): 503 ``busy`` with Retry-After past
        it. ``watch``: the request (a Starlette Request) whose client going
        away stops it too (then ServiceError 499, which no one reads).
        ``stop``: the caller's, for a budget of CPU time (OverBudget past
        it, whatever ``fn`` raised on its way out) and to read what it spent."""
        stop = stop if stop is not None else Stop(SCAN_DEADLINE)
        result: list[T] = []
        failed: list[Exception] = []  # raised outside the task group, not as an ExceptionGroup
        async with anyio.create_task_group() as tasks:
            if watch is not None:
                tasks.start_soon(watch_client, watch, stop, tasks.cancel_scope)
            try:
                with anyio.fail_after(SCAN_DEADLINE):
                    result.append(await self._in_thread(_call, fn, args, stop))
            except TimeoutError:
                stop.set("its deadline passed")
            except Stopped:
                pass
            except Exception as exc:  # noqa: BLE001 - the read's own error, raised below
                failed.append(exc)
            tasks.cancel_scope.cancel()
        if result:
            return result[0]  # a read that ended is answered, whatever it cost
        if stop.over_budget:
            assert stop.budget is not None
            raise OverBudget(stop.spent, stop.budget)
        if failed:
            raise failed[0]
        if stop.why == "its client went away":
            raise ServiceError(499, "client_gone", "the client went away")
        raise ServiceError(
            503,
            "busy",
            f"a read of the whole store did not end within {SCAN_DEADLINE:g}s; it was stopped: retry later",
            {"retry-after": "5"},
        )

    async def whole(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a scan thread, to its end (purge: a write cut
        halfway would leave a retired target half there)."""
        return await self._in_thread(fn, *args)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the scan threads (a call cancelled while it
        runs is left to end there: its Stop tells it to)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(SCAN_THREADS, thread_name_prefix="graphcache-scan", initializer=_nice)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def close(self) -> None:
        """No more scans: waiting ones are dropped (one under way ends at its Stop)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def snapshot(self) -> Holdings:
        """The status page's holdings: at most SNAPSHOT_AGE seconds old, or,
        while a refresh is under way, the snapshot before it."""
        if self._snapshot is not None and time.monotonic() - self._taken < max(SNAPSHOT_AGE, self._age):
            return self._snapshot
        if self._refreshed is None:
            self._refreshed = anyio.Event()
            # Shielded: the refresh serves every page waiting for it, whoever
            # asked first; it is bounded by its own deadline.
            with anyio.CancelScope(shield=True):
                await self._refresh()
        elif self._snapshot is None:
            await self._refreshed.wait()
        if self._snapshot is None:
            assert self._error is not None
            raise self._error
        return self._snapshot

    async def _refresh(self) -> None:
        done = self._refreshed
        began = time.monotonic()
        try:
            self._snapshot = await self.run(holdings, self.store, self.unwritable)
            self._taken = time.monotonic()
            # A large store is read less often: its reads take at most a
            # quarter of the time, however many pages are asked for.
            self._age = SNAPSHOT_SHARE * (self._taken - began)
            self._error = None
        except ServiceError as exc:
            self._error = exc
        except (GraphCacheError, OSError) as exc:
            log.warning("the status page could not list %r: %s", self.store, exc)
            self._error = ServiceError(503, "store_unavailable", f"the store could not be listed: {exc}")
        finally:
            self._refreshed = None
            assert done is not None
            done.set()


def _nice() -> None:
    """A scan thread's CPU priority lowered (Linux applies it to the calling
    thread alone); where that is refused, it runs at the server's own."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + SCAN_NICE)
    except (OSError, AttributeError):
        pass


def _call(fn: Callable[..., T], args: tuple[Any, ...], stop: Stop) -> T:
    stop.begin()
    try:
        return fn(*args, stop)
    finally:
        stop.tally()  # what it spent, to its end


async def watch_client(request: Any, stop: Stop, scope: anyio.CancelScope) -> None:
    """Wait for ``request``'s client to go away; then stop the read."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stop.set("its client went away")
            scope.cancel()
            return
