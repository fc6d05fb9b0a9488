"""Smaller things issue 20 found: ls shows pins, one meaning of size, tables
that keep their text when piped, pin/unpin metrics labels, and what the
verbs say on a machine without torch or without a GPU."""

from __future__ import annotations

import json
import logging
import warnings

import httpx
import pytest

from graphcache.settings import Settings
from graphcache.stores import DiskStore
from service.app import create_app
from tests.clirun import cli
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import ServerThread

NO_TORCH = ("torch", "cudnn")


def two_entries(folder) -> tuple[DiskStore, list]:  # noqa: ANN001
    store = DiskStore(folder)
    arts = [make_artifact(spec(batch=1), size=50_000), make_artifact(spec(batch=2), size=60_000)]
    store.put(arts[0].key, arts[0].encode(), pin=True)
    store.put(arts[1].key, arts[1].encode())
    return store, arts


def test_ls_shows_which_entries_are_pinned_locally_and_through_the_service(tmp_path):
    store, arts = two_entries(tmp_path / "c")
    env = {"GRAPHCACHE_DIR": str(store.path)}
    lines = [json.loads(line) for line in cli("ls", "--json", env=env).stdout.splitlines()]
    assert {row["key"]: row["pinned"] for row in lines} == {arts[0].key: True, arts[1].key: False}
    table = cli("ls", env=env).stdout
    assert "pinned" in table
    row = {line.split()[1]: line for line in table.splitlines() if line.startswith("│ ") and len(line.split()) > 2}
    assert "yes" in row[arts[0].key[:12]] and "yes" not in row[arts[1].key[:12]]
    with ServerThread(create_app(Settings(cache_dir=store.path), store=store)) as srv:
        remote = [json.loads(line) for line in cli("ls", "--json", "--store", srv.url).stdout.splitlines()]
    assert {row["key"]: row["pinned"] for row in remote} == {arts[0].key: True, arts[1].key: False}


def test_size_means_the_payload_in_ls_json_and_inspect(tmp_path):
    store, arts = two_entries(tmp_path / "c")
    env = {"GRAPHCACHE_DIR": str(store.path)}
    listed = {
        json.loads(line)["key"]: json.loads(line)["size"] for line in cli("ls", "--json", env=env).stdout.splitlines()
    }
    for art in arts:
        shown = json.loads(cli("inspect", art.key, env=env).stdout)
        assert shown["size"] == listed[art.key] == len(art.payload) == shown["payload_size"]
        assert shown["envelope_size"] == len(art.encode())


def test_a_table_written_to_a_pipe_keeps_whole_target_texts(tmp_path):
    store, arts = two_entries(tmp_path / "c")
    out = cli("ls", env={"GRAPHCACHE_DIR": str(store.path), "COLUMNS": ""})  # not a terminal, no COLUMNS
    assert out.returncode == 0, out.stderr
    assert str(TARGET) in out.stdout and spec(batch=1).summary() in out.stdout


def test_metrics_label_pin_and_unpin_as_their_own_route(tmp_path):
    store, arts = two_entries(tmp_path / "c")
    with ServerThread(create_app(Settings(cache_dir=store.path), store=store)) as srv:
        assert httpx.post(f"{srv.url}/v1/artifacts/{arts[1].key}/pin").status_code == 200
        assert httpx.delete(f"{srv.url}/v1/artifacts/{arts[1].key}/pin").status_code == 200
        text = httpx.get(f"{srv.url}/metrics").text
    for method in ("POST", "DELETE"):
        line = f'graphcache_requests_total{{method="{method}",route="/v1/artifacts/{{key}}/pin",status="200"}} 1.0'
        assert line in text, method
    assert 'method="DELETE",route="/v1/artifacts/{key}",' not in text


def test_without_torch_prefetch_says_to_pass_target_and_doctor_says_torch_is_missing(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text("graphs:\n  - name: m\n    batch: 1\n    heads_q: 8\n    seq_q: 128\n    head_dim: 64\n")
    env = {"GRAPHCACHE_DIR": str(tmp_path / "c")}
    out = cli("prefetch", str(manifest), "--server", "http://127.0.0.1:9", env=env, hide=NO_TORCH)
    assert out.returncode == 1 and "torch is not installed" in out.stderr and "--target" in out.stderr, out.stderr
    doctor = cli("doctor", env=env, hide=NO_TORCH)
    gpu_row = next(line for line in doctor.stdout.splitlines() if line.startswith("│ GPU "))
    assert "torch is not installed" in gpu_row and "visible to torch" not in gpu_row


def test_the_target_hint_only_where_target_helps(tmp_path):
    """On this machine (torch, no CUDA GPU): prefetch can fetch for another
    machine's target; warm and a worker's load cannot use one."""
    manifest = tmp_path / "m.yaml"
    manifest.write_text("graphs:\n  - name: m\n    batch: 1\n    heads_q: 8\n    seq_q: 128\n    head_dim: 64\n")
    env = {"GRAPHCACHE_DIR": str(tmp_path / "c")}
    warm = cli("warm", str(manifest), env=env)
    assert warm.returncode != 0 and "no CUDA GPU" in warm.stderr, warm.stderr
    assert "--target" not in warm.stderr
    prefetch = cli("prefetch", str(manifest), "--server", "http://127.0.0.1:9", env=env)
    assert prefetch.returncode != 0 and "--target" in prefetch.stderr, prefetch.stderr


@pytest.mark.parametrize(
    "report",
    [
        {"gpu": True, "specs": [{"summary": "s", "cold": {"phases": {"build": 1.0}}}]},  # nothing measured warm
        {
            "gpu": True,
            "specs": [{"summary": "s", "cold": {"phases": {"build": 0.0}}, "warm": {"phases": {"load": 0.0}}}],
        },
        {
            "gpu": True,
            "specs": [{"summary": "s", "cold": {"phases": {"build": 2.0}}, "warm": {"phases": {"load": 0.0}}}],
        },
        {"gpu": False, "specs": [{"summary": "s", "warm": {"phases": {"fetch": 0.001, "verify": 0.002}}}]},
    ],
    ids=["no-warm", "all-zero", "a-zero-bar", "no-gpu"],
)
def test_bench_plot_leaks_no_matplotlib_warnings(tmp_path, report, caplog):
    pytest.importorskip("matplotlib")
    from graphcache.ops.bench import plot

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot({**report, "target": str(TARGET)}, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert not [r for r in caplog.records if r.name.startswith("matplotlib") and r.levelno >= logging.WARNING]
