"""The store verbs (graphcache/cli/store.py): ls, inspect, get, rm, pin, key, on a real DiskStore."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphcache import Artifact, GraphCache
from graphcache.stores import DiskStore
from tests.clirun import cli
from tests.fakes import FakeCompiler, spec


@pytest.fixture
def populated(tmp_path):
    store = DiskStore(tmp_path / "c")
    cache = GraphCache(store, FakeCompiler())
    arts = [cache.get(spec(batch=b)) for b in (1, 2, 3)]
    store.close()
    return tmp_path / "c", arts


def test_ls_lists_every_entry(populated):
    folder, arts = populated
    out = cli("--cache-dir", str(folder), "ls")
    assert out.returncode == 0, out.stderr
    for art in arts:
        assert art.key[:12] in out.stdout
    assert "b2 h8 s128 d64 fp16 bshd causal" in out.stdout
    assert "h200-sm90-cudnn9.28.0-fe1.32.0" in out.stdout
    assert "3 artifact(s)" in out.stdout


def test_ls_reads_graphcache_dir_from_the_environment(populated):
    folder, arts = populated
    out = cli("ls", "--json", env={"GRAPHCACHE_DIR": str(folder)})
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {r["key"] for r in rows} == {a.key for a in arts}


def test_inspect_by_prefix_and_by_file(populated, tmp_path):
    folder, arts = populated
    out = cli("--cache-dir", str(folder), "inspect", arts[0].key[:10])
    header = json.loads(out.stdout)
    assert header["key"] == arts[0].key and header["verified"] is True
    target = tmp_path / "a.gcart"
    got = cli("--cache-dir", str(folder), "get", arts[1].key, "-o", str(target))
    assert got.returncode == 0, got.stderr
    assert Artifact.decode(target.read_bytes()).key == arts[1].key
    out = cli("inspect", str(target))
    assert json.loads(out.stdout)["spec"]["batch"] == 2


def test_inspect_a_corrupt_file_says_so_and_fails(tmp_path, populated):
    folder, arts = populated
    data = bytearray(arts[0].encode())
    data[-3] ^= 1
    bad = tmp_path / "bad.gcart"
    bad.write_bytes(bytes(data))
    out = cli("inspect", str(bad))
    assert out.returncode == 1
    assert json.loads(out.stdout)["verified"] is False


def test_rm_removes_and_missing_key_is_one_clear_line(populated):
    folder, arts = populated
    assert cli("--cache-dir", str(folder), "rm", arts[0].key).returncode == 0
    out = cli("--cache-dir", str(folder), "rm", arts[0].key)
    assert out.returncode == 1
    assert "error:" in out.stderr and "Traceback" not in out.stderr
    out = cli("--cache-dir", str(folder), "get", "zz", "-o", "x")
    assert out.returncode != 0 and "Traceback" not in out.stderr and "not a key" in out.stderr


def test_key_prints_the_same_key_as_the_library(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("batch: 1\nheads_q: 8\nseq_q: 128\nhead_dim: 64\nmask: causal\n")
    out = cli("key", str(f), "--target", "h200-sm90-cudnn9.28.0-fe1.32.0")
    from graphcache import Target, key_for

    assert out.stdout.strip() == key_for(spec(), Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0"))
    bad = cli("key", str(f), "--target", "h200")
    assert bad.returncode == 1 and "expected GPU-smMAJORMINOR" in bad.stderr


def test_bad_spec_file_names_the_field(tmp_path):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 60}))
    out = cli("key", str(f), "--target", "h200-sm90-cudnn9.28.0-fe1.32.0")
    assert out.returncode == 1 and "head_dim=60" in out.stderr and "spec.json" in out.stderr


def test_cli_verbs_work_without_torch_or_cudnn(populated):
    # A server host has neither: block their import and run the store verbs.
    folder, _ = populated
    code = (
        "import sys; sys.modules['torch']=None; sys.modules['cudnn']=None; "
        "from graphcache.cli import run; sys.argv=['graphcache','--cache-dir',sys.argv[1],'ls']; run()"
    )
    out = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "3 artifact(s)" in out.stdout
    code = "import sys; sys.modules['torch']=None; sys.modules['cudnn']=None; from graphcache.ops.doctor import diagnose; print(diagnose()['rows'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "not installed" in out.stdout, out.stderr


def test_store_options_are_accepted_after_the_verb(populated):
    folder, arts = populated
    out = cli("ls", "--cache-dir", str(folder))
    assert out.returncode == 0 and "3 artifact(s)" in out.stdout


def test_pin_and_unpin(populated):
    folder, arts = populated
    assert cli("--cache-dir", str(folder), "pin", arts[0].key[:10]).returncode == 0
    assert DiskStore(folder).pinned(arts[0].key)
    assert cli("--cache-dir", str(folder), "pin", arts[0].key, "--off").returncode == 0
    assert not DiskStore(folder).pinned(arts[0].key)
