"""A full disk (issue 20): DiskStore on a real 4 MiB tmpfs, filled with
256 KiB uploads through `graphcache serve` as a user starts it, on 127.0.0.1.

Needs root and a kernel that lets this container mount tmpfs (CI runs as
root on the same kind of machine); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from graphcache.batch import ENVELOPE, BatchParser
from graphcache.errors import StoreFull
from graphcache.stores import HttpStore
from tests.clirun import cli
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import free_port, wait_for_server

ROOT = Path(__file__).resolve().parents[1]
WRITE, ADMIN = "w-token", "a-token"
AUTH_W = {"authorization": f"Bearer {WRITE}"}
AUTH_A = {"authorization": f"Bearer {ADMIN}"}
ENTRY = 256 * 1024
DISK = "4m"


def _mount_problem(where: Path) -> str | None:
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root (CI runs the suite as root)"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        return f"cannot mount a tmpfs here: {done.stderr.decode().strip() or done.returncode}"
    return None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem of this test's own."""
    where = tmp_path / "disk"
    problem = _mount_problem(where)
    if problem is not None:
        pytest.skip(problem)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


class Served:
    """`graphcache serve --workers 1` on a folder of the small disk."""

    def __init__(self, folder: Path, **env: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_ADMIN_TOKENS": ADMIN, **env}
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Served:
        # One worker: healthz's "writable" is what this worker saw (docs/reliability.md).
        cmd = [sys.executable, "-m", "graphcache", "serve", "--port", str(self.port), "--workers", "1"]
        cmd += ["--cache-dir", str(self.folder), "--log-level", "warning"]
        # The server's log goes to a file off the small disk (a pipe nobody
        # reads could fill and stop the server); shown when the test fails.
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        wait_for_server(self.url, self.proc, timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.seek(0)
        print(self.log.read()[-5000:])  # pytest shows it for a failing test
        self.log.close()


def fill(client: httpx.Client, start: int = 1, most: int = 24) -> tuple[dict[str, bytes], httpx.Response]:
    """Upload 256 KiB artifacts until one is refused; what was stored, and the refusal."""
    stored: dict[str, bytes] = {}
    for batch in range(start, start + most):
        art = make_artifact(spec(batch=batch), size=ENTRY)
        got = client.put(f"/v1/artifacts/{art.key}", content=art.encode(), headers=AUTH_W)
        if got.status_code != 201:
            return stored, got
        stored[art.key] = art.encode()
    raise AssertionError(f"{most} uploads of 256 KiB fitted on a {DISK} disk")


def fill_to_the_last_byte(disk: Path) -> None:
    """What is left of the disk, taken by someone else's file."""
    with open(disk / f"ballast-{uuid.uuid4().hex[:8]}", "wb") as fh:
        try:
            fh.write(b"\0" * (8 * 1024 * 1024))
        except OSError:
            pass  # full, as meant
    left = os.statvfs(disk)
    assert left.f_bavail * left.f_frsize < 4096


def value_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("[0-9a-f][0-9a-f]/[0-9a-f][0-9a-f]/*.val"))


def batch_found(client: httpx.Client, keys: list[str]) -> dict[str, bytes]:
    got = client.post("/v1/batch", json={"keys": keys})
    assert got.status_code == 200, got.text
    parser = BatchParser()
    records = list(parser.feed(got.content))
    assert parser.complete
    return {r.key: r.body for r in records if r.kind == ENVELOPE}


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_full_disk_serves_every_stored_entry_and_refuses_uploads_with_507(small_disk):
    folder = small_disk / "cache"
    with Served(folder) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        assert client.get("/healthz").json()["writable"] is True
        assert metric(client, "graphcache_store_writable") == 1.0
        stored, refused = fill(client)
        assert len(stored) >= 6, "the disk took some uploads first"

        # The upload that does not fit: 507, JSON, out of space, what the store holds.
        assert refused.status_code == 507, refused.text
        body = refused.json()
        assert body["error"] == "store_full" and "out of space" in body["detail"]
        assert f"holds {len(stored)} entries" in body["detail"] and body["entries"] == len(stored)
        assert body["stored_bytes"] >= len(stored) * ENTRY and body["free_bytes"] < ENTRY + 4096
        again = client.put(
            f"/v1/artifacts/{make_artifact(spec(batch=99), size=ENTRY).key}",
            content=make_artifact(spec(batch=99), size=ENTRY).encode(),
            headers=AUTH_W,
        )
        assert again.status_code == 507
        # A client of the service (warm, a worker's upload) is told the same, as StoreFull.
        with pytest.raises(StoreFull, match="out of space"):
            HttpStore(srv.url, token=WRITE).put(
                make_artifact(spec(batch=98), size=ENTRY).key, make_artifact(spec(batch=98), size=ENTRY).encode()
            )
        assert client.get("/v1/stats").json()["uploads_rejected"] == {"store_full": 3}
        # Nothing partial stays: one whole value file per stored entry, and no
        # upload's file (each is written to incoming/ as it arrives).
        files = value_files(folder)
        assert len(files) == len(stored) and all(f.stat().st_size > ENTRY for f in files)
        assert list((folder / "incoming").iterdir()) == []
        fill_to_the_last_byte(small_disk)

        # Reads never depend on a write: GET, HEAD and batch serve every entry.
        # The access time each read records could not be written: counted, not raised.
        failed_before = metric(client, "graphcache_store_bookkeeping_errors_total")
        for key, data in stored.items():
            assert client.get(f"/v1/artifacts/{key}").content == data
            assert client.head(f"/v1/artifacts/{key}").status_code == 200
        assert batch_found(client, list(stored)) == stored
        assert metric(client, "graphcache_store_bookkeeping_errors_total") > failed_before

        # Healthy (reads are served) but not writable, and why; a gauge says it too.
        health = client.get("/healthz")
        assert health.status_code == 200, health.text
        assert health.json()["writable"] is False and "out of space" in health.json()["reason"]
        assert metric(client, "graphcache_store_writable") == 0.0

        # Space is freed with the tools: DELETE works on the full disk, and then an upload fits.
        for key in list(stored)[:2]:
            assert client.delete(f"/v1/artifacts/{key}", headers=AUTH_A).status_code == 204
            assert client.get(f"/v1/artifacts/{key}").status_code == 404
        # Room for the refused upload and the index's reserve (docs/reliability.md):
        # health says so at once, before any upload succeeds (issue 27, item 8).
        for key in list(stored)[2:6]:
            assert client.delete(f"/v1/artifacts/{key}", headers=AUTH_A).status_code == 204
        assert client.get("/healthz").json()["writable"] is True, client.get("/healthz").text
        art = make_artifact(spec(batch=100), size=ENTRY)
        assert client.put(f"/v1/artifacts/{art.key}", content=art.encode(), headers=AUTH_W).status_code == 201
        assert client.get(f"/v1/artifacts/{art.key}").content == art.encode()


@pytest.mark.parametrize("reserve", [True, False], ids=["with-reserve", "no-reserve"])
def test_the_cli_and_a_restarted_server_work_on_a_full_disk(small_disk, reserve):
    folder = small_disk / "cache"
    with Served(folder) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        stored, refused = fill(client)
        assert refused.status_code == 507
    if not reserve:
        # A folder that filled before it held a reserve (another program
        # filled the disk, an older graphcache): its index opens read-only.
        (folder / "reserve").unlink()
    # An orphan an earlier crash left (a value file no entry names, an hour old)
    # and the disk filled to its last byte by someone else.
    orphan = folder / "ab" / "cd" / f"{uuid.uuid4().hex}.val"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"\0" * 1000)
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    fill_to_the_last_byte(small_disk)

    env = {"GRAPHCACHE_DIR": str(folder)}
    listed = cli("ls", "--json", env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert "not a diskcache index" not in listed.stderr
    assert {json.loads(line)["key"] for line in listed.stdout.splitlines()} == set(stored)
    if not reserve:
        # Opening the index may have checkpointed and removed a write-ahead log
        # the first server left (whether it left one depends on when SQLite last
        # checkpointed): the folder without a reserve is full to the last byte again.
        fill_to_the_last_byte(small_disk)

    with Served(folder) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        assert not orphan.exists(), "the restarted server swept the crash's orphan"
        health = client.get("/healthz")
        assert health.status_code == 200 and health.json()["writable"] is False
        assert reserve or "read-only" in health.json()["reason"], health.json()
        for key, data in stored.items():
            assert client.get(f"/v1/artifacts/{key}").content == data
        # A pin on the full disk: the reserve makes room for it; without one it
        # is a 507 that says what to free (not a 500).
        pin = client.post(f"/v1/artifacts/{next(iter(stored))}/pin", headers=AUTH_W)
        if reserve:
            assert pin.status_code == 200, pin.text
        else:
            assert pin.status_code == 507 and pin.json()["error"] == "store_full", pin.text
            assert "free at least" in pin.json()["detail"]

    keys = list(stored)
    removed = cli("rm", keys[0], env=env, timeout=60)
    assert removed.returncode == 0, removed.stderr
    purged = cli("purge", "--target", str(TARGET), env=env, timeout=60)
    assert purged.returncode == 0, purged.stderr
    assert cli("ls", "--json", env=env, timeout=60).stdout.strip() == ""
    assert value_files(folder) == []


def test_the_lru_cap_makes_room_on_a_full_disk(small_disk):
    folder = small_disk / "cache"
    with Served(folder) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        stored, refused = fill(client)
        assert refused.status_code == 507
    # The operator lowers the cap below the disk's size: uploads evict the
    # least recently used entries to make room, on the disk still full, to
    # its last byte once the server is up (an upload's file, written before
    # the upload is stored, finds no room at all until entries go).
    cap = 2 * 1024 * 1024
    with Served(folder, GRAPHCACHE_SIZE_LIMIT=str(cap)) as srv, httpx.Client(base_url=srv.url, timeout=10) as client:
        fill_to_the_last_byte(small_disk)
        newer = [make_artifact(spec(batch=200 + i), size=ENTRY) for i in range(3)]
        for art in newer:
            got = client.put(f"/v1/artifacts/{art.key}", content=art.encode(), headers=AUTH_W)
            assert got.status_code == 201, got.text
        for art in newer:
            assert client.get(f"/v1/artifacts/{art.key}").content == art.encode()
        assert list((folder / "incoming").iterdir()) == []
        kept = [k for k in stored if client.head(f"/v1/artifacts/{k}").status_code == 200]
        assert len(kept) < len(stored)
        assert sum(f.stat().st_size for f in value_files(folder)) <= cap


def test_a_worker_whose_local_disk_is_full_still_gets_what_the_service_holds(small_disk, tmp_path):
    from graphcache import GraphCache
    from graphcache.settings import Settings
    from graphcache.stores import DiskStore, TieredStore
    from service.app import create_app
    from tests.servers import ServerThread

    local = DiskStore(small_disk / "worker")
    with pytest.raises(StoreFull):  # the worker's own disk fills up
        for batch in range(1, 30):
            art = make_artifact(spec(batch=batch), size=ENTRY)
            local.put(art.key, art.encode())
    fill_to_the_last_byte(small_disk)
    remote = DiskStore(tmp_path / "service")
    wanted = [make_artifact(spec(batch=100 + i, seq_q=256), size=ENTRY) for i in range(3)]
    for art in wanted:
        remote.put(art.key, art.encode())
    with ServerThread(create_app(Settings(cache_dir=remote.path), store=remote)) as srv:
        tiered = TieredStore(local, HttpStore(srv.url))
        cache = GraphCache(tiered)
        assert cache.get(wanted[0].spec, TARGET).key == wanted[0].key  # not kept locally, still served
        report = cache.prefetch([a.spec for a in wanted[1:]], TARGET)
        assert report.present == 2 and not report.missing
        assert tiered.local_errors == 3


def test_a_build_on_a_full_disk_is_used_by_a_worker_and_reported_by_the_service(small_disk):
    from graphcache import GraphCache
    from graphcache.settings import Settings
    from graphcache.stores import DiskStore
    from service.app import create_app
    from tests.fakes import FakeCompiler
    from tests.servers import ServerThread

    store = DiskStore(small_disk / "c")
    with pytest.raises(StoreFull):
        for batch in range(1, 30):
            art = make_artifact(spec(batch=batch), size=ENTRY)
            store.put(art.key, art.encode())
    fill_to_the_last_byte(small_disk)
    cache = GraphCache(store, FakeCompiler(size=ENTRY))
    built = cache.get(spec(batch=500), TARGET)  # built, not kept: still returned
    assert built.spec == spec(batch=500) and cache.stats()["store_errors"] == 1
    assert not store.exists(built.key)
    app = create_app(Settings(cache_dir=store.path), store=store, compiler=FakeCompiler(size=ENTRY))
    with ServerThread(app) as srv:
        got = httpx.post(f"{srv.url}/v1/build", json={"spec": spec(batch=501).to_dict()}, timeout=30)
    assert got.status_code == 507 and got.json()["error"] == "store_full", got.text
    assert "nothing was stored" in got.json()["detail"]


def test_an_index_closed_cleanly_before_the_disk_filled_is_read_by_the_cli(small_disk):
    """No reserve, no WAL left open: the ordinary open that fails first leaves
    SQLite's shared-memory file a few bytes long, and a read-only open through
    it failed (disk I/O error): ls, get and the server read nothing."""
    from graphcache.stores import DiskStore

    folder = small_disk / "cache"
    store = DiskStore(folder)
    stored: dict[str, bytes] = {}
    with pytest.raises(StoreFull):
        for batch in range(1, 30):
            art = make_artifact(spec(batch=batch), size=ENTRY)
            store.put(art.key, art.encode())
            stored[art.key] = art.encode()
    store.close()  # a clean shutdown: the WAL is checkpointed into cache.db and removed
    (folder / "reserve").unlink()
    fill_to_the_last_byte(small_disk)

    env = {"GRAPHCACHE_DIR": str(folder)}
    listed = cli("ls", "--json", env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert {json.loads(line)["key"] for line in listed.stdout.splitlines()} == set(stored)
    key = next(iter(stored))
    out = small_disk.parent / "got.gca"  # off the full disk
    got = cli("get", key, "-o", str(out), env=env, timeout=60)
    assert got.returncode == 0, got.stderr
    assert out.read_bytes() == stored[key]
