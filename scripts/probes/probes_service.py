"""The service's probes of trust, round five, run by ``scripts/probes/hardening_probe.py``
(``--only endless|layout|manifest-cost``); each against the code of ``tree``
(this checkout, or a baseline's: ``--tree``), on 127.0.0.1.

endless
    A server on 127.0.0.1 answering ``HttpStore`` (in a process of its own,
    with GRAPHCACHE_MAX_ARTIFACT as the environment sets it, else 64 MiB; its address space
    capped at 2 GiB) with endless chunked bodies: bytes that are no
    envelope; an envelope head declaring 1 TiB; an envelope head declaring
    a payload 64 KiB under the limit, then more without end; a listing page
    of JSON without end. Per answer: what the client did, when, and its
    peak RSS (VmHWM) over what it was before.
layout
    ``POST /v1/resolve`` of a spec whose layout is ``bhs[+10**38 - 1]d``,
    and ``graphcache warm`` of a manifest naming it: the status and the
    first words of the answer; warm's exit status, its lines, whether
    anything was stored.
manifest-cost
    `graphcache serve` (one worker) on a store of 200 entries: one
    1 KB manifest of 4,096 exact specs posted to ``/`` (its status, wall
    time and the server's CPU seconds); GETs of one artifact on 4 kept-alive
    connections for ``seconds`` (quiet: count per second, p50, p99); then
    the same GETs while 16 such manifests are posted at once, from 16
    loopback addresses (127.0.0.2 to 127.0.0.17: 16 clients), then from one:
    the manifests' statuses, the GETs' rate, p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

from graphcache.artifact import Artifact, frame
from graphcache.spec import GraphSpec
from graphcache.stores import DiskStore
from graphcache.target import Target
from tests.servers import Hostile, endless, raw_gets, serve_one_worker

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
MiB = 1024**2
M4096 = (
    "defaults: {heads_q: 8, head_dim: 64, dtype: bfloat16, shapes: exact}\ngraphs:\n  - name: m\n"
    f"    batch: [{','.join(map(str, range(1, 17)))}]\n    seq_q: [{','.join(map(str, range(1, 257)))}]\n"
)
GAP = "bhs[+99999999999999999999999999999999999999]d"


def artifact(batch: int, size: int = 4096) -> Artifact:
    spec = GraphSpec.from_dict({"batch": batch, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "causal"})
    return Artifact(spec=spec, target=TARGET, payload=os.urandom(size))


def cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and of every live process under it (a
    server's helper processes), and of those it has reaped."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own = sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return own + sum(cpu_seconds(child) for child in children)


def percentiles(times: list[float]) -> str:
    if len(times) < 2:
        return "n/a"
    cuts = statistics.quantiles(times, n=100)
    return f"p50 {cuts[49] * 1000:.1f} ms, p99 {cuts[98] * 1000:.1f} ms"


# -- endless ---------------------------------------------------------------------------------------


def _head(payload_size: int) -> bytes:
    header = artifact(1).header()
    header["payload_size"] = payload_size
    return frame(header, b"")


CLIENT = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from graphcache.settings import Settings
from graphcache.stores import open_store

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

store = open_store(Settings.from_env(), sys.argv[1])  # the tree's own HttpStore, bounded where it bounds
method, *args = json.loads(sys.argv[2])
before, start = peak(), time.monotonic()
try:
    result = getattr(store, method)(*args)
    said = "returned " + repr(list(result) if hasattr(result, "__next__") else result)[:60]
except BaseException as exc:
    said = f"{type(exc).__name__}: {str(exc)[:150]}"
print(json.dumps({"said": said, "seconds": time.monotonic() - start, "grew": peak() - before}))
"""


def probe_endless(tree: Path) -> None:
    """Endless answers to HttpStore: what it did, when, and its memory."""
    from graphcache.settings import Settings

    limit = Settings.from_env().max_artifact  # GRAPHCACHE_MAX_ARTIFACT, else GRAPHCACHE_MAX_UPLOAD: 64 MiB
    keys = {name: f"{n:x}" * 64 for n, name in enumerate(("garbage", "huge", "at-limit"), start=10)}
    head = _head(limit - 65536)

    def answer(line: str) -> tuple[str, Iterator[bytes]]:
        if keys["garbage"] in line:
            return "", endless(b"\0" * 65536)
        if keys["huge"] in line:
            return "", endless(b"\0" * 65536, _head(1 << 40))
        if keys["at-limit"] in line:
            return "", endless(b"\0" * 65536, head)
        return "", endless(b'{"key": "' + b"a" * 64 + b'", "size": 1},' * 1000, b'{"items": [')

    server = Hostile(answer)
    cases = {
        "bytes that are no envelope": ["get", keys["garbage"]],
        "an envelope head declaring 1 TiB": ["get", keys["huge"]],
        f"an envelope head declaring {len(head) + limit - 65536} bytes (64 KiB under the {limit >> 20} MiB "
        "limit), then more": [
            "get",
            keys["at-limit"],
        ],
        "a listing page of JSON (no envelope)": ["items"],
    }
    try:
        for name, call in cases.items():
            try:
                done = subprocess.run(
                    [sys.executable, "-c", CLIENT, server.url, json.dumps(call)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env={**os.environ, "PYTHONPATH": str(tree)},
                    cwd=tree,
                )
                seen = json.loads(done.stdout.strip().splitlines()[-1])
                print(
                    f"endless body, {name}: {seen['said']} after {seen['seconds']:.2f} s; "
                    f"client peak RSS +{seen['grew']:.1f} MiB"
                )
            except (subprocess.TimeoutExpired, IndexError, ValueError) as exc:
                print(f"endless body, {name}: no result ({type(exc).__name__})")
    finally:
        server.close()


# -- layout ----------------------------------------------------------------------------------------


def probe_layout(tree: Path, folder: str) -> None:
    """A layout group of 38 digits at /v1/resolve and in warm."""
    spec = {"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64, "dtype": "bfloat16", "layout": GAP}
    with serve_one_worker({"GRAPHCACHE_DIR": str(Path(folder) / "layout-served")}, tree=tree) as (url, _):
        answer = httpx.post(f"{url}/v1/resolve", json={"spec": spec, "target": str(TARGET)}, timeout=30)
        shown = answer.json().get("detail") or answer.json().get("key")
        print(f"layout {GAP!r}, POST /v1/resolve: {answer.status_code} {str(shown)[:160]}")
    manifest = Path(folder) / "gap.yaml"
    manifest.write_text(
        "defaults: {heads_q: 8, head_dim: 64, dtype: bfloat16}\n"
        f"graphs:\n  - {{name: gap, batch: 1, seq_q: 128, layout: '{GAP}'}}\n"
    )
    store = Path(folder) / "layout-warmed"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphcache",
            "warm",
            str(manifest),
            "--compiler",
            "reference",
            "--cache-dir",
            str(store),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "200"},
        cwd=tree,
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    kept = len(list(DiskStore(store).keys())) if store.exists() else 0
    print(
        f"layout {GAP!r}, graphcache warm: exit {done.returncode}, {len(lines)} line(s) "
        f"({lines[-1][:160] if lines else ''}); entries stored: {kept}"
    )


# -- manifest-cost ---------------------------------------------------------------------------------


def _gets(port: int, path: str, seconds: float, connections: int = 4) -> list[float]:
    """GET ``path`` on ``connections`` kept-alive connections for ``seconds``: each answer's time."""

    async def one() -> list[float]:
        out: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            out += [took for status, _, took in await raw_gets(port, [path] * 50) if status == 200]
        return out

    async def every() -> list[float]:
        return [t for times in await asyncio.gather(*(one() for _ in range(connections))) for t in times]

    return asyncio.run(every())


def _post(url: str, address: str, statuses: list[str]) -> None:
    transport = httpx.HTTPTransport(local_address=address)
    try:
        with httpx.Client(transport=transport, timeout=300) as client:
            statuses.append(str(client.post(f"{url}/", content=M4096).status_code))
    except httpx.TransportError as exc:
        statuses.append(type(exc).__name__)


def probe_manifest_cost(tree: Path, folder: str, entries: int = 200, seconds: float = 5.0) -> None:
    """16 concurrent 1 KB manifests of 4,096 specs beside a GET loop."""
    where = Path(folder) / "manifest-cost"
    store = DiskStore(where)
    made = artifact(1)
    for n in range(entries):
        made = artifact(1 + n)
        store.put(made.key, made.encode())
    store.close()
    path = f"/v1/artifacts/{made.key}"
    print(f"manifest cost: a {len(M4096)}-byte manifest of 4,096 exact specs; a store of {entries} entries, one target")
    with serve_one_worker({"GRAPHCACHE_DIR": str(where)}, tree=tree) as (url, proc):
        port = int(url.rsplit(":", 1)[1])
        httpx.get(f"{url}/", timeout=60)  # the holdings snapshot read once
        cpu, start = cpu_seconds(proc.pid), time.monotonic()
        one = httpx.post(f"{url}/", content=M4096, timeout=300)
        print(
            f"  one manifest: {one.status_code} in {time.monotonic() - start:.2f} s, "
            f"server CPU {cpu_seconds(proc.pid) - cpu:.2f} s"
        )
        quiet = _gets(port, path, seconds)
        print(f"  quiet: {len(quiet) / seconds:.0f} GET/s, {percentiles(quiet)}")
        for name, addresses in (
            ("16 clients", [f"127.0.0.{n}" for n in range(2, 18)]),
            ("one client", ["127.0.0.1"] * 16),
        ):
            statuses: list[str] = []
            posts = [threading.Thread(target=_post, args=(url, a, statuses)) for a in addresses]
            cpu, start = cpu_seconds(proc.pid), time.monotonic()
            for post in posts:
                post.start()
            loaded = _gets(port, path, seconds)
            for post in posts:
                post.join()
            print(
                f"  16 manifests at once from {name}: {dict(Counter(statuses))} after "
                f"{time.monotonic() - start:.1f} s (server CPU {cpu_seconds(proc.pid) - cpu:.1f} s); GETs meanwhile "
                f"{len(loaded) / seconds:.0f}/s, {percentiles(loaded)}"
            )


CHOICES = ("endless", "layout", "manifest-cost")


def run(only: str | None, tree: Path) -> None:
    """The probes ``only`` names (all three when None), against ``tree``."""
    with tempfile.TemporaryDirectory() as folder:
        if only in (None, "endless"):
            probe_endless(tree)
        if only in (None, "layout"):
            probe_layout(tree, folder)
        if only in (None, "manifest-cost"):
            probe_manifest_cost(tree, folder)
