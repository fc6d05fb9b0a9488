"""Run the graphcache CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HIDDEN_DIR = Path(__file__).parent / "hidden"


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: str | os.PathLike[str] | None = None,
    hide: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """``hide`` names packages the subprocess must see as not installed
    (torch, cudnn, matplotlib): see tests/hidden/sitecustomize.py."""
    extra = dict(env or {})
    if hide:
        root = str(Path(__file__).parent.parent)
        extra["PYTHONPATH"] = os.pathsep.join([str(HIDDEN_DIR), root, os.environ.get("PYTHONPATH", "")])
        extra["GRAPHCACHE_TEST_HIDE"] = ",".join(hide)
    return subprocess.run(
        [sys.executable, "-m", "graphcache.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **extra},
    )
