"""The doctor verb (graphcache/cli/doctor.py)."""

from __future__ import annotations

import json
import re

import pytest

from graphcache.target import PATTERN
from tests.clirun import cli


def test_doctor_reports_versions_and_what_this_machine_can_do(tmp_path):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64, "dtype": "bfloat16"}))
    out = cli("doctor", "--spec", str(f))
    assert out.returncode == 0, out.stderr
    for word in ("python", "torch", "cudnn-frontend", "cuDNN", "GPU", "SDPA backends", "b1 h8 s128 d64 bf16"):
        assert word in out.stdout


def rows(stdout: str) -> dict[str, str]:
    """The doctor table's rows: check -> found (one line each at 200 columns)."""
    found = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if line.startswith("│") and len(cells) == 2:
            found[cells[0]] = cells[1]
    return found


@pytest.mark.parametrize("hide", [("torch", "cudnn"), ()], ids=["torch hidden", "torch present"])
def test_doctor_prints_the_targets_it_can_and_why_there_is_no_cudnn_target(hide):
    """The README says doctor prints the target text: on a GPU host this
    GPU's, and everywhere the reference compiler's, which --compiler
    reference builds for; without a GPU it says why there is no cuDNN target."""
    out = cli("doctor", hide=hide)
    assert out.returncode == 0, out.stderr
    found = rows(out.stdout)
    assert found["reference target"].startswith("reference-sm00-cudnn0.0.0-fe0.0.0"), found
    if hide:
        assert found["target"] == "none here: torch is not installed", found
        assert "its builds need torch" in found["reference target"]
    elif "none" in found["GPU"]:
        assert found["target"] == "none here: no CUDA device visible to torch", found
    else:  # a GPU host: this GPU's target
        assert re.match(PATTERN, found["target"]), found
        return
    said = " ".join(out.stdout.split())
    assert "GPU-smXY-mpN-cudnnX.Y.Z-feX.Y.Z" in said and "graphcache doctor on a serving GPU host" in said
