"""The benchmark scripts docs/benchmarks.md quotes still run (briefly), so a
change of a library interface cannot leave them broken unnoticed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """scripts/NAME with ``args`` from the checkout's root; fails the test unless it exits 0."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.mark.torch
def test_bench_torch_dropin_runs_and_reports_every_case():
    pytest.importorskip("torch", reason="the drop-in benchmark needs torch")
    out = run_script("bench_torch_dropin.py", "--calls", "50", "--rounds", "1", timeout=300)
    for case in ("hit bhsd", "hit bshd", "op (custom op) bhsd", "fallback bhsd fp32", "class decode kv129-256"):
        assert case in out.stdout, out.stdout
    assert "class run: graphs 2, call shapes served 384" in out.stdout, out.stdout
    for case in ("bias decode bool b1ss", "bias decode float 1hss", "bias q128 bool b1ss"):
        assert case in out.stdout, out.stdout
    assert "fallbacks {'dtype': " in out.stdout and "'mask'" not in out.stdout, "masked calls are bias-graph hits"
    for case in ("aten bhsd", "aten bshd"):  # the aten door's hit beside patch()'s (issue 42)
        assert case in out.stdout, out.stdout
    assert "by door: sdpa " in out.stdout and "aten " in out.stdout, out.stdout


@pytest.mark.torch
def test_bench_varlen_runs_and_reports_every_case():
    pytest.importorskip("torch", reason="the varlen benchmark needs torch")
    out = run_script("bench_varlen.py", "--calls", "20", "--rounds", "1", timeout=300)
    for kind in ("offsets", "hit", "memo"):
        for case in ("paged decode n20", "ragged prefill n5"):
            assert f"{kind} {case}" in out.stdout, out.stdout
    assert "fallbacks {}" in out.stdout, out.stdout


def test_the_hardening_probe_of_held_bodies_runs_and_reports_the_put():
    out = run_script("hardening_probe.py", "--only", "held", "--held", "20", timeout=120)
    for framing in ("Content-Length: 1048576", "chunked"):
        assert f"20 held POST / bodies ({framing}), no token: authenticated PUT 201, GET 200, batch 200" in out.stdout
