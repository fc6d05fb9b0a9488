"""Where the test suite's time goes: the CSV that tests/conftest.py writes
with GRAPHCACHE_TEST_TIMES=FILE, summed by file and ranked by test; with a
second CSV, each file's before and after side by side.

    GRAPHCACHE_TEST_TIMES=/tmp/times.csv .venv/bin/python -m pytest -q tests/
    .venv/bin/python scripts/tools/suite_times.py /tmp/times.csv [--top 30] [--before OLD.csv]

Wall seconds move with whatever else shares the cores; CPU seconds (this
process and the subprocesses it waited for) hardly do: compare those.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> dict[str, tuple[float, float]]:
    """node id -> (wall, cpu) seconds; a test that ran twice keeps its last row."""
    rows: dict[str, tuple[float, float]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.reader(f):
            if len(row) == 3:
                rows[row[0]] = (float(row[1]), float(row[2]))
    return rows


def by_file(rows: dict[str, tuple[float, float]]) -> dict[str, list[float]]:
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for node, (wall, cpu) in rows.items():
        total = files[node.split("::")[0]]
        total[0] += wall
        total[1] += cpu
        total[2] += 1
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("times", type=Path, help="the CSV GRAPHCACHE_TEST_TIMES wrote")
    parser.add_argument("--top", type=int, default=30, help="how many tests and files to list")
    parser.add_argument("--before", type=Path, help="an earlier run's CSV, compared file by file")
    args = parser.parse_args()
    rows = read(args.times)
    files = by_file(rows)
    wall, cpu = sum(r[0] for r in rows.values()), sum(r[1] for r in rows.values())
    print(f"{len(rows)} tests: {wall:.0f} s wall, {cpu:.0f} s CPU (summed over tests)")
    before = by_file(read(args.before)) if args.before else {}
    print(f"\nfiles by CPU seconds (top {args.top})" + ("; before -> after" if before else ""))
    for name, (w, c, n) in sorted(files.items(), key=lambda kv: -kv[1][1])[: args.top]:
        was = before.get(name)
        then = f"  CPU {was[1]:7.1f} -> {c:7.1f}" if was else ""
        print(f"{c:8.1f} s CPU {w:8.1f} s wall {int(n):4d} tests  {name}{then}")
    print(f"\ntests by CPU seconds (top {args.top})")
    for node, (w, c) in sorted(rows.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{c:8.1f} s CPU {w:8.1f} s wall  {node}")


if __name__ == "__main__":
    main()
