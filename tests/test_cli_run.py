"""``graphcache run [--compiler ...] [--record FILE] -- COMMAND ...`` (issue 42,
item 3): an unchanged program with graphcache at both doors, recorded, then
served from the warmed cache on a second run (docs/two-doors.md's worker and
commands, as written); the program's status and the environment's own
sitecustomize pass through; a run's processes are summed.

Runs the real CLI in subprocesses, as a user would, with the reference
compiler's graphs on this CPU.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from graphcache.ops import manifest
from tests.clirun import cli
from tests.docs_examples import example
from tests.test_docs_examples import run, workdir

pytest.importorskip("torch", reason="graphcache run serves torch programs")


def test_record_warm_and_a_second_run_serve_the_docs_unchanged_worker(tmp_path):
    # docs/two-doors.md's worker and its three commands, as the page writes them.
    work = workdir(tmp_path)
    (work / "worker.py").write_text(example("run-worker").text)
    launcher = example("run-launcher")
    out = run(launcher, tmp_path, timeout=600)
    assert "wrote worker.yaml" in out.stderr
    total = json.loads((work / "run.json").read_text())["total"]
    assert total["calls"] == 4 and total["hits"] / total["calls"] >= 0.95, total
    assert total["doors"]["aten"]["hits"] == 2 and total["doors"]["sdpa"]["hits"] == 2
    assert total["built_here"] == 0  # warmed: every graph came from the store
    assert "4 served from the store, 0 by graphs built here (100.0 % served)" in out.stderr
    recorded = manifest.load(work / "worker.yaml")
    assert len(recorded) == 4  # two lengths' classes, at each door


def test_the_processes_of_a_run_are_summed_and_their_recordings_make_one_manifest(tmp_path):
    from graphcache.ops import launch

    exact = {"batch": 1, "heads_q": 8, "seq_q": 100, "head_dim": 64, "dtype": "bfloat16"}
    one = {
        "pid": 1,
        "stats": {"calls": 3, "hits": 1, "fallbacks": {"miss": 2}, "doors": {"sdpa": {"calls": 3, "hits": 1}}},
        "recording": {"specs": [[exact, 3]], "ineligible": [["dtype", "float32", 1]]},
    }
    from graphcache.spec import GraphSpec
    from graphcache.spec.backward import backward_of

    backward = backward_of(GraphSpec.from_dict(exact)).to_dict()
    two = {  # a training step (graphcache run --record --backward): its backward specs too
        "pid": 2,
        "stats": {"calls": 2, "hits": 2, "fallbacks": {}, "doors": {"aten": {"calls": 2, "hits": 2}}},
        "recording": {
            "specs": [[{**exact, "seq_q": 200}, 2], [exact, 1]],
            "ineligible": [],
            "training": True,
            "backwards": [[backward, 1]],
            "no_backward": [],
        },
    }
    summed = launch.totals([one, two])
    assert (summed["processes"], summed["calls"], summed["hits"], summed["fallbacks"]) == (2, 5, 3, {"miss": 2})
    assert summed["built_here"] == 0 and summed["served"] == 0.6
    assert set(summed["doors"]) == {"sdpa", "aten"}
    recorder = launch.write_manifest([one, two], tmp_path / "m.yaml", shape_classes="exact")
    written = manifest.load(tmp_path / "m.yaml")
    assert recorder.calls() == 7 and sorted(s.seq_q for s in written) == [100, 100, 200]
    assert [s.to_dict() for s in written if s.kind == "backward"] == [backward]
    assert "dtype: 1 call(s): float32" in (tmp_path / "m.yaml").read_text()


def test_the_programs_status_passes_through_and_a_failed_run_writes_no_manifest(tmp_path):
    manifest = tmp_path / "m.yaml"
    failed = cli("run", "--record", str(manifest), "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert failed.returncode == 3 and not manifest.exists()
    assert "exited with status 3; no manifest written" in failed.stderr
    missing = cli("run", "--", "no-such-command-here")
    assert missing.returncode == 127 and "error: no-such-command-here: command not found" in missing.stderr
    nothing = cli("run", "--record", str(manifest), "--", sys.executable, "-c", "print('no torch here')")
    # Nothing to record is said in an error line; the program's own status (0) stands.
    assert nothing.returncode == 0 and "imported torch" in nothing.stderr and not manifest.exists()
    assert f"error: --record {manifest}: not written" in nothing.stderr
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
