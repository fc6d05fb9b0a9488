#!/usr/bin/env python3
"""The issue-27 probes, with figures: `graphcache serve` (one worker) on 127.0.0.1.

    python scripts/hardening_probe.py [--slow 1000] [--readers 200] [--redis-url redis://...]
        [--tree PATH] [--only body|budget|slow|redis]

1. A body declared 2 GiB (1 MiB of it sent) to POST /v1/build without a
   token, with write tokens set: the status, how long it took, the server's
   RSS before and after.
2. 16 concurrent uploads of 63 MiB: what they were answered, and the
   server's peak RSS (GRAPHCACHE_UPLOAD_BUDGET).
3. ``--slow`` connections sending a /v1/resolve body a byte a second while
   GET /healthz and GET of an artifact run for 5 s: GET count, errors, p50
   and p99; then what the slow senders were answered.
4. ``--readers`` concurrent readers of 64 KiB entries over Redis (a private
   redis-server, or --redis-url), 20 GETs each on kept-alive connections:
   GET count, errors, p50 and p99.

``--tree`` serves from another checkout (``git worktree add --detach
/tmp/base COMMIT``) for the figures before a change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TREE = ROOT  # the tree whose server is probed (--tree)

from graphcache.artifact import Artifact  # noqa: E402
from graphcache.spec import GraphSpec  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from graphcache.target import Target  # noqa: E402
from tests.servers import free_port, raw_gets, serve_one_worker, slow_sender  # noqa: E402

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
WRITE = "probe-write"


def artifact(batch: int, size: int) -> Artifact:
    spec = GraphSpec.from_dict({"batch": batch, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "causal"})
    return Artifact(spec=spec, target=TARGET, payload=os.urandom(size))


def serve(env: dict[str, str], *args: str) -> Any:
    return serve_one_worker(env, *args, tree=TREE)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentiles(times: list[float]) -> str:
    if len(times) < 2:
        return "n/a"
    cuts = statistics.quantiles(times, n=100)
    return f"p50 {cuts[49] * 1000:.1f} ms, p99 {cuts[98] * 1000:.1f} ms"


def probe_big_body(folder: str) -> None:
    env = {"GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_DIR": folder}
    with serve(env) as (url, proc):
        before = rss_mib(proc.pid)
        port = int(url.rsplit(":", 1)[1])
        start = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"POST /v1/build HTTP/1.1\r\nhost: p\r\ncontent-length: {2 * 1024**3}\r\n\r\n".encode())
            with contextlib.suppress(OSError):
                for _ in range(16):
                    sock.sendall(b"[" * 65536)
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                answer = b"no answer within 30 s (the server waits for the body)"
        took = time.monotonic() - start
        status = answer.split(b"\r\n", 1)[0].decode()
        print(f"2 GiB body, no token, POST /v1/build: {status} in {took * 1000:.0f} ms;")
        print(f"  server RSS {before:.0f} MiB before, {rss_mib(proc.pid):.0f} MiB after")


def probe_budget(folder: str) -> None:
    """16 concurrent uploads of 63 MiB (bytes that are no artifact: each is
    refused once read): the answers and the server's peak RSS."""
    env = {"GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_DIR": folder}
    body = os.urandom(63 * 1024**2)
    with serve(env) as (url, proc):
        before = peak = rss_mib(proc.pid)
        statuses: list[str] = []

        def upload(n: int) -> None:
            key = f"{n:064x}"
            try:
                got = httpx.put(
                    f"{url}/v1/artifacts/{key}", content=body, headers={"authorization": f"Bearer {WRITE}"}, timeout=120
                )
                statuses.append(str(got.status_code))
            except httpx.TransportError as exc:
                statuses.append(type(exc).__name__)

        threads = [threading.Thread(target=upload, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, rss_mib(proc.pid))
            time.sleep(0.05)
    print(
        f"16 concurrent 63 MiB uploads: {dict(Counter(statuses))}; server RSS {before:.0f} MiB before, peak {peak:.0f} MiB"
    )


def probe_slow_senders(folder: str, count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 3 * count + 200)), hard))
    art = artifact(2, 10_000)
    store = DiskStore(Path(folder) / "slow")
    store.put(art.key, art.encode())
    store.close()
    env = {"GRAPHCACHE_DIR": str(Path(folder) / "slow"), "GRAPHCACHE_UPLOAD_TIMEOUT": "10"}
    with serve(env, "--limit-concurrency", "256") as (url, _):
        port = int(url.rsplit(":", 1)[1])
        times: list[float] = []
        errors: list[str] = []

        def reads(done: threading.Event) -> None:
            with httpx.Client(base_url=url, timeout=10) as client:
                while not done.is_set():
                    for path in ("/healthz", f"/v1/artifacts/{art.key}"):
                        start = time.perf_counter()
                        try:
                            got = client.get(path)
                            if got.status_code != 200:
                                errors.append(str(got.status_code))
                        except httpx.TransportError as exc:
                            errors.append(type(exc).__name__)
                        times.append(time.perf_counter() - start)

        async def main() -> list[str]:
            stop = asyncio.Event()
            senders = [asyncio.ensure_future(slow_sender(port, stop)) for _ in range(count)]
            await asyncio.sleep(3)
            done = threading.Event()
            thread = threading.Thread(target=reads, args=(done,))
            thread.start()
            await asyncio.sleep(5)
            done.set()
            await asyncio.to_thread(thread.join)
            await asyncio.sleep(9)
            stop.set()
            return await asyncio.gather(*senders)

        answers = asyncio.run(main())
    print(
        f"{count} slow senders (--limit-concurrency 256): {len(times)} GETs, {len(errors)} errors, {percentiles(times)}"
    )
    print(f"  slow senders answered: {dict(Counter(answers))}")


def probe_redis_readers(readers: int, redis_url: str | None) -> None:
    proc = None
    if redis_url is None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        redis_url = f"redis://127.0.0.1:{port}/0"
        time.sleep(0.5)
    arts = [artifact(b, 64 * 1024) for b in range(1, 9)]
    try:
        with serve({"GRAPHCACHE_WRITE_TOKENS": WRITE}, "--store", redis_url) as (url, _):
            auth = {"authorization": f"Bearer {WRITE}"}
            for art in arts:
                httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers=auth)
            port = int(url.rsplit(":", 1)[1])

            async def main() -> list[list[tuple[int, bytes, float]]]:
                paths = [[f"/v1/artifacts/{arts[(n + i) % len(arts)].key}" for i in range(20)] for n in range(readers)]
                return await asyncio.gather(*(raw_gets(port, p) for p in paths))

            start = time.perf_counter()
            answers = [a for reader in asyncio.run(main()) for a in reader]
            wall = time.perf_counter() - start
        statuses = Counter(status for status, _, _ in answers)
        times = [t for _, _, t in answers]
        errors = len(answers) - statuses[200]
        print(
            f"{readers} readers of 64 KiB over Redis, one worker: {len(answers)} GETs in {wall:.1f} s, "
            f"{errors} errors {dict(statuses)}, {percentiles(times)}"
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=200)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--tree", type=Path, default=ROOT, help="serve from this checkout (a baseline worktree)")
    parser.add_argument("--only", choices=("body", "budget", "slow", "redis"), default=None)
    args = parser.parse_args()
    global TREE  # noqa: PLW0603 - read by serve()
    TREE = args.tree.resolve()
    with tempfile.TemporaryDirectory() as folder:
        if args.only in (None, "body"):
            probe_big_body(folder)
        if args.only in (None, "budget"):
            probe_budget(folder)
        if args.only in (None, "slow"):
            probe_slow_senders(folder, args.slow)
        if args.only in (None, "redis"):
            probe_redis_readers(args.readers, args.redis_url)


if __name__ == "__main__":
    main()
