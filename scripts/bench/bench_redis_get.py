#!/usr/bin/env python3
"""Single artifact GETs from `graphcache serve --store redis://...`: the
cost of calling Redis from a thread (issue 20: no store I/O on the event
loop) against a baseline source tree that called it on the loop.

Each tree's server (`--workers 1`, defaults otherwise) runs on one private
redis-server holding ``--count`` artifacts of ``--size`` bytes; one client
(http.client, one keep-alive connection, and ``--clients`` threads for the
throughput line) GETs keys in rotation. Rounds alternate between the trees;
medians of rounds are printed, and the per-round ratio new/baseline.

    git worktree add --detach /tmp/base <commit before the change>
    python scripts/bench/bench_redis_get.py --baseline /tmp/base [--rounds 5]

Needs redis-server. 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graphcache import Artifact, GraphSpec, Target  # noqa: E402
from graphcache.stores.redis import RedisStore  # noqa: E402
from tests.servers import RedisServer, free_port, stop_processes, wait_http  # noqa: E402


def serve(tree: Path, redis_url: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--workers", "1"]
    cmd += ["--store", redis_url, "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, cwd=tree, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return proc, port


def latency(port: int, keys: list[str], seconds: float) -> float:
    """Median milliseconds of sequential GETs over one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    times: list[float] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        start = time.perf_counter()
        conn.request("GET", f"/v1/artifacts/{keys[i % len(keys)]}")
        response = conn.getresponse()
        response.read()
        times.append(time.perf_counter() - start)
        assert response.status == 200, response.status
        i += 1
    conn.close()
    return statistics.median(times) * 1e3


def throughput(port: int, keys: list[str], seconds: float, clients: int) -> float:
    counts = [0] * clients

    def run(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        end = time.monotonic() + seconds
        i = n
        while time.monotonic() < end:
            conn.request("GET", f"/v1/artifacts/{keys[i % len(keys)]}")
            conn.getresponse().read()
            counts[n] += 1
            i += clients
        conn.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="source tree of the baseline")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    target = Target.parse("h200-sm90-mp132-cudnn9.28.0-fe1.32.0")
    with RedisServer() as redis_srv:
        store = RedisStore(redis_srv.url)
        keys = []
        for n in range(args.count):
            art = Artifact(
                spec=GraphSpec(batch=n + 1, heads_q=8, seq_q=128, head_dim=64),
                target=target,
                payload=os.urandom(args.size),
            )
            store.put(art.key, art.encode())
            keys.append(art.key)
        trees = {"baseline": args.baseline.resolve(), "this tree": ROOT}
        servers = {name: serve(tree, redis_srv.url) for name, tree in trees.items()}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        try:
            for _ in range(args.rounds):
                for name, (_, port) in servers.items():
                    results[name].append(
                        (latency(port, keys, args.seconds), throughput(port, keys, args.seconds, args.clients))
                    )
        finally:
            stop_processes([proc for proc, _ in servers.values()])
    print(
        f"GET {args.size // 1024} KiB from Redis, {args.count} keys rotating, {args.rounds} alternating rounds "
        f"of {args.seconds:g}s (medians); `graphcache serve --workers 1`; one client, then {args.clients} threads"
    )
    for name, rows in results.items():
        lat = statistics.median(r[0] for r in rows)
        rps = statistics.median(r[1] for r in rows)
        print(f"  {name:9s} p50 {lat:.3f} ms   {rps:.0f} req/s")
    lat_ratio = [n[0] / b[0] for n, b in zip(results["this tree"], results["baseline"], strict=True)]
    rps_ratio = [n[1] / b[1] for n, b in zip(results["this tree"], results["baseline"], strict=True)]
    print(
        f"  this tree / baseline: latency {statistics.median(lat_ratio):.2f}x, throughput {statistics.median(rps_ratio):.2f}x"
    )
    print(
        f"  per round: latency {', '.join(f'{r:.2f}' for r in lat_ratio)}; throughput {', '.join(f'{r:.2f}' for r in rps_ratio)}"
    )


if __name__ == "__main__":
    main()
