"""The hardening probes, where older notes and commands call them: runs
scripts/probes/hardening_probe.py, the script itself, with the same arguments
(docs/contributing.md)."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    script = str(Path(__file__).resolve().parent / "probes" / "hardening_probe.py")
    os.execv(sys.executable, [sys.executable, script, *sys.argv[1:]])
