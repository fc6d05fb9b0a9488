#!/usr/bin/env python3
"""Worker start-up: N artifacts of 64 KiB in one POST /v1/batch, against nginx
serving the same bytes as one static file, and against N single GETs over one
keep-alive connection to the same server.

One client (Python's http.client, one keep-alive connection per way), on
127.0.0.1, the three ways in turn within each round so drift hits all alike;
medians over rounds, and the median of the per-round ratios. The server is
`graphcache serve` as it starts by default, on a DiskStore; nginx has one
worker and sendfile. Every way reads every byte; none verifies (the
transport is what is compared). A last line times HttpStore.get_many, which
also verifies each envelope, for reference.

    python scripts/bench/bench_startup.py [--count 100] [--size 65536] [--rounds 30]

Needs nginx (Debian package).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graphcache import Artifact, GraphSpec, Target  # noqa: E402
from graphcache.stores import DiskStore, HttpStore  # noqa: E402
from tests.servers import (  # noqa: E402
    free_port,
    nginx_binary,
    serve_process,
    static_nginx_conf,
    stop_processes,
    wait_http,
)

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")


def timed(fn) -> tuple[float, int]:  # noqa: ANN001
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--serve-args", default="", help="extra options for graphcache serve (default: none)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    nginx_bin = nginx_binary()
    if nginx_bin is None:
        sys.exit("nginx is not installed: apt-get install nginx")

    tmp = Path(tempfile.mkdtemp(prefix="gc-startup-"))
    tmp.chmod(0o755)
    store = DiskStore(tmp / "store")
    keys, blobs = [], []
    for i in range(args.count):
        spec = GraphSpec(batch=1 + i, heads_q=32, seq_q=128, head_dim=128)
        art = Artifact(spec=spec, target=TARGET, payload=os.urandom(args.size), build_seconds=2.0)
        data = art.encode()
        store.put(art.key, data)
        keys.append(art.key)
        blobs.append(data)
    store.close()
    (tmp / "static").mkdir()
    (tmp / "static" / "all.bin").write_bytes(b"".join(blobs))
    total = sum(len(b) for b in blobs)

    nginx_port, gc_port = free_port(), free_port()
    (tmp / "nginx.conf").write_text(static_nginx_conf(nginx_port, tmp))
    procs = [subprocess.Popen([nginx_bin, "-c", str(tmp / "nginx.conf"), "-p", str(tmp)])]
    env = {**os.environ, "GRAPHCACHE_DIR": str(tmp / "store")}
    procs.append(serve_process(gc_port, env, args.serve_args.split()))
    body = json.dumps({"keys": keys})
    try:
        wait_http(f"http://127.0.0.1:{nginx_port}/all.bin")
        wait_http(f"http://127.0.0.1:{gc_port}/healthz")
        ng = http.client.HTTPConnection("127.0.0.1", nginx_port)
        batch_conn = http.client.HTTPConnection("127.0.0.1", gc_port)
        single = http.client.HTTPConnection("127.0.0.1", gc_port)

        def static() -> int:
            ng.request("GET", "/all.bin")
            return len(ng.getresponse().read())

        def batch() -> int:
            batch_conn.request("POST", "/v1/batch", body=body, headers={"content-type": "application/json"})
            return len(batch_conn.getresponse().read())

        def singles() -> int:
            n = 0
            for key in keys:
                single.request("GET", f"/v1/artifacts/{key}")
                n += len(single.getresponse().read())
            return n

        client = HttpStore(f"http://127.0.0.1:{gc_port}", timeout=30)

        def get_many() -> int:
            return sum(len(v) for v in client.get_many(keys).values())

        ways = {"nginx one file": static, "graphcache batch": batch, f"{args.count} single GETs": singles}
        for fn in (*ways.values(), get_many):  # warm up: the server verifies each entry once
            fn()
            fn()
        samples: dict[str, list[float]] = {name: [] for name in ways}
        samples["get_many (verifies)"] = []
        sizes: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, fn in ways.items():
                seconds, n = timed(fn)
                samples[name].append(seconds)
                sizes[name] = n
            samples["get_many (verifies)"].append(timed(get_many)[0])
    finally:
        stop_processes(procs)
        shutil.rmtree(tmp, ignore_errors=True)

    batch_name, single_name = "graphcache batch", f"{args.count} single GETs"
    vs_static = [b / s for b, s in zip(samples[batch_name], samples["nginx one file"], strict=True)]
    vs_single = [b / s for b, s in zip(samples[batch_name], samples[single_name], strict=True)]
    print(
        f"{args.count} artifacts of {args.size // 1024} KiB ({total / 2**20:.1f} MiB of envelopes), "
        f"{args.rounds} rounds, one keep-alive connection per way; graphcache serve {args.serve_args or '(defaults)'}"
    )
    for name, times in samples.items():
        got = f"{sizes[name] / 2**20:.1f} MiB" if name in sizes else ""
        print(f"{name:>22}: median {statistics.median(times) * 1e3:7.2f} ms  (min {min(times) * 1e3:.2f}) {got}")
    print(f"batch / nginx one file: {statistics.median(vs_static):.2f}x (median of per-round ratios; goal <= 1.5x)")
    print(f"batch / single GETs:    {statistics.median(vs_single):.2f}x (goal <= 0.5x)")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"samples": samples, "vs_static": vs_static, "vs_single": vs_single, "args": vars(args)})
        )


if __name__ == "__main__":
    main()
