"""No pickle anywhere: a pickled row in the DiskStore index is corrupt, never loaded.

diskcache unpickles a value whose row says it was pickled (CVE-2025-69872),
so whoever can write the cache folder could run code in every process that
reads it. These tests write such rows into the SQLite index directly, as an
attacker with write access to the folder would, and read them through every
reader graphcache has. The payload creates a folder when unpickled: if the
folder appears, code ran.
"""

from __future__ import annotations

import json
import os
import pickle
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from graphcache import Artifact, CorruptArtifact, GraphCache
from graphcache.settings import Settings
from graphcache.stores import DiskStore, stored_header
from service.app import create_app
from tests.clirun import cli
from tests.fakes import FakeCompiler, make_artifact, spec
from tests.servers import ServerThread


class RunsCode:
    """Unpickling this calls os.mkdir(marker)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):  # noqa: ANN204
        return (os.mkdir, (self.marker,))


def plant(folder: Path, key: str, marker: Path, *, in_file: bool) -> None:
    """Write a row for ``key`` whose value is pickled (diskcache mode 4), inline
    in the index or in a value file, the way diskcache itself would."""
    DiskStore(folder).close()  # the index and its tables exist
    blob = pickle.dumps(RunsCode(marker))
    filename, value = None, sqlite3.Binary(blob)
    if in_file:
        filename, value = "aa/bb/planted.val", None
        (folder / "aa" / "bb").mkdir(parents=True, exist_ok=True)
        (folder / filename).write_bytes(blob)
    now = time.time()
    with sqlite3.connect(folder / "cache.db") as db:
        db.execute("DELETE FROM Cache WHERE key = ?", (key,))
        db.execute(
            "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
            " filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, 4, ?, ?)",
            (key, now, now, len(blob), filename, value),
        )


@pytest.fixture(params=["inline", "file"])
def planted(request, tmp_path):
    folder, marker = tmp_path / "cache", tmp_path / "code-ran"
    good = make_artifact(spec(batch=2))
    store = DiskStore(folder)
    store.put(good.key, good.encode())
    store.close()
    key = make_artifact(spec()).key
    plant(folder, key, marker, in_file=request.param == "file")
    yield folder, key, marker, good
    assert not marker.exists(), "a pickled row was unpickled: code from the cache folder ran"


def test_disk_store_reads_a_pickled_row_as_bytes_that_fail_verification(planted):
    folder, key, marker, good = planted
    store = DiskStore(folder)
    assert key in set(store.keys())
    for data in (store.get(key), store.read(key)[0], store.head(key, 64 * 1024)):
        assert isinstance(data, bytes)
        with pytest.raises(CorruptArtifact):
            Artifact.decode(data, expected_key=key)
    with pytest.raises(CorruptArtifact):
        stored_header(store, key)
    store.pin(key)  # re-tagging a row reads its value
    assert store.leases().try_acquire(key, "me", 5)
    assert not marker.exists()
    # a put over it replaces it with the real artifact
    art = make_artifact(spec())
    assert store.put(key, art.encode()) is True
    assert Artifact.decode(store.get(key), expected_key=key) == art


@pytest.mark.parametrize("value", ["abc", 12, 1.5, None])
def test_an_inline_text_row_reads_as_bytes_that_fail_verification(tmp_path, value):
    """A row in diskcache's text mode (3) held inline: bytes, never a crash."""
    folder = tmp_path / "cache"
    DiskStore(folder).close()
    key = make_artifact(spec()).key
    now = time.time()
    with sqlite3.connect(folder / "cache.db") as db:
        db.execute(
            "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
            " filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 3, 3, NULL, ?)",
            (key, now, now, value),
        )
    store = DiskStore(folder)
    data = store.get(key)
    assert isinstance(data, bytes)
    with pytest.raises(CorruptArtifact):
        Artifact.decode(data, expected_key=key)
    assert GraphCache(store, FakeCompiler()).load(spec()) is not None  # counted corrupt, rebuilt


def test_graph_cache_counts_a_pickled_row_as_corrupt_and_rebuilds(planted):
    folder, key, marker, good = planted
    compiler = FakeCompiler()
    cache = GraphCache(DiskStore(folder), compiler)
    assert cache.get(spec()).key == key
    assert cache.stats()["corrupt"] == 1 and compiler.builds == 1


def test_cli_reports_a_pickled_row_as_corrupt(planted, tmp_path):
    folder, key, marker, good = planted
    out = cli("--cache-dir", str(folder), "ls")
    assert out.returncode == 0, out.stderr
    assert f"{key[:12]}" in out.stdout and "corrupt" in out.stdout
    rows = {r["key"]: r for r in map(json.loads, cli("--cache-dir", str(folder), "ls", "--json").stdout.splitlines())}
    assert "corrupt" in rows[key] and rows[good.key]["target_text"]
    got = cli("--cache-dir", str(folder), "get", key, "-o", str(tmp_path / "out"))
    assert got.returncode == 1 and "Traceback" not in got.stderr
    assert got.stderr.strip().splitlines()[0].startswith("error: ") and len(got.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    shown = cli("--cache-dir", str(folder), "inspect", key)
    assert shown.returncode == 1 and json.loads(shown.stdout)["verified"] is False


def test_the_service_quarantines_and_counts_a_pickled_row(planted):
    folder, key, marker, good = planted
    store = DiskStore(folder)
    with ServerThread(create_app(Settings(cache_dir=folder), store=store)) as srv:
        listing = httpx.get(f"{srv.url}/v1/artifacts").json()["items"]
        assert {i["key"]: i for i in listing}[key].get("corrupt")
        response = httpx.get(f"{srv.url}/v1/artifacts/{key}")
        assert response.status_code == 404 and response.json()["error"] == "not_found"
        assert httpx.get(f"{srv.url}/v1/stats").json()["quarantined"] == 1
        assert httpx.get(f"{srv.url}/v1/artifacts/{good.key}").status_code == 200
    assert not store.exists(key)
    assert [p.name.split(".")[0] for p in (folder / "quarantine").iterdir()] == [key]


def test_a_pickled_key_is_never_loaded(tmp_path):
    folder, marker = tmp_path / "cache", tmp_path / "code-ran"
    art = make_artifact(spec())
    store = DiskStore(folder)
    store.put(art.key, art.encode())
    now = time.time()
    with sqlite3.connect(folder / "cache.db") as db:
        db.execute(
            "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
            " filename, value) VALUES (?, 0, ?, NULL, ?, 0, NULL, 1, 1, NULL, ?)",
            (sqlite3.Binary(pickle.dumps(RunsCode(marker))), now, now, b"x"),
        )
    assert list(DiskStore(folder).keys()) == [art.key]
    assert cli("--cache-dir", str(folder), "ls").returncode == 0
    assert not marker.exists()


def test_disk_store_refuses_to_pickle(tmp_path):
    store = DiskStore(tmp_path)
    with pytest.raises(TypeError, match="never pickles"):
        store._cache.set("k", {"a": 1})  # noqa: SLF001 - the codec DiskStore writes through
