"""graphcache bench on a machine with no GPU: fetch + verify, JSON and a PNG.

The CLI runs with torch and cudnn hidden (tests/hidden/sitecustomize.py), as
on the server host the README installs, which has neither: these paths must
not need them, and they run the same on a host that has a GPU.
"""

from __future__ import annotations

import json
import re

import pytest

from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.clirun import cli
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import ServerThread


@pytest.fixture
def server(tmp_path):
    store = DiskStore(tmp_path / "server")
    for s in (spec(seq_q=128), spec(seq_q=256)):
        art = make_artifact(s, size=512 * 1024)
        store.put(art.key, art.encode())
    with ServerThread(create_app(Settings(cache_dir=store.path), store=store)) as srv:
        yield srv


NO_TORCH = ("torch", "cudnn")


def test_bench_without_gpu_measures_fetch_and_verify(server, tmp_path):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    out = cli(
        "bench",
        "--spec",
        "batch=1,heads_q=8,seq_q=128,head_dim=64,mask=causal",
        "--spec",
        json.dumps(spec(seq_q=256).to_dict()),
        "--server",
        server.url,
        "--target",
        str(TARGET),
        "--repeat",
        "3",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
        hide=NO_TORCH,
    )
    assert out.returncode == 0, out.stderr
    assert "need one" in out.stdout  # says plainly that the GPU phases need a GPU
    report = json.loads(out_json.read_text())
    assert report["gpu"] is False and report["target"] == str(TARGET) and report["repeat"] == 3
    assert [r["summary"] for r in report["specs"]] == [spec(seq_q=128).summary(), spec(seq_q=256).summary()]
    for row in report["specs"]:
        phases = row["warm"]["phases"]
        assert phases["fetch"] > 0 and phases["verify"] > 0
        assert row["bytes"] > 512 * 1024
    import matplotlib.image

    image = matplotlib.image.imread(str(out_png))
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_bench_reports_a_missing_artifact_and_fails(server, tmp_path):
    out = cli(
        "bench",
        "--spec",
        "batch=9,heads_q=8,seq_q=128,head_dim=64",
        "--server",
        server.url,
        "--target",
        str(TARGET),
        "--repeat",
        "1",
    )
    assert out.returncode == 1 and "missing" in out.stdout


def test_bench_without_gpu_needs_a_target(server):
    out = cli("bench", "--spec", "batch=1,heads_q=8,seq_q=128,head_dim=64", "--server", server.url, hide=NO_TORCH)
    assert out.returncode == 2 and "--target" in out.stderr


def test_bench_bad_spec_argument_names_the_field(server):
    out = cli("bench", "--spec", "batch=1,heads_q=8,seq_q=128,head_dim=63", "--target", str(TARGET))
    assert out.returncode == 1 and "head_dim=63" in out.stderr


def test_bench_with_the_reference_compiler_runs_every_sample_in_a_fresh_process(tmp_path):
    """As on a GPU: a fresh process per cold and per warm sample, its start
    (importing torch) reported apart as init, so the reference's figures are
    what a worker starting up pays, not a warmed-up process's."""
    pytest.importorskip("torch", reason="the reference compiler runs torch's SDPA")
    out_json = tmp_path / "r.json"
    out = cli(
        "--cache-dir",
        str(tmp_path / "c"),
        "bench",
        "--spec",
        "batch=1,heads_q=4,seq_q=64,head_dim=64,mask=causal,dtype=bfloat16,layout=bhsd",
        "--compiler",
        "reference",
        "--repeat",
        "2",
        "--json",
        str(out_json),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "medians of 2 fresh processes each" in out.stdout, out.stdout
    assert "in this process" not in out.stdout
    # Progress as it goes, piped as here: what it will do, a line per sample, then done (issue 39).
    said = [line for line in out.stderr.splitlines() if line.startswith("bench")]
    assert said[0] == "bench: 1 spec(s), 2 cold and 2 warm sample(s) each, every sample a fresh process", said
    summary = "b1 h4 s64 d64 bf16 bhsd causal"
    assert any(re.fullmatch(rf"bench 1/1 {summary}: cold and warm sample 2/2 \(\d+ s\)", line) for line in said), said
    assert re.fullmatch(r"bench done in \d+ s", said[-1]), said
    row = json.loads(out_json.read_text())["specs"][0]
    pids = row["cold"]["pids"] + row["warm"]["pids"]
    assert len(set(pids)) == 4, pids  # one process per sample
    assert row["cold"]["init"] > 0 and row["warm"]["init"] > 0  # each process imported torch itself
    assert set(row["warm"]["phases"]) == {"fetch", "verify", "load+run"}
