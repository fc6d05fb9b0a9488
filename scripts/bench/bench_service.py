#!/usr/bin/env python3
"""Single-artifact GET throughput of the service against nginx serving the same bytes.

Same load generator (wrk, one thread, a Lua script rotating through --keys
distinct artifacts per size), same machine, 127.0.0.1 only, rounds
alternating between the servers so drift hits all alike:

- nginx: 1 worker, sendfile, the envelopes as static files;
- graphcache: `graphcache serve` as it starts by default (no options but the
  port and log level; --serve-args adds some), on a DiskStore holding the
  same envelopes;
- cache in front (--topology, needs redis-server): docker/nginx.conf's
  proxy_cache (1 worker) in front of two `graphcache serve` processes on one
  Redis, every key fetched once before timing, so the rounds measure hits.

Then the RSS growth of `graphcache serve` (all its processes) while 64
connections download 4 MiB artifacts.

    python scripts/bench/bench_service.py [--duration 5] [--rounds 3] [--keys 100] [--topology]

Needs wrk and nginx (Debian packages). Prints a table; --json writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from graphcache import Artifact, GraphSpec, Target  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.servers import (  # noqa: E402
    free_port,
    local_nginx_conf,
    nginx_binary,
    serve_process,
    static_nginx_conf,
    stop_processes,
    wait_http,
)

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
SIZES = {"64KiB": 64 * 1024, "256KiB": 256 * 1024, "4MiB": 4 * 1024 * 1024}
ROTATE_LUA = """
-- Rotate through the request paths listed in the file named by GC_PATHS.
local paths = {}
for line in io.lines(os.getenv("GC_PATHS")) do paths[#paths + 1] = line end
local i = 0
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
"""


def wrk(base: str, paths_file: Path, lua: Path, duration: int, connections: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(lua), base],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GC_PATHS": str(paths_file)},
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    lat = {}
    for pct in ("50", "99"):
        m = re.search(rf"\s{pct}%\s+([\d.]+)(us|ms|s)", out)
        value, unit = float(m.group(1)), m.group(2)
        lat[pct] = value * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": lat["50"], "p99_ms": lat["99"], "non2xx": int(errors.group(1)) if errors else 0}


def process_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return pids


def rss_kib(pid: int) -> int:
    """RSS of a process and its descendants (uvicorn workers)."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def median_row(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per size")
    parser.add_argument("--keys", type=int, default=100, help="distinct artifacts per size")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated, from " + ",".join(SIZES))
    parser.add_argument("--serve-args", default="", help="extra options for graphcache serve (default: none)")
    parser.add_argument("--topology", action="store_true", help="also nginx proxy_cache over 2 serves on Redis")
    parser.add_argument("--no-rss", action="store_true", help="skip the 64 x 4 MiB RSS check")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    for tool in ("wrk", "nginx") + (("redis-server",) if args.topology else ()):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            sys.exit(f"{tool} is not installed: apt-get install {tool}")
    nginx_bin = nginx_binary() or "/usr/sbin/nginx"
    sizes = {label: SIZES[label] for label in args.sizes.split(",")}

    tmp = Path(tempfile.mkdtemp(prefix="gc-bench-"))
    tmp.chmod(0o755)  # nginx workers may run as an unprivileged user
    lua = tmp / "rotate.lua"
    lua.write_text(ROTATE_LUA)
    store = DiskStore(tmp / "store")
    static = tmp / "static" / "v1" / "artifacts"
    static.mkdir(parents=True)
    entries: dict[str, list[tuple[str, bytes]]] = {}
    for label, size in sizes.items():
        entries[label] = []
        for i in range(args.keys):
            spec = GraphSpec(batch=1 + i, heads_q=32, seq_q=size // 1024, head_dim=128)
            art = Artifact(spec=spec, target=TARGET, payload=os.urandom(size), build_seconds=2.0)
            data = art.encode()
            store.put(art.key, data)
            (static / art.key).write_bytes(data)
            entries[label].append((art.key, data))
        (tmp / f"paths-{label}").write_text("".join(f"/v1/artifacts/{k}\n" for k, _ in entries[label]))
    store.close()

    nginx_port, gc_port = free_port(), free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(static_nginx_conf(nginx_port, tmp))
    servers: dict[str, str] = {"nginx": f"http://127.0.0.1:{nginx_port}", "graphcache": f"http://127.0.0.1:{gc_port}"}
    procs: list[subprocess.Popen] = []
    extra = shlex.split(args.serve_args)
    rows = []
    before = after = 0
    try:
        procs.append(subprocess.Popen([nginx_bin, "-c", str(conf), "-p", str(tmp)]))
        env = {**os.environ, "GRAPHCACHE_DIR": str(tmp / "store")}
        server = serve_process(gc_port, env, extra)
        procs.append(server)
        wait_http(f"{servers['graphcache']}/healthz")
        wait_http(f"{servers['nginx']}/v1/artifacts/{entries[next(iter(sizes))][0][0]}")
        if args.topology:
            servers["cache in front"] = start_topology(tmp, entries, procs, extra)
        for label in sizes:
            paths = tmp / f"paths-{label}"
            for base in servers.values():
                wrk(base, paths, lua, 2, args.connections)  # warm up all: every key read once
            rounds: list[dict[str, dict[str, float]]] = []
            for _ in range(args.rounds):
                rounds.append(
                    {name: wrk(base, paths, lua, args.duration, args.connections) for name, base in servers.items()}
                )
            row: dict = {"size": label}
            for name in servers:
                row[name] = median_row([r[name] for r in rounds])
                if name != "nginx":
                    ratios = sorted(r[name]["rps"] / r["nginx"]["rps"] for r in rounds)
                    row[f"{name} ratio"] = statistics.median(ratios)
                    row[f"{name} ratios"] = ratios
            rows.append(row)
            print_row(row, servers)
        if not args.no_rss and "4MiB" in sizes:
            before = rss_kib(server.pid)
            peak = [before]
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.05):
                    peak.append(rss_kib(server.pid))

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                wrk(servers["graphcache"], tmp / "paths-4MiB", lua, max(5, args.duration), 64)
            finally:
                done.set()
                sampler.join()
            after = max(peak)
    finally:
        stop_processes(procs)
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"wrk -t1 -c{args.connections} -d{args.duration}s, {args.keys} keys per size rotating, "
        f"{args.rounds} alternating rounds (medians); graphcache serve {args.serve_args or '(defaults)'}; "
        "nginx worker_processes=1"
    )
    for row in rows:
        print_row(row, servers)
    if after:
        print(
            f"server RSS: {before / 1024:.0f} MiB before, peak {after / 1024:.0f} MiB during 64 connections of "
            f"4 MiB downloads (growth {(after - before) / 1024:+.0f} MiB)"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "rss_before_kib": before, "rss_peak_kib": after, "args": vars(args)}, indent=2)
        )


def print_row(row: dict, servers: dict[str, str]) -> None:
    parts = [f"{row['size']:>7}"]
    for name in servers:
        r = row[name]
        text = f"{name} {r['rps']:.0f} req/s p50 {r['p50_ms']:.2f}ms p99 {r['p99_ms']:.2f}ms"
        if name != "nginx":
            text += f" = {row[f'{name} ratio']:.2f}x ({', '.join(f'{x:.2f}' for x in row[f'{name} ratios'])})"
        if r["non2xx"]:
            text += f" [{r['non2xx']:.0f} non-2xx]"
        parts.append(text)
    print(" | ".join(parts), flush=True)


def start_topology(tmp: Path, entries: dict[str, list[tuple[str, bytes]]], procs: list, extra: list[str]) -> str:
    """redis-server, two `graphcache serve` on it, docker/nginx.conf's
    proxy_cache in front; every artifact uploaded, then fetched once through
    the cache (so timed rounds are hits). Returns the front's URL."""
    from graphcache.stores import HttpStore

    redis_port = free_port()
    procs.append(
        subprocess.Popen(
            [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                "--port",
                str(redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
        )
    )
    env = {**os.environ, "GRAPHCACHE_STORE": f"redis://127.0.0.1:{redis_port}/0", "GRAPHCACHE_WRITE_TOKENS": "w"}
    ports = [free_port(), free_port()]
    time.sleep(0.5)
    for port in ports:
        procs.append(serve_process(port, env, extra))
    for port in ports:
        wait_http(f"http://127.0.0.1:{port}/healthz")
    lb_port = free_port()
    (tmp / "lb").mkdir()
    conf = tmp / "lb" / "nginx.conf"
    conf.write_text(local_nginx_conf([f"127.0.0.1:{p}" for p in ports], lb_port, tmp / "lb"))
    procs.append(subprocess.Popen([nginx_binary() or "/usr/sbin/nginx", "-c", str(conf), "-p", str(tmp / "lb")]))
    url = f"http://127.0.0.1:{lb_port}"
    wait_http(f"{url}/healthz")
    upload = HttpStore(f"http://127.0.0.1:{ports[0]}", token="w", timeout=60)
    for items in entries.values():
        for key, data in items:
            upload.put(key, data)
            urllib.request.urlopen(f"{url}/v1/artifacts/{key}", timeout=30).read()
    return url


if __name__ == "__main__":
    main()
