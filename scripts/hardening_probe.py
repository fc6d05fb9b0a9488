#!/usr/bin/env python3
"""The issue-27 and issue-33 probes, with figures: `graphcache serve` (one worker) on 127.0.0.1.

    python scripts/hardening_probe.py [--slow 1000] [--readers 200] [--non-readers 1000] [--held 260]
        [--redis-url redis://...] [--tree PATH] [--only body|budget|slow|redis|held|stalled|rss]

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
5. (issue 33) ``--held`` connections, no token, each declaring a 1 MiB
   manifest to POST / (Content-Length, then chunked) and sending nothing,
   with write tokens set: what an authenticated PUT, a GET and a batch are
   answered meanwhile.
6. (issue 33) 16 clients with a 4 KiB receive buffer that POST /v1/batch for
   100 x 64 KiB and never read, at --limit-concurrency 16 and
   GRAPHCACHE_SEND_TIMEOUT=2: when /v1/stats first answers 200; then
   ``--non-readers`` such clients at --limit-concurrency 256 (send timeout
   10 s) while GET /v1/stats and an artifact GET run for 5 s: GET count,
   errors, p50 and p99, the server's peak RSS, and how many non-readers the
   server had cut (and counted in graphcache_send_timeouts_total) after the
   deadline.
7. (issue 33) 16 concurrent uploads of real 63 MiB artifacts, the budget
   raised so that all are taken in at once: their answers and the server's
   RSS before and at its peak (VmHWM).

``--tree`` serves from another checkout (``git archive COMMIT | tar -x -C
/tmp/base``) for the figures before a change.
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

from graphcache.artifact import Artifact, frame  # noqa: E402
from graphcache.spec import GraphSpec  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from graphcache.target import Target  # noqa: E402
from tests.servers import (  # noqa: E402
    batch_request,
    drained,
    free_port,
    non_reader,
    raw_gets,
    raw_put,
    serve_one_worker,
    slow_sender,
)

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
WRITE = "probe-write"


def artifact(batch: int, size: int) -> Artifact:
    spec = GraphSpec.from_dict({"batch": batch, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "causal"})
    return Artifact(spec=spec, target=TARGET, payload=os.urandom(size))


def serve(env: dict[str, str], *args: str) -> Any:
    return serve_one_worker(env, *args, tree=TREE)


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed_gets(client: httpx.Client, paths: tuple[str, ...], times: list[float], errors: list[str]) -> None:
    """GET each of ``paths`` once: each wall time into ``times``, each answer
    other than 200 (or transport error) into ``errors``."""
    for path in paths:
        start = time.perf_counter()
        try:
            got = client.get(path)
            if got.status_code != 200:
                errors.append(str(got.status_code))
        except httpx.TransportError as exc:
            errors.append(type(exc).__name__)
        times.append(time.perf_counter() - start)


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
                    timed_gets(client, ("/healthz", f"/v1/artifacts/{art.key}"), times, errors)

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


def probe_held_bodies(folder: str, count: int) -> None:
    """``count`` unauthenticated POST / bodies declared and never sent, vs an
    authenticated PUT, a GET and a batch."""
    env = {"GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_DIR": str(Path(folder) / "held")}
    auth = {"authorization": f"Bearer {WRITE}"}
    with serve(env) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        framings = {"Content-Length: 1048576": "content-length: 1048576", "chunked": "transfer-encoding: chunked"}
        for n, (name, framing) in enumerate(framings.items()):
            head = f"POST / HTTP/1.1\r\nhost: p\r\ncontent-type: application/json\r\n{framing}\r\n\r\n".encode()
            held = []
            try:
                for _ in range(count):
                    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                    sock.sendall(head)
                    held.append(sock)
                time.sleep(1.0)
                art = artifact(10 + n, 100_000)
                put = httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers=auth, timeout=10)
                got = httpx.get(f"{url}/v1/artifacts/{art.key}", timeout=10)
                batch = httpx.post(f"{url}/v1/batch", json={"keys": [art.key]}, timeout=10)
                code = "" if put.status_code == 201 else f" {put.json().get('error', '')}"
                print(
                    f"{count} held POST / bodies ({name}), no token: authenticated PUT "
                    f"{put.status_code}{code}, GET {got.status_code}, batch {batch.status_code}"
                )
            finally:
                for sock in held:
                    sock.close()
            time.sleep(0.5)


def probe_non_readers(folder: str, count: int) -> None:
    """Clients that never read their batch answer, vs /v1/stats and GETs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 3 * count + 200)), hard))
    where = Path(folder) / "stalled"
    store = DiskStore(where)
    arts = [artifact(b, 64 * 1024) for b in range(1, 101)]
    for art in arts:
        store.put(art.key, art.encode())
    store.close()
    keys = [a.key for a in arts]
    request = batch_request(keys)

    env = {"GRAPHCACHE_DIR": str(where), "GRAPHCACHE_SEND_TIMEOUT": "2"}
    with serve(env, "--limit-concurrency", "16") as (url, _):
        httpx.post(f"{url}/v1/batch", json={"keys": keys}, timeout=30)
        readers = [non_reader(int(url.rsplit(":", 1)[1]), request) for _ in range(16)]
        start = time.monotonic()
        first = None
        while first is None and time.monotonic() - start < 15:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/v1/stats", timeout=1).status_code == 200:
                    first = time.monotonic() - start
            time.sleep(0.05)
        for sock in readers:
            sock.close()
    shown = "never within 15 s" if first is None else f"after {first:.2f} s"
    print(f"16 non-readers of a 100 x 64 KiB batch (--limit-concurrency 16, send timeout 2 s): /v1/stats 200 {shown}")

    env = {"GRAPHCACHE_DIR": str(where), "GRAPHCACHE_SEND_TIMEOUT": "10"}
    with serve(env, "--limit-concurrency", "256") as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        whole = len(httpx.post(f"{url}/v1/batch", json={"keys": keys}, timeout=30).content)
        before = peak = rss_mib(proc.pid)
        readers = []
        refused = 0
        for _ in range(count):
            try:
                readers.append(non_reader(port, request))
            except OSError:
                refused += 1
        opened = time.monotonic()
        times: list[float] = []
        errors: list[str] = []
        with httpx.Client(base_url=url, timeout=10) as client:
            while time.monotonic() - opened < 5:
                timed_gets(client, ("/v1/stats", f"/v1/artifacts/{keys[0]}"), times, errors)
                peak = max(peak, rss_mib(proc.pid))
        while time.monotonic() - opened < 13:  # past the 10 s deadline
            peak = max(peak, rss_mib(proc.pid))
            time.sleep(0.2)
        sample = readers[:50]
        cut = sum(1 for size, closed in map(lambda s: drained(s, 2), sample) if closed and size < whole)
        timeouts = next(
            (
                line.split()[-1]
                for line in httpx.get(f"{url}/metrics").text.splitlines()
                if line.startswith("graphcache_send_timeouts_total ")
            ),
            "n/a",
        )
        for sock in readers:
            sock.close()
    print(
        f"{count} non-readers of a 100 x 64 KiB batch (--limit-concurrency 256, send timeout 10 s): "
        f"{len(times)} GETs in 5 s, {len(errors)} errors {dict(Counter(errors))}, {percentiles(times)}; "
        f"server RSS {before:.0f} MiB before, peak {peak:.0f} MiB"
    )
    print(
        f"  after the deadline: {cut} of {len(sample)} non-readers sampled cut short by the server; "
        f"graphcache_send_timeouts_total {timeouts}"
    )


def probe_upload_rss(folder: str) -> None:
    """16 concurrent uploads of real 63 MiB artifacts, all taken in at once."""
    payload = os.urandom(63 * 1024**2 - 4096)
    arts = [Artifact(spec=artifact(b, 16).spec, target=TARGET, payload=payload) for b in range(1, 17)]
    parts = [[frame(a.header(), b""), a.payload] for a in arts]
    env = {
        "GRAPHCACHE_WRITE_TOKENS": WRITE,
        "GRAPHCACHE_DIR": str(Path(folder) / "rss"),
        "GRAPHCACHE_UPLOAD_BUDGET": str(16 * 64 * 1024**2),
    }
    with serve(env) as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        warm = artifact(99, 100_000)
        raw_put(port, warm.key, [warm.encode()], WRITE)
        before = rss_mib(proc.pid)
        statuses: list[str] = []

        def upload(n: int) -> None:
            try:
                statuses.append(str(raw_put(port, arts[n].key, parts[n], WRITE)[0]))
            except OSError as exc:
                statuses.append(type(exc).__name__)

        start = time.monotonic()
        threads = [threading.Thread(target=upload, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        took = time.monotonic() - start
        peak = rss_mib(proc.pid, "VmHWM")
    print(
        f"16 concurrent 63 MiB artifact uploads (budget 1 GiB: all taken in): {dict(Counter(statuses))} in "
        f"{took:.1f} s; server RSS {before:.0f} MiB before, peak (VmHWM) {peak:.0f} MiB: +{peak - before:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=200)
    parser.add_argument("--non-readers", type=int, default=1000)
    parser.add_argument("--held", type=int, default=260)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--tree", type=Path, default=ROOT, help="serve from this checkout (a baseline worktree)")
    parser.add_argument("--only", choices=("body", "budget", "slow", "redis", "held", "stalled", "rss"), default=None)
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
        if args.only in (None, "held"):
            probe_held_bodies(folder, args.held)
        if args.only in (None, "stalled"):
            probe_non_readers(folder, args.non_readers)
        if args.only in (None, "rss"):
            probe_upload_rss(folder)


if __name__ == "__main__":
    main()
