"""A call's cost by class mechanism, where older notes and commands call it: runs
scripts/gpu/bench_classes_gpu.py, the script itself, with the same arguments
(docs/contributing.md)."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    script = str(Path(__file__).resolve().parent / "gpu" / "bench_classes_gpu.py")
    os.execv(sys.executable, [sys.executable, script, *sys.argv[1:]])
