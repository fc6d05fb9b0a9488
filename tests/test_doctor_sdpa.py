"""graphcache doctor: torch's SDPA backends, each with torch's own verdict."""

from __future__ import annotations

import json

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
        assert finding == "yes" or (finding.startswith("no: ") and len(finding) > 8)
        if not torch.cuda.is_available():
            assert "torch.cuda.is_available() is False" in finding
    assert "torch picks" in out.stdout
