"""Prometheus metrics, one registry per app (tests run several apps).

Where the server's workers share a folder (``service.workers``: `graphcache
serve --workers N`), every counter and histogram is kept in this worker's
file there and read as the sum over every worker's: ``render`` and
``totals`` are the server's. Figures that are one worker's (the entries
it remembers as verified) carry its ``pid`` label there."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from graphcache.errors import CORRUPT_REASONS, SIGNATURE_REASONS
from service import workers

# Why service.intake and the upload route refuse an upload, besides a corrupt
# envelope (CORRUPT_REASONS) and its signature (SIGNATURE_REASONS).
UPLOAD_REFUSALS = ("too_large", "budget", "body_budget", "timeout", "store_full")


class SizeHistogram(Collector):
    """A Prometheus histogram of byte sizes that takes a batch's sizes in one
    call: prometheus_client's ``observe`` is about 1 us each, 0.1 ms for a
    start-up batch of 100 entries. Exposed as any histogram is
    (``_bucket{le=...}``, ``_count``, ``_sum``), and kept as
    prometheus_client keeps a Histogram's values, so that a server of
    several workers sums it as it sums theirs."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[int], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = sorted(float(b) for b in buckets)
        # The last: above every bound (+Inf); counts per bucket, not cumulative, as Histogram keeps them.
        self._counts = [
            values.ValueClass("histogram", name, f"{name}_bucket", ("le",), (floatToGoString(b),), documentation)
            for b in [*self.bounds, float("inf")]
        ]
        self._sum = values.ValueClass("histogram", name, f"{name}_sum", (), (), documentation)
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, size: float) -> None:
        self.observe_many((size,))

    def observe_many(self, sizes: Iterable[float]) -> None:
        bounds = self.bounds
        added: dict[int, int] = {}
        total = 0.0
        for size in sizes:
            place = bisect_left(bounds, size)
            added[place] = added.get(place, 0) + 1
            total += size
        with self._lock:  # a collect sees a batch whole
            for place, count in added.items():
                self._counts[place].inc(count)
            self._sum.inc(total)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = [c.get() for c in self._counts], self._sum.get()
        cumulative, running = [], 0.0
        for bound, count in zip([*self.bounds, float("inf")], counts, strict=True):
            running += count
            cumulative.append((floatToGoString(bound), running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=total)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation)


@dataclass(frozen=True)
class Totals:
    """Every sample of the metrics at one moment: the server's, summed over
    its workers where they share a folder (``scope`` says which)."""

    samples: dict[str, tuple[tuple[dict[str, str], float], ...]]
    scope: str  # "server": every worker's; "process": this process's alone

    def value(self, name: str, **labels: str) -> float:
        """The sample ``name`` with exactly ``labels`` (0 when absent)."""
        return next((v for have, v in self.samples.get(name, ()) if have == labels), 0.0)

    def by(self, name: str, label: str) -> dict[str, float]:
        """The samples ``name``, by the value of their ``label``."""
        return {have[label]: v for have, v in self.samples.get(name, ()) if label in have}

    def sum(self, name: str) -> float:
        return sum(v for _, v in self.samples.get(name, ()))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.server = workers.shared()
        # What is exposed and read: the server's sum over its workers' files
        # when they share a folder (this registry's values are this worker's
        # file then), else this registry itself.
        self.exposed = self.registry
        if self.server is not None:
            self.exposed = CollectorRegistry()
            MultiProcessCollector(self.exposed, path=str(self.server.folder))
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
        self.quarantine_dropped = Counter(
            "graphcache_quarantine_dropped_total",
            "quarantined copies removed, oldest first, to keep the quarantine folder within "
            "GRAPHCACHE_QUARANTINE_SIZE (and 1,000 files)",
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
        self.bookkeeping_errors = Counter(
            "graphcache_store_bookkeeping_errors_total",
            "access-time updates a read could not write (a full disk); the reads were served",
            registry=r,
        )
        self.send_timeouts = Counter(
            "graphcache_send_timeouts_total",
            "connections closed because the client did not drain its answer within GRAPHCACHE_SEND_TIMEOUT",
            registry=r,
        )
        self.verified_cache = Gauge(
            "graphcache_verified_entries",
            "entries whose file identity is remembered as verified (each worker remembers its own)",
            registry=r,
            multiprocess_mode="liveall",  # one series per running worker, its pid as a label
        )
        self._server_info: dict[str, Any] | None = None
        self._declare_at_zero()

    def _declare_at_zero(self) -> None:
        """Every known label value of the labelled counters, at 0 from the
        start: a series a dashboard's rate() or increase() reads exists on a
        fresh replica, and, where workers share a folder, in the server's
        sum (which only lists series some worker has created)."""
        for result in ("created", "identical"):
            self.uploads.labels(result)
        for reason in (*UPLOAD_REFUSALS, *CORRUPT_REASONS, *SIGNATURE_REASONS):
            self.rejected.labels(reason)
        for reason in SIGNATURE_REASONS:
            self.refused.labels(reason)
        for reason in CORRUPT_REASONS:
            self.quarantined.labels(reason)
        for result in ("built", "failed"):
            self.builds.labels(result)

    def watch_store(self, unwritable: Callable[[], str | None], store: Any) -> None:
        """Read at each scrape: whether the store takes writes (0 on a full
        disk); counted as they happen: the read bookkeeping writes ``store``
        could not make (a DiskStore tells of each)."""
        self.exposed.register(
            _Gauge(
                "graphcache_store_writable",
                "1 when an upload would be stored now, 0 when the store is out of space (healthz says why)",
                lambda: 0.0 if unwritable() else 1.0,
            )
        )
        watchers = getattr(store, "bookkeeping_watchers", None)
        if watchers is not None:
            self.bookkeeping_errors.inc(int(getattr(store, "bookkeeping_errors", 0)))  # those before this app
            watchers.append(self.bookkeeping_errors.inc)

    def watch_server(self, info: dict[str, Any]) -> None:
        """The send timeouts the server's protocol counts (service.transport's
        ``SERVER`` extension): those before this call at once, each later
        one as it happens."""
        if self._server_info is info:
            return
        self._server_info = info
        self.send_timeouts.inc(int(info.get("send_timeouts", 0)))
        info["on_send_timeout"] = self.send_timeouts.inc

    def totals(self) -> Totals:
        """Every sample now: the server's where its workers share a folder."""
        if self.server is not None:
            workers.forget_dead(self.server.folder)
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for metric in self.exposed.collect():
            for sample in metric.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
        return Totals({k: tuple(v) for k, v in samples.items()}, "process" if self.server is None else "server")

    def render(self) -> bytes:
        if self.server is not None:
            workers.forget_dead(self.server.folder)
        return generate_latest(self.exposed)


class _Gauge(Collector):
    """A gauge read at each scrape from what another part knows (the same from every worker)."""

    def __init__(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        self.name = name
        self.documentation = documentation
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.name, self.documentation, value=self.read())

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.name, "")


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
