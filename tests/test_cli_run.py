"""``graphcache run [--compiler ...] [--record FILE] -- COMMAND ...`` (issue 42,
item 3): an unchanged program with graphcache at both doors, recorded, then
served from the warmed cache on a second run; the program's status, its
other processes and the environment's own sitecustomize pass through.

Runs the real CLI in subprocesses, as a user would, with the reference
compiler's graphs on this CPU.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from tests.clirun import cli

pytest.importorskip("torch", reason="graphcache run serves torch programs")

SCRIPT = textwrap.dedent(
    """
    import subprocess, sys
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(256, 4, batch_first=True, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for seq in (100, 200):
            x = torch.randn(1, seq, 256, dtype=torch.bfloat16)
            attn(x, x, x, need_weights=False)                                  # F.sdpa inside: patch()'s door
            q = torch.randn(1, 8, seq, 64, dtype=torch.bfloat16)
            k = v = torch.randn(1, 2, seq, 64, dtype=torch.bfloat16)
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, True, False)  # the aten door
    # A second Python process of the program (a worker it starts) is served and recorded too.
    subprocess.run([sys.executable, "-c", "import torch; q = torch.randn(1, 4, 64, 64, dtype=torch.bfloat16); "
                    "torch.nn.functional.scaled_dot_product_attention(q, q, q)"], check=True)
    print("script done")
    """
)


def test_record_warm_and_a_second_run_serves_the_unchanged_script(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {"GRAPHCACHE_DIR": str(tmp_path / "store")}
    manifest, first, second = tmp_path / "m.yaml", tmp_path / "first.json", tmp_path / "second.json"
    run = ("run", "--compiler", "reference")
    recorded = cli(*run, "--record", str(manifest), "--stats", str(first), "--", sys.executable, str(script), env=env)
    assert recorded.returncode == 0, recorded.stderr
    assert "script done" in recorded.stdout and f"wrote {manifest}" in recorded.stderr
    before = json.loads(first.read_text())["total"]
    assert before["processes"] == 2 and before["calls"] == 7 and before["fallbacks"] == {"miss": 7}
    assert set(before["doors"]) == {"sdpa", "aten"}
    warmed = cli("warm", str(manifest), "--compiler", "reference", env=env)
    assert warmed.returncode == 0, warmed.stdout + warmed.stderr
    served = cli(*run, "--stats", str(second), "--", sys.executable, str(script), env=env)
    assert served.returncode == 0, served.stderr
    after = json.loads(second.read_text())["total"]
    assert after["calls"] == 7 and after["hits"] / after["calls"] >= 0.95, after
    assert after["doors"]["aten"]["hits"] == 2 and "served from cached graphs (100.0 %)" in served.stderr


def test_the_programs_status_passes_through_and_a_failed_run_writes_no_manifest(tmp_path):
    manifest = tmp_path / "m.yaml"
    failed = cli("run", "--record", str(manifest), "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert failed.returncode == 3 and not manifest.exists()
    assert "exited with status 3; no manifest written" in failed.stderr
    missing = cli("run", "--", "no-such-command-here")
    assert missing.returncode == 127 and "error: no-such-command-here: command not found" in missing.stderr
    nothing = cli("run", "--record", str(manifest), "--", sys.executable, "-c", "print('no torch here')")
    assert nothing.returncode == 1 and "imported torch" in nothing.stderr and not manifest.exists()
    bad = cli("run", "--compiler", "cuda", "--", sys.executable, "-c", "pass")
    assert bad.returncode != 0 and "cuda" in bad.stderr


def test_the_environments_own_sitecustomize_still_runs(tmp_path):
    theirs = tmp_path / "site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    probe = "import os, sys; print(os.environ.get('THEIRS'), 'graphcache.ops.launch' in sys.modules)"
    path = os.pathsep.join([str(theirs), os.environ.get("PYTHONPATH", "")])  # this checkout's graphcache, too
    out = cli("run", "--", sys.executable, "-c", probe, env={"PYTHONPATH": path})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ran", "True"]
