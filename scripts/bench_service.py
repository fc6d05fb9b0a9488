#!/usr/bin/env python3
"""GET throughput and latency of the service against nginx serving the same bytes.

One run, same load generator (wrk), same machine, 127.0.0.1 only:
nginx (1 worker, static files) vs `graphcache serve` (uvloop + httptools) on a
DiskStore holding the same artifacts, for 256 KiB and 4 MiB. Then the
server's RSS growth while 64 connections download 4 MiB artifacts.

    python scripts/bench_service.py [--duration 10] [--rounds 3] [--connections 8] [--workers 1]

Needs wrk and nginx (Debian packages). Prints a table; --json writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graphcache import Artifact, GraphSpec, Target  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
SIZES = {"256KiB": 256 * 1024, "4MiB": 4 * 1024 * 1024}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def wrk(url: str, duration: int, connections: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {}
    for pct in ("50", "99"):
        m = re.search(rf"\s{pct}%\s+([\d.]+)(us|ms|s)", out)
        value, unit = float(m.group(1)), m.group(2)
        lat[pct] = value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": lat["50"], "p99_ms": lat["99"], "non2xx": int(errors.group(1)) if errors else 0}


def rss_kib(pid: int) -> int:
    """RSS of a process and its children (uvicorn workers)."""
    total = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="alternating nginx/graphcache rounds per size")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"{tool} is not installed: apt-get install {tool}")
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"

    tmp = Path(tempfile.mkdtemp(prefix="gc-bench-"))
    tmp.chmod(0o755)  # nginx workers run as an unprivileged user
    store = DiskStore(tmp / "store")
    static = tmp / "static" / "v1" / "artifacts"
    static.mkdir(parents=True)
    keys = {}
    for label, size in SIZES.items():
        spec = GraphSpec(batch=1, heads_q=32, seq_q=size // 1024, head_dim=128)
        art = Artifact(spec=spec, target=TARGET, payload=os.urandom(size))
        data = art.encode()
        store.put(art.key, data)
        (static / art.key).write_bytes(data)
        keys[label] = art.key
    store.close()

    nginx_port, gc_port = free_port(), free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  default_type application/octet-stream;
  server {{ listen 127.0.0.1:{nginx_port}; root {tmp}/static; }}
}}
""")
    procs = []
    try:
        procs.append(subprocess.Popen([nginx_bin, "-c", str(conf), "-p", str(tmp)]))
        env = {**os.environ, "GRAPHCACHE_DIR": str(tmp / "store")}
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "graphcache.cli",
                "serve",
                "--port",
                str(gc_port),
                "--workers",
                str(args.workers),
                "--log-level",
                "warning",
            ],
            env=env,
            cwd=ROOT,
            stderr=subprocess.DEVNULL,
        )
        procs.append(server)
        wait_http(f"http://127.0.0.1:{nginx_port}/v1/artifacts/{keys['4MiB']}")
        wait_http(f"http://127.0.0.1:{gc_port}/healthz")
        rows = []
        for label, key in keys.items():
            path = f"/v1/artifacts/{key}"
            for url in (f"http://127.0.0.1:{nginx_port}{path}", f"http://127.0.0.1:{gc_port}{path}"):
                wrk(url, 2, args.connections)  # warm up both
            rounds = []
            for _ in range(args.rounds):  # alternate, so drift hits both sides alike
                ng = wrk(f"http://127.0.0.1:{nginx_port}{path}", args.duration, args.connections)
                gc = wrk(f"http://127.0.0.1:{gc_port}{path}", args.duration, args.connections)
                rounds.append((ng, gc))
            ratios = sorted(gc["rps"] / ng["rps"] for ng, gc in rounds)
            ng = {k: statistics.median(r[0][k] for r in rounds) for k in rounds[0][0]}
            gc = {k: statistics.median(r[1][k] for r in rounds) for k in rounds[0][1]}
            rows.append(
                {"size": label, "nginx": ng, "graphcache": gc, "ratio": statistics.median(ratios), "ratios": ratios}
            )
        before = rss_kib(server.pid)
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.05):
                peak.append(rss_kib(server.pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            wrk(f"http://127.0.0.1:{gc_port}/v1/artifacts/{keys['4MiB']}", max(5, args.duration // 2), 64)
        finally:
            done.set()
            sampler.join()
        after = max(peak)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"wrk -t1 -c{args.connections} -d{args.duration}s x {args.rounds} alternating rounds (medians), "
        f"graphcache workers={args.workers}, nginx worker_processes=1"
    )
    print(
        f"{'size':>7} | {'nginx req/s':>11} {'p50':>8} {'p99':>8} | {'graphcache req/s':>16} {'p50':>8} {'p99':>8} | ratio"
    )
    for r in rows:
        ng, gc = r["nginx"], r["graphcache"]
        print(
            f"{r['size']:>7} | {ng['rps']:>11.0f} {ng['p50_ms']:>6.2f}ms {ng['p99_ms']:>6.2f}ms | "
            f"{gc['rps']:>16.0f} {gc['p50_ms']:>6.2f}ms {gc['p99_ms']:>6.2f}ms | {r['ratio']:.2f}x "
            f"(rounds {', '.join(f'{x:.2f}' for x in r['ratios'])})"
        )
        if gc["non2xx"]:
            print(f"  graphcache answered {gc['non2xx']} non-2xx responses")
    growth = (after - before) / 1024
    print(
        f"server RSS: {before / 1024:.0f} MiB before, peak {after / 1024:.0f} MiB during 64 connections of "
        f"4 MiB downloads (growth {growth:+.0f} MiB)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "rss_before_kib": before,
                    "rss_peak_kib": after,
                    "workers": args.workers,
                    "connections": args.connections,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
