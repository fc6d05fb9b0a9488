"""The doctor verb (graphcache/cli/doctor.py)."""

from __future__ import annotations

import json

from tests.clirun import cli


def test_doctor_reports_versions_and_what_this_machine_can_do(tmp_path):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64, "dtype": "bfloat16"}))
    out = cli("doctor", "--spec", str(f))
    assert out.returncode == 0, out.stderr
    for word in ("python", "torch", "cudnn-frontend", "cuDNN", "GPU", "SDPA backends", "b1 h8 s128 d64 bf16"):
        assert word in out.stdout
