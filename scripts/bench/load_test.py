#!/usr/bin/env python3
"""Load test: readers and writers against a server on 127.0.0.1.

    python scripts/bench/load_test.py [--readers 64] [--writers 8] [--duration 60] [--url URL]

Without --url it starts `graphcache serve` on a fresh DiskStore (and stops
it). Readers GET random known keys and verify every envelope; writers PUT
new artifacts and confirm each by a GET. At the end every written key is
fetched once more and verified. Prints counts, errors and p50/p99 per
operation; exits 1 on any error, lost or garbled entry.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache import Artifact, CorruptArtifact, GraphSpec, Target  # noqa: E402

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
SIZES = (64 * 1024, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024)


def artifact(n: int) -> Artifact:
    spec = GraphSpec(batch=1 + n % 64, heads_q=8, seq_q=8 * (1 + n // 64), head_dim=64)
    return Artifact(spec=spec, target=TARGET, payload=os.urandom(SIZES[n % len(SIZES)]))


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


async def run(url: str, readers: int, writers: int, duration: float, token: str | None) -> dict:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    limits = httpx.Limits(max_connections=readers + writers + 4)
    known: dict[str, str] = {}  # key -> payload sha256
    errors: list[str] = []
    lat: dict[str, list[float]] = {"get": [], "put": []}
    counter = iter(range(10**9))
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits, headers=headers) as client:
        for _ in range(16):  # seed
            art = artifact(next(counter))
            r = await client.put(f"/v1/artifacts/{art.key}", content=art.encode())
            if r.status_code not in (200, 201):
                raise SystemExit(f"seeding failed: {r.status_code} {r.text}")
            known[art.key] = art.payload_sha256
        deadline = time.monotonic() + duration

        async def reader() -> None:
            while time.monotonic() < deadline:
                key = random.choice(list(known))
                t0 = time.perf_counter()
                try:
                    r = await client.get(f"/v1/artifacts/{key}")
                    lat["get"].append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        errors.append(f"GET {key[:12]}: {r.status_code}")
                        continue
                    got = Artifact.decode(r.content, expected_key=key)
                    if got.payload_sha256 != known[key]:
                        errors.append(f"GET {key[:12]}: garbled (other payload)")
                except (httpx.HTTPError, CorruptArtifact) as exc:
                    errors.append(f"GET {key[:12]}: {type(exc).__name__}: {exc}")

        async def writer() -> None:
            while time.monotonic() < deadline:
                art = artifact(next(counter))
                data = art.encode()
                t0 = time.perf_counter()
                try:
                    r = await client.put(f"/v1/artifacts/{art.key}", content=data)
                    lat["put"].append(time.perf_counter() - t0)
                    if r.status_code not in (200, 201):
                        errors.append(f"PUT {art.key[:12]}: {r.status_code} {r.text[:100]}")
                        continue
                    known[art.key] = art.payload_sha256
                except httpx.HTTPError as exc:
                    errors.append(f"PUT {art.key[:12]}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*[reader() for _ in range(readers)], *[writer() for _ in range(writers)])
        lost = garbled = 0
        for key, sha in list(known.items()):
            r = await client.get(f"/v1/artifacts/{key}")
            if r.status_code != 200:
                lost += 1
                continue
            try:
                if Artifact.decode(r.content, expected_key=key).payload_sha256 != sha:
                    garbled += 1
            except CorruptArtifact:
                garbled += 1
    return {
        "readers": readers,
        "writers": writers,
        "duration_s": duration,
        "gets": len(lat["get"]),
        "puts": len(lat["put"]),
        "entries": len(known),
        "errors": len(errors),
        "first_errors": errors[:10],
        "lost": lost,
        "garbled": garbled,
        "get_p50_ms": pct(lat["get"], 0.5),
        "get_p99_ms": pct(lat["get"], 0.99),
        "put_p50_ms": pct(lat["put"], 0.5),
        "put_p99_ms": pct(lat["put"], 0.99),
        "get_mean_ms": statistics.mean(lat["get"]) * 1e3 if lat["get"] else 0.0,
    }


def start_server(folder: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GRAPHCACHE_DIR": folder, "GRAPHCACHE_SIZE_LIMIT": str(20 * 1024**3)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readers", type=int, default=64)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60)
    parser.add_argument("--url", default=None, help="an already running server (default: start one)")
    parser.add_argument("--token", default=os.environ.get("GRAPHCACHE_TOKEN"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url
        if url is None:
            proc, url = start_server(tmp)
        try:
            result = asyncio.run(run(url, args.readers, args.writers, args.duration, args.token))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    print(f"{result['readers']} readers, {result['writers']} writers, {result['duration_s']:g}s against {url}")
    print(f"GET: {result['gets']} requests, p50 {result['get_p50_ms']:.1f} ms, p99 {result['get_p99_ms']:.1f} ms")
    print(f"PUT: {result['puts']} requests, p50 {result['put_p50_ms']:.1f} ms, p99 {result['put_p99_ms']:.1f} ms")
    print(f"entries {result['entries']}, errors {result['errors']}, lost {result['lost']}, garbled {result['garbled']}")
    for line in result["first_errors"]:
        print("  ", line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if result["errors"] or result["lost"] or result["garbled"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
