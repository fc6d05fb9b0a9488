#!/usr/bin/env python3
"""The issue-27, -33 and -41 probes, with figures: `graphcache serve` (one worker) on 127.0.0.1.

    python scripts/probes/hardening_probe.py [--slow 1000] [--readers 200] [--non-readers 1000] [--held 260]
        [--entries 20000] [--redis-url redis://...] [--tree PATH]
        [--only body|budget|slow|redis|held|stalled|rss|bomb|burst|swap|endless|layout|manifest-cost|
                zero|strides|race|misses|nan]
        [--seconds 60] [--calls 2000] [--shapes 90000]

Trust, round five's service probes (``endless``, ``layout``,
``manifest-cost``) live in ``scripts/probes/probes_service.py``, the library's
(``zero``, ``strides``, ``race``, ``misses``, ``nan``) in
``scripts/probes/probes_torch.py``; each says what its probes do.

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

8. (issue 41) Manifest bombs posted to the status page (``POST /``, open
   to anyone where reads are open): 3,978 bytes naming 10**9 specs
   (``batch: &v [1..1000]``, ``seq_q: *v``, ``seq_kv: *v``), then 420 bytes
   of nested aliases: each answer's status, size and time (the client waits
   at most 10 s, then leaves), and the server's RSS before, and 10 s after
   the first (peak, VmHWM).
9. (issue 41) 64 concurrent tokenless ``GET /`` on an ``--entries`` store
   (20,000 entries of 4 KiB), write tokens set: meanwhile ``/healthz``
   every 0.1 s (timeout 1 s) and an authenticated 50 KB PUT after each:
   how many /healthz answered 200 within 1 s, the slowest, and how many PUTs
   were stored, until the 64 pages are answered (at most 240 s).
10. (issue 41) The spool swap: a Redis store, uploads spooled in
   ``$TMPDIR/graphcache-uploads-UID``. As another local user (uid 54321, no
   account; needs root) the folder is made first, mode 0777; then a 4 MiB
   upload whose file that user replaces, mid-upload, with a forged
   envelope of the same key: whether the server started, what the upload
   was answered, and whether GET serves the forged bytes. Then the same
   swap by the server's own user racing the path (DiskStore and Redis).

11. The library's probes, ``zero``, ``strides``, ``race``, ``misses`` and
   ``nan`` (graphcache.torch and graphcache.hf, not the server; each in a
   child process): scripts/probes/probes_torch.py says what each measures;
   ``--seconds`` is the race's length, ``--calls`` the strides' calls,
   ``--shapes`` the missing shapes.

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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
TREE = ROOT  # the tree whose server is probed (--tree)

import probes_service  # noqa: E402 - scripts/probes/, beside this file
import probes_torch  # noqa: E402  (scripts/probes/probes_torch.py: the library's probes)

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


BOMB = (
    "defaults: {heads_q: 8, head_dim: 64}\ngraphs:\n  - name: bomb\n"
    f"    batch: &v [{','.join(str(n) for n in range(1, 1001))}]\n    seq_q: *v\n    seq_kv: *v\n"
)


def nested_aliases(levels: int = 9) -> str:
    """About 420 bytes whose aliases name 9**levels values: anchors made in a
    known field's list (dtype), the last one named by batch, so a spec error
    quoting batch's value once printed 9**8 numbers (191 MB)."""
    made = ["&a0 [1,1,1,1,1,1,1,1,1]"] + [f"&a{n} [{','.join([f'*a{n - 1}'] * 9)}]" for n in range(1, levels)]
    return (
        f"defaults: {{heads_q: 8, head_dim: 64, seq_q: 128, dtype: [{', '.join(made)}]}}\n"
        f"graphs: [{{name: x, batch: [*a{levels - 1}]}}]\n"
    )


def probe_manifest_bomb(folder: str) -> None:
    """Manifest bombs to POST /: answers, times, the server's memory."""
    where = Path(folder) / "bomb"
    store = DiskStore(where)
    art = artifact(1, 4096)
    store.put(art.key, art.encode())
    store.close()
    for name, body in (("10**9 specs", BOMB), ("nested aliases", nested_aliases())):
        with serve({"GRAPHCACHE_DIR": str(where)}) as (url, proc):
            httpx.get(f"{url}/", timeout=30)
            before = rss_mib(proc.pid)
            start = time.monotonic()
            try:
                got = httpx.post(f"{url}/", content=body, timeout=10)
                took = time.monotonic() - start
                answer = f"{got.status_code} {got.headers.get('content-type', '').split(';')[0]} of {len(got.content):,} bytes"
                answer += f" in {took * 1000:.0f} ms"
            except httpx.TransportError as exc:
                answer = f"no answer within 10 s ({type(exc).__name__}); the client left"
            time.sleep(max(0.0, 10 - (time.monotonic() - start)))
            after, peak = rss_mib(proc.pid), rss_mib(proc.pid, "VmHWM")
            alive = proc.poll() is None
            print(
                f"manifest bomb, {name} ({len(body):,} bytes) to POST /: {answer}; server RSS {before:.0f} MiB "
                f"before, {after:.0f} MiB 10 s after it was sent (peak {peak:.0f} MiB: +{peak - before:.0f} MiB)"
                + ("" if alive else "; the server died")
            )


def probe_status_burst(folder: str, entries: int) -> None:
    """64 tokenless GET / on a filled store vs /healthz and authenticated PUTs."""
    where = Path(folder) / "burst"
    store = DiskStore(where)
    payload = os.urandom(4096)
    for n in range(entries):
        spec = GraphSpec.from_dict({"batch": 1 + n % 64, "heads_q": 8, "seq_q": 128 + n // 64, "head_dim": 64})
        made = Artifact(spec=spec, target=TARGET, payload=payload)
        store.put(made.key, made.encode())
    store.close()
    env = {"GRAPHCACHE_DIR": str(where), "GRAPHCACHE_WRITE_TOKENS": WRITE}
    auth = {"authorization": f"Bearer {WRITE}"}
    with serve(env) as (url, _):
        pages: list[str] = []

        def page() -> None:
            try:
                pages.append(str(httpx.get(f"{url}/", timeout=240).status_code))
            except httpx.TransportError as exc:
                pages.append(type(exc).__name__)

        threads = [threading.Thread(target=page) for _ in range(64)]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        health: list[tuple[str, float]] = []
        puts: list[str] = []
        n = 0
        # Kept-alive clients: what is timed is the server's answer, not a
        # client made per request (each made an SSL context: seconds, on a busy host).
        with httpx.Client(base_url=url, timeout=1) as checker, httpx.Client(base_url=url, timeout=5) as writer:
            while any(t.is_alive() for t in threads) and time.monotonic() - start < 240:
                began = time.monotonic()
                try:
                    health.append((str(checker.get("/healthz").status_code), time.monotonic() - began))
                except httpx.TransportError as exc:
                    health.append((type(exc).__name__, time.monotonic() - began))
                made = artifact(1000 + n, 50_000)
                try:
                    puts.append(
                        str(writer.put(f"/v1/artifacts/{made.key}", content=made.encode(), headers=auth).status_code)
                    )
                except httpx.TransportError as exc:
                    puts.append(type(exc).__name__)
                n += 1
                time.sleep(max(0.0, 0.1 - (time.monotonic() - began)))
        wall = time.monotonic() - start
        for thread in threads:
            thread.join(1)
    good = sum(1 for status, took in health if status == "200" and took < 1.0)
    slowest = max((took for _, took in health), default=0.0)
    print(
        f"64 GET / on a {entries:,}-entry store: pages {dict(Counter(pages))} after {wall:.1f} s; /healthz "
        f"{good} of {len(health)} answered 200 within 1 s (slowest {slowest:.2f} s, {dict(Counter(s for s, _ in health))}); "
        f"authenticated PUTs {dict(Counter(puts))}"
    )


OTHER_UID = 54321


def swap_upload(url: str, good: Artifact, forged: Artifact, folder: Path, swapper: Any) -> tuple[int, str]:
    """PUT ``good``; when its file is in ``folder``, ``swapper(path, forged)``
    replaces it; then the rest is sent. (status, what GET serves)."""
    data = good.encode()
    head = f"PUT /v1/artifacts/{good.key} HTTP/1.1\r\nhost: p\r\nauthorization: Bearer {WRITE}\r\n"
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data[: 3 * 1024**2])
        deadline = time.monotonic() + 10
        while not (files := sorted(folder.glob(".upload-*"))) and time.monotonic() < deadline:
            time.sleep(0.02)
        if files:
            swapper(files[0], forged)
        sock.sendall(data[3 * 1024**2 :])
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status = int(answer.split(b" ", 2)[1]) if answer else 0
    served = httpx.get(f"{url}/v1/artifacts/{good.key}", timeout=30).content
    what = "the forged envelope" if served == forged.encode() else "what was sent" if served == data else "nothing"
    return status, what


def probe_spool_swap(folder: str, redis_url: str | None) -> None:
    base = Path(tempfile.mkdtemp(prefix="graphcache-probe-", dir="/tmp"))
    os.chmod(base, 0o711)
    pairs = []
    for n in range(3):  # one key per scenario (they share one Redis)
        good = artifact(77 + n, 4 * 1024**2)
        pairs.append(
            (good, Artifact(spec=good.spec, target=TARGET, payload=os.urandom(4 * 1024**2), created_at="forged"))
        )

    def replace_as(uid: int | None) -> Any:
        def swap(path: Path, art: Artifact) -> None:
            staged = base / f"forged-{uid}"
            staged.write_bytes(art.encode())
            os.chmod(staged, 0o644)
            if uid is None:
                os.replace(staged, path)
            else:  # copied into the folder (theirs, mode 0777) as that user, then moved over the file
                own = path.parent / ".forged"
                script = f"cp {staged} {own} && mv -f {own} {path}"
                subprocess.run(["sh", "-c", script], check=False, user=uid, group=uid, timeout=30)

        return swap

    proc = None
    try:
        if redis_url is None:
            port = free_port()
            proc = subprocess.Popen(
                [
                    shutil.which("redis-server") or "/usr/bin/redis-server",
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            redis_url = f"redis://127.0.0.1:{port}/0"
            time.sleep(0.5)
        if os.geteuid() == 0:
            tmp = base / "tmp-other"
            tmp.mkdir()
            os.chmod(tmp, 0o1777)
            spool = tmp / f"graphcache-uploads-{os.getuid()}"
            subprocess.run(["mkdir", "-m", "777", str(spool)], check=True, user=OTHER_UID, group=OTHER_UID, timeout=30)
            env = {"TMPDIR": str(tmp), "GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_DIR": str(base / "d1")}
            try:
                with serve(env, "--store", redis_url) as (url, _):
                    status, what = swap_upload(url, *pairs[0], spool, replace_as(OTHER_UID))
                    print(
                        f"spool swap by another local user (uid {OTHER_UID} made the folder first): server started; upload {status}; GET serves {what}"
                    )
            except AssertionError:
                print(
                    f"spool swap by another local user (uid {OTHER_UID} made the folder first): the server refused to start"
                )
        else:
            print("spool swap by another local user: skipped (needs root to act as another user)")
        for n, kind in enumerate(("disk", "redis"), 1):
            tmp = base / f"tmp-{kind}"
            tmp.mkdir()
            env = {"TMPDIR": str(tmp), "GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_DIR": str(base / f"d-{kind}")}
            args = ("--store", redis_url) if kind == "redis" else ()
            spool = tmp / f"graphcache-uploads-{os.getuid()}" if kind == "redis" else base / f"d-{kind}" / "incoming"
            with serve(env, *args) as (url, _):
                status, what = swap_upload(url, *pairs[n], spool, replace_as(None))
                print(
                    f"spool swap by the server's own user racing the path ({kind}): upload {status}; GET serves {what}"
                )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=200)
    parser.add_argument("--non-readers", type=int, default=1000)
    parser.add_argument("--held", type=int, default=260)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--tree", type=Path, default=ROOT, help="serve from this checkout (a baseline worktree)")
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument(
        "--only",
        choices=(
            "body",
            "budget",
            "slow",
            "redis",
            "held",
            "stalled",
            "rss",
            "bomb",
            "burst",
            "swap",
            *probes_service.CHOICES,
            *probes_torch.PROBES,
        ),
        default=None,
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="race: how long to install and uninstall")
    parser.add_argument("--calls", type=int, default=2000, help="strides: calls differing in size-1 strides")
    parser.add_argument("--shapes", type=int, default=90_000, help="misses: missing shapes")
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
        if args.only in (None, "bomb"):
            probe_manifest_bomb(folder)
        if args.only in (None, "burst"):
            probe_status_burst(folder, args.entries)
        if args.only in (None, "swap"):
            probe_spool_swap(folder, args.redis_url)
    if args.only is None or args.only in probes_service.CHOICES:
        probes_service.run(args.only, TREE)
    failed = 0
    for name in probes_torch.PROBES:
        if args.only in (None, name):
            failed += probes_torch.run(name, TREE, args.seconds, args.calls, args.shapes) != 0
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
