"""A server's counters are the server's: `graphcache serve --workers 2`
answers the status page, /v1/stats and /metrics with the totals of every
worker, whichever worker takes the request, and keeps a worker's counts
when it is restarted."""

from __future__ import annotations

import os
import re
import signal
import time

import httpx

from tests.fakes import make_artifact, spec
from tests.servers import serve_workers
from tests.test_status_page import cells


def fresh(method: str, url: str, **kwargs):  # noqa: ANN003, ANN201
    """One request on a new connection, so that any worker may take it."""
    return httpx.request(method, url, headers={"connection": "close"}, timeout=10, **kwargs)


def upload(url: str, n: int) -> str:
    art = make_artifact(spec(seq_q=128 + n))
    answer = fresh("PUT", f"{url}/v1/artifacts/{art.key}", content=art.encode())
    assert answer.status_code == 201, answer.text
    return art.key


def stats_from_both_workers(url: str, expected: int) -> dict[int, dict]:  # noqa: ANN201
    """/v1/stats until both workers have answered it (each answer checked)."""
    seen: dict[int, dict] = {}
    deadline = time.monotonic() + 30
    while len(seen) < 2:
        assert time.monotonic() < deadline, f"only worker(s) {sorted(seen)} answered /v1/stats"
        stats = fresh("GET", f"{url}/v1/stats").json()
        assert stats["uploads"] == expected, stats
        seen[stats["worker"]["pid"]] = stats
    return seen


def test_two_workers_report_the_servers_totals_whichever_worker_took_the_uploads(tmp_path):
    with serve_workers({"GRAPHCACHE_DIR": str(tmp_path / "store")}, workers=2) as (url, _proc):
        keys = [upload(url, n) for n in range(6)]
        for key in keys[:4]:
            assert fresh("GET", f"{url}/v1/artifacts/{key}").status_code == 200
        assert fresh("GET", f"{url}/v1/artifacts/{'0' * 64}").status_code == 404
        seen = stats_from_both_workers(url, 6)
        for stats in seen.values():
            assert (stats["hits"], stats["misses"], stats["counters"], stats["workers"]) == (4, 1, "server", 2), stats
        for _ in range(6):  # the page, as either worker renders it
            page = fresh("GET", url + "/").text
            assert "this server, 2 worker processes" in page and "summed over the 2 workers of this server" in page
            counters = dict(cells(page, "counters"))
            assert (counters["uploads"], counters["hits"], counters["misses"]) == ("6", "4", "1"), counters
        for _ in range(6):
            metrics = fresh("GET", f"{url}/metrics").text
            assert 'graphcache_uploads_total{result="created"} 6.0' in metrics
            assert "graphcache_hits_total 4.0" in metrics
            assert re.search(
                r'graphcache_requests_total\{method="PUT",route="/v1/artifacts/\{key\}",status="201"\} 6\.0', metrics
            )


def test_a_restarted_worker_keeps_its_counts_in_the_servers_totals(tmp_path):
    with serve_workers({"GRAPHCACHE_DIR": str(tmp_path / "store")}, workers=2) as (url, _proc):
        for n in range(4):
            upload(url, n)
        seen = stats_from_both_workers(url, 4)
        victim = next(iter(seen))
        os.kill(victim, signal.SIGKILL)  # uvicorn's supervisor starts another in its place
        deadline = time.monotonic() + 60
        pids: set[int] = set()
        while not pids - set(seen):
            assert time.monotonic() < deadline, "no worker took the dead one's place"
            try:
                stats = fresh("GET", f"{url}/v1/stats").json()
            except httpx.TransportError:  # the connection the dead worker had accepted
                continue
            assert stats["uploads"] == 4, stats
            pids.add(stats["worker"]["pid"])
        upload(url, 4)
        assert all(s["uploads"] == 5 for s in stats_from_both_workers(url, 5).values())
