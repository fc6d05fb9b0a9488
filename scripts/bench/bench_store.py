#!/usr/bin/env python3
"""DiskStore get + verify against a raw open().read() of the same bytes.

Runs both side by side in one process, interleaved, and prints medians and
the ratio. Also times key_for per call.

    python scripts/bench/bench_store.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache import Artifact, GraphSpec, Target, key_for  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")


def median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = DiskStore(Path(tmp) / "store")
        for size in (256 * 1024, 4 * 1024 * 1024):
            spec = GraphSpec(batch=1, heads_q=32, seq_q=size // 1024, head_dim=128)
            art = Artifact(spec=spec, target=TARGET, payload=os.urandom(size))
            data = art.encode()
            store.put(art.key, data)
            raw = Path(tmp) / f"raw-{size}"
            raw.write_bytes(data)

            def raw_read(raw: Path = raw) -> bytes:
                with open(raw, "rb") as fh:
                    return fh.read()

            def get_verify(key: str = art.key) -> Artifact:
                return Artifact.decode(store.get(key), expected_key=key)

            def get_only(key: str = art.key) -> bytes | None:
                return store.get(key)

            def sha_only(data: bytes = data) -> bytes:
                return hashlib.sha256(data).digest()

            for fn in (raw_read, get_verify, get_only):  # warm the page cache
                fn()
            base = median_us(raw_read, args.repeat)
            gv = median_us(get_verify, args.repeat)
            g = median_us(get_only, args.repeat)
            sha = median_us(sha_only, args.repeat)
            base2 = median_us(raw_read, args.repeat)  # again, to see drift
            base = min(base, base2)
            rows.append((f"{size // 1024} KiB", base, g, gv, sha))
        spec = GraphSpec(batch=1, heads_q=32, heads_kv=8, seq_q=4096, head_dim=128, dtype="bfloat16", mask="causal")
        kf = median_us(lambda: key_for(spec, TARGET), args.repeat * 10)
    print(
        f"{'size':>8} {'open().read()':>14} {'store.get':>10} {'get+verify':>11} {'sha256 only':>12} "
        f"{'get/raw':>8} {'get+verify/raw':>15}"
    )
    for label, base, g, gv, sha in rows:
        print(
            f"{label:>8} {base:>12.0f}us {g:>8.0f}us {gv:>9.0f}us {sha:>10.0f}us {g / base:>7.2f}x {gv / base:>14.2f}x"
        )
    print(f"key_for: {kf:.1f} us per call")


if __name__ == "__main__":
    main()
