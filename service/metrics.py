"""Prometheus metrics, one registry per app (tests run several apps)."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class SizeHistogram(Collector):
    """A Prometheus histogram of byte sizes that takes a batch's sizes in one
    call: prometheus_client's ``observe`` is about 1 us each, 0.1 ms for a
    start-up batch of 100 entries. Exposed as any histogram is
    (``_bucket{le=...}``, ``_count``, ``_sum``)."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[int], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = sorted(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, size: float) -> None:
        self.observe_many((size,))

    def observe_many(self, sizes: Iterable[float]) -> None:
        bounds = self.bounds
        places = [(bisect_left(bounds, size), size) for size in sizes]
        with self._lock:
            for place, size in places:
                self._counts[place] += 1
                self._sum += size

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, count in zip([*self.bounds, float("inf")], counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=total)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "graphcache_requests_total",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.hits = Counter("graphcache_hits_total", "artifact GETs answered from the store", registry=r)
        self.misses = Counter("graphcache_misses_total", "artifact GETs for absent keys", registry=r)
        self.bytes_served = Counter("graphcache_bytes_served_total", "artifact bytes sent", registry=r)
        self.served_build_seconds = Counter(
            "graphcache_served_build_seconds_total",
            "build seconds of the artifacts served: GPU time the clients did not spend building",
            registry=r,
        )
        self.served_sizes = SizeHistogram(
            "graphcache_served_artifact_bytes",
            "sizes of the artifacts served (GET and batch)",
            buckets=tuple(2**n for n in range(12, 28, 2)),  # 4 KiB .. 64 MiB
            registry=r,
        )
        self.batches = Counter("graphcache_batches_total", "POST /v1/batch requests answered", registry=r)
        self.uploads = Counter("graphcache_uploads_total", "accepted uploads", ["result"], registry=r)
        self.rejected = Counter(
            "graphcache_uploads_rejected_total", "refused uploads by reason", ["reason"], registry=r
        )
        self.refused = Counter(
            "graphcache_refused_total",
            "stored entries not served for their signature (unsigned, bad_signature); left in the store",
            ["reason"],
            registry=r,
        )
        self.quarantined = Counter(
            "graphcache_quarantined_total",
            "stored entries that failed verification and were set aside",
            ["reason"],
            registry=r,
        )
        self.builds = Counter("graphcache_builds_total", "graphs built by POST /v1/build", ["result"], registry=r)
        self.build_seconds = Histogram(
            "graphcache_build_seconds",
            "seconds per build",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.store_errors = Counter("graphcache_store_errors_total", "store operations that failed", registry=r)
        self.verified_cache = Gauge(
            "graphcache_verified_entries", "entries whose file identity is remembered as verified", registry=r
        )
        self._server: _Count | None = None
        self._server_info: dict[str, Any] = {}

    def watch_store(self, unwritable: Callable[[], str | None], bookkeeping_errors: Callable[[], int]) -> None:
        """Gauges read at each scrape: whether the store takes writes (0 on a
        full disk) and how many read bookkeeping writes it could not make."""
        writable = Gauge(
            "graphcache_store_writable",
            "1 when an upload would be stored now, 0 when the store is out of space (healthz says why)",
            registry=self.registry,
        )
        writable.set_function(lambda: 0.0 if unwritable() else 1.0)
        self.registry.register(
            _Count(
                "graphcache_store_bookkeeping_errors",
                "access-time updates a read could not write (a full disk); the reads were served",
                bookkeeping_errors,
            )
        )

    def watch_server(self, info: dict[str, Any]) -> None:
        """Counters the server's protocol keeps (service.transport's
        ``SERVER`` extension), read at each scrape."""
        if self._server is None:
            self._server = _Count(
                "graphcache_send_timeouts",
                "connections closed because the client did not drain its answer within GRAPHCACHE_SEND_TIMEOUT",
                lambda: int(self._server_info.get("send_timeouts", 0)),
            )
            self.registry.register(self._server)
        self._server_info = info

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Count(Collector):
    """A counter whose value another part keeps (read at each scrape)."""

    def __init__(self, name: str, documentation: str, count: Callable[[], int]) -> None:
        self.name = name
        self.documentation = documentation
        self.count = count

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.count())

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, "")


KNOWN_ROUTES = (
    "/v1/artifacts",
    "/v1/purge",
    "/v1/batch",
    "/v1/resolve",
    "/v1/build",
    "/v1/stats",
    "/healthz",
    "/metrics",
    "/docs",
    "/openapi.json",
    "/docs/oauth2-redirect",
)


def route_label(path: str) -> str:
    """The route template a request path is counted under."""
    if path.startswith("/v1/artifacts/"):
        # pin and unpin are routes of their own, not artifact DELETEs
        return "/v1/artifacts/{key}/pin" if path.endswith("/pin") else "/v1/artifacts/{key}"
    if path in KNOWN_ROUTES:
        return path
    return "/docs/assets" if path.startswith("/docs/assets/") else "other"
