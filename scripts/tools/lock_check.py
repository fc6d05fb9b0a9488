"""Is what this Python has installed exactly what the lock pins?

scripts/test.sh runs it after installing requirements/test.lock: every
package the lock pins for this Python (its markers evaluated here) must be
installed at that version, torch at requirements/test.in's pin (its CPU
build, which the lock leaves to scripts/tools/cpu_torch.sh), and nothing else may
be installed but graphcache itself and pip. Prints one line and exits 0, or
names each difference and exits 1.

    python scripts/tools/lock_check.py [LOCK] [--torch VERSION] [--report-only | --extras]

``--report-only`` (scripts/test.sh --latest) prints the differences as the
versions this run uses beyond the lock, and exits 0. ``--extras`` prints the
names of the installed packages the lock does not name (what scripts/test.sh
removes from the venv it made, after the lock dropped them), one line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
# Installed beside the lock's packages and never pinned by it.
UNPINNED = {"graphcache", "pip"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?\s*$")


def pins(lock_text: str, environment: dict[str, str] | None = None) -> dict[str, str]:
    """The lock's ``name==version`` pins that apply here (or in ``environment``), by canonical name."""
    found: dict[str, str] = {}
    for line in lock_text.splitlines():
        match = PIN.match(line)
        if match is None:
            continue
        name, version, marker = match.groups()
        if marker and not Marker(marker).evaluate(environment):
            continue
        found[canonicalize_name(name)] = version
    return found


def installed() -> dict[str, str]:
    """What this Python has installed, by canonical name (the first found on sys.path wins)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def differences(locked: dict[str, str], have: dict[str, str]) -> list[str]:
    """Each way ``have`` differs from ``locked``, in words; empty when it matches."""
    out = []
    for name, version in sorted(locked.items()):
        if name not in have:
            out.append(f"{name} {version} is missing")
        elif have[name] != version:
            out.append(f"{name} is {have[name]}, the lock pins {version}")
    for name in sorted(set(have) - set(locked) - UNPINNED):
        out.append(f"{name} {have[name]} is installed and the lock has no such package")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lock", nargs="?", default=str(ROOT / "requirements" / "test.lock"))
    parser.add_argument("--torch", help="the torch version installed beside the lock (requirements/test.in's pin)")
    parser.add_argument("--report-only", action="store_true", help="print the differences, exit 0")
    parser.add_argument("--extras", action="store_true", help="print the installed packages the lock lacks, exit 0")
    args = parser.parse_args()
    locked = pins(Path(args.lock).read_text())
    if args.torch:
        locked["torch"] = args.torch
    have = installed()
    if args.extras:
        print(" ".join(sorted(set(have) - set(locked) - UNPINNED)))
        return 0
    found = differences(locked, have)
    where = f"{args.lock} ({len(locked)} packages{', torch ' + args.torch if args.torch else ''})"
    if args.report_only:
        beyond = [d for d in found if "the lock pins" in d or "no such package" in d]
        print("beyond the lock: " + ("; ".join(beyond) if beyond else "nothing, every version is the lock's"))
        return 0
    if found:
        print(f"error: this Python ({sys.prefix}) does not hold what {where} pins:", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        print(
            "  run the suite in a fresh venv (scripts/test.sh makes .venv where no venv is active), "
            "or rerun scripts/test.sh to install the lock",
            file=sys.stderr,
        )
        return 1
    print(f"installed exactly as {where} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
