"""graphcache doctor: torch's SDPA backends, each with torch's own verdict."""

from __future__ import annotations

import json
import re

import pytest

from tests.clirun import cli

pytest.importorskip("torch", reason="the SDPA backend rows need torch")


def test_doctor_lists_every_torch_sdpa_backend_with_why_not(tmp_path):
    import torch

    f = tmp_path / "spec.json"
    f.write_text(
        json.dumps({"batch": 1, "heads_q": 8, "heads_kv": 2, "seq_q": 64, "head_dim": 64, "dtype": "bfloat16"})
    )
    out = cli("doctor", "--spec", str(f))
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2 and cells[0].startswith("SDPA "):
            rows[cells[0]] = cells[1]
    assert set(rows) == {"SDPA flash", "SDPA efficient", "SDPA cudnn", "SDPA math"}
    assert rows["SDPA math"] == "yes"
    for name in ("flash", "efficient", "cudnn"):
        finding = rows[f"SDPA {name}"]
        assert finding == "yes" or finding.startswith("yes: ") or (finding.startswith("no: ") and len(finding) > 8)
        if not torch.cuda.is_available() and not finding.startswith("yes"):
            assert "torch.cuda.is_available() is False" in finding
    # The backend torch picks is one its row says can serve the call (on a
    # CPU, flash is torch's CPU kernel: its row said "no" while it was picked).
    picked = re.search(r"torch picks (\w+) on (\w+)", out.stdout)
    assert picked, out.stdout
    assert rows[f"SDPA {picked[1]}"].startswith("yes"), (picked[0], rows)
    summary = next(line for line in out.stdout.splitlines() if "torch SDPA backends" in line)
    assert f"{picked[1]} yes" in summary


def test_doctor_says_what_a_missing_cudnn_runtime_means_and_how_to_install_one():
    out = cli("doctor")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.strip("│ ").startswith("cuDNN "))
    if "runtime not found" not in row:
        pytest.skip(f"this machine has a cuDNN runtime: {row.strip()}")
    said = " ".join(out.stdout.split())
    assert "cuDNN runtime not found: cudnn-frontend is only the Python side" in said
    assert "pip install nvidia-cudnn-cu12" in said and "--compiler reference work without it" in said
