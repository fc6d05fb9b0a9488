"""What one client may spend of a worker's time on manifests.

Checking a posted manifest's coverage (``POST /``, ``GET /?manifest=NAME``)
costs the server CPU, and the status page is open wherever reads are: a
1 KB manifest of 4,096 specs took 1.2 to 1.6 s of server time, and 16 of
them at once took the worker's GETs from a p99 of 8.5 ms to 136 ms. Each
such check is bounded twice:

- per request: it may take ``GRAPHCACHE_MANIFEST_SECONDS`` of CPU (the scan
  thread's own, ``service.scans``); past it the check stops and the answer
  is 413 ``manifest_budget``;
- per client (its address as the worker sees it): a bucket of
  ``GRAPHCACHE_CLIENT_SECONDS`` of CPU, refilled at that many seconds a
  minute. A check reserves its whole per-request budget before it starts
  and gives back what it did not use; a client whose bucket holds less is
  answered 429 ``client_budget`` with the Retry-After that refills it.

The buckets are this worker's (each worker process keeps its own) and at
most ``CLIENTS`` of them are kept, the least recently seen dropped first (a
dropped client starts again with a full bucket). Behind a proxy every
client has the proxy's address: they share one bucket.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from service.errors import ServiceError

CLIENTS = 10_000  # buckets kept per worker
PER = 60.0  # seconds over which a bucket refills whole


@dataclass
class Grant:
    """The seconds a check of ``client`` may spend, reserved from its bucket."""

    client: str
    seconds: float


class ClientQuota:
    """The buckets of one worker (one event loop: no lock needed)."""

    def __init__(self, per_client: float, per_request: float) -> None:
        self.per_client = per_client  # a bucket's size, refilled over PER seconds
        self.per_request = per_request
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (seconds, monotonic when)

    def _balance(self, client: str) -> float:
        held, when = self._buckets.get(client, (self.per_client, time.monotonic()))
        return min(self.per_client, held + (time.monotonic() - when) * self.per_client / PER)

    def _set(self, client: str, seconds: float) -> None:
        self._buckets[client] = (seconds, time.monotonic())
        self._buckets.move_to_end(client)
        while len(self._buckets) > CLIENTS:
            self._buckets.popitem(last=False)

    def take(self, client: str) -> Grant:
        """Reserve a check's whole budget from ``client``'s bucket; 429
        ``client_budget`` with Retry-After when it holds less."""
        balance = self._balance(client)
        if balance < self.per_request:
            wait = math.ceil((self.per_request - balance) * PER / self.per_client)
            raise ServiceError(
                429,
                "client_budget",
                f"this client ({client}) has spent its share of the server's time on manifests: "
                f"{self.per_client:g} s of CPU a minute (GRAPHCACHE_CLIENT_SECONDS), of which one check reserves "
                f"{self.per_request:g} s (GRAPHCACHE_MANIFEST_SECONDS); retry in {wait} s, or check the manifest "
                "with graphcache warm --check, on your own machine's time",
                {"retry-after": str(wait)},
            )
        self._set(client, balance - self.per_request)
        return Grant(client, self.per_request)

    def settle(self, grant: Grant, spent: float) -> None:
        """Give back what a check did not spend of its grant."""
        unused = max(0.0, grant.seconds - spent)
        self._set(grant.client, min(self.per_client, self._balance(grant.client) + unused))
