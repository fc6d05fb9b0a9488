"""Build leases: one build per key across processes and replicas.

A lease is a short-lived lock with a time to live, renewed by a heartbeat
while its holder builds. A holder that dies stops renewing, the lease
expires, and the next waiter takes it. Stores that are shared provide one
(``store.leases()``): RedisStore across a fleet (``SET NX PX``), DiskStore
across the processes of one machine.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from graphcache.errors import StoreUnavailable

log = logging.getLogger(__name__)


class Leases(Protocol):
    """Acquire, renew and release named leases."""

    def try_acquire(self, key: str, owner: str, ttl: float) -> bool: ...

    def renew(self, key: str, owner: str, ttl: float) -> bool: ...

    def release(self, key: str, owner: str) -> None: ...


class Lease:
    """A held lease with a heartbeat thread; use as a context manager."""

    def __init__(self, leases: Leases, key: str, ttl: float) -> None:
        self.leases = leases
        self.key = key
        self.ttl = ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def try_acquire(self) -> bool:
        if not self.leases.try_acquire(self.key, self.owner, self.ttl):
            return False
        self._thread = threading.Thread(target=self._heartbeat, name=f"lease-{self.key[:8]}", daemon=True)
        self._thread.start()
        return True

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                if not self.leases.renew(self.key, self.owner, self.ttl):
                    self.lost = True
                    log.warning("build lease for %s was lost (expired or taken over)", self.key[:12])
                    return
            except Exception as exc:  # noqa: BLE001 - keep building; the lease simply expires
                log.warning("could not renew build lease for %s: %s", self.key[:12], exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            self.leases.release(self.key, self.owner)
        except Exception as exc:  # noqa: BLE001 - it expires on its own
            log.warning("could not release build lease for %s: %s", self.key[:12], exc)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def build_once(
    leases: Leases | None,
    key: str,
    *,
    ttl: float,
    wait: float,
    fetch: Callable[[str], Any],
    build: Callable[[], Any],
    waiting: Callable[[], None],
) -> tuple[Any, bool]:
    """``build()`` under ``key``'s lease, or what another holder stored
    (``fetch(key)``), and whether it was built here. The holder builds; the
    others wait up to ``wait`` seconds for its artifact (``waiting()`` once,
    when they start to), then build it themselves; a holder that dies stops
    renewing, its lease expires and a waiter takes over. No leases (None), or
    a store that cannot give one: built here at once (GraphCache's builds)."""
    if leases is None:
        return build(), True
    deadline = time.monotonic() + wait
    waited = False
    while True:
        lease = Lease(leases, key, ttl)
        try:
            acquired = lease.try_acquire()
        except StoreUnavailable as exc:
            log.warning("no build lease for %s (%s): building without one", key[:12], exc)
            return build(), True
        if acquired:
            with lease:
                fetched = fetch(key)
                return (fetched, False) if fetched is not None else (build(), True)
        if not waited:
            waiting()
            waited = True
        time.sleep(0.1)
        fetched = fetch(key)
        if fetched is not None:
            return fetched, False
        if time.monotonic() > deadline:
            log.warning("waited %.0fs for another builder of %s: building here", wait, key[:12])
            return build(), True
