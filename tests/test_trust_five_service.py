"""Trust, round five, the service's half: a worker bounds what a server
sends, layout texts are bounded as sizes are, a manifest posted without a
token has a bounded cost, and the smaller findings. Each as it was found:
through `graphcache serve` as the docs start it (127.0.0.1, one worker
unless said), the CLI, or the library; docs/reliability.md lists them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from graphcache.artifact import Artifact, frame
from graphcache.stores import DiskStore
from tests.clirun import cli
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import Hostile, RedisServer, ServerThread, endless, free_port, serve_one_worker, wait_for_server

MiB = 1024**2


def stored(folder: Path, *arts: Artifact) -> None:
    store = DiskStore(folder)
    for art in arts:
        store.put(art.key, art.encode())
    store.close()


# -- 4: a worker bounds what a server sends ------------------------------------------------------------


def envelope_head(payload_size: int) -> bytes:
    """A real envelope's prefix and header, for a payload of ``payload_size`` bytes never sent."""
    art = make_artifact(spec())
    header = art.header()
    header["payload_size"] = payload_size
    return frame(header, b"")


# The client's side, in a process of its own: its peak memory is its own, and
# on a client that reads without bound (as before) the address-space limit
# ends it with MemoryError instead of the machine's memory.
CLIENT = """
import json, os, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from graphcache.settings import Settings
from graphcache.stores import open_store
from graphcache.errors import GraphCacheError

def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

out = {}
for name, call in json.loads(sys.argv[2]).items():
    store = open_store(Settings.from_env(), sys.argv[1])  # GRAPHCACHE_MAX_ARTIFACT from the environment
    before, start = peak(), time.monotonic()
    try:
        method, *args = call
        result = getattr(store, method)(*args)
        said = {"result": repr(result if not hasattr(result, "__next__") else list(result))[:200]}
    except (GraphCacheError, MemoryError) as exc:
        said = {"error": type(exc).__name__, "message": str(exc), "sent": getattr(exc, "sent", None),
                "limit": getattr(exc, "limit", None)}
    said.update(seconds=time.monotonic() - start, grew=peak() - before, corrupt=getattr(store, "corrupt", 0))
    out[name] = said
print(json.dumps(out))
"""


def client_calls(url: str, calls: dict[str, list], env: dict[str, str]) -> dict[str, dict]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, url, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_worker_stops_reading_what_a_server_sends_at_its_limit():
    """Finding 4: `HttpStore.get` read 3.8 GiB of an endless chunked body in
    14 s, then MemoryError; batch records could each declare 4 GiB. Each
    answer is refused at GRAPHCACHE_MAX_ARTIFACT (8 MiB here), whatever the
    length header says or omits, the error naming what was sent and the
    bound, and the client's memory grows by about the bound at most."""
    limit = 8 * MiB
    keys = {name: f"{n:x}" * 64 for n, name in enumerate(("garbage", "huge", "longer", "declared"), start=10)}

    def answer(line: str) -> tuple[str, Iterator[bytes]]:
        if line.startswith("POST /v1/batch"):
            return "", iter([b"GCBATCH1" + b"E" + keys["huge"].encode() + (1 << 40).to_bytes(8, "big"), b"\0" * 4096])
        if "/v1/artifacts/" + keys["garbage"] in line:
            return "", endless(b"\0" * 65536)  # bytes that are no envelope, endlessly
        if "/v1/artifacts/" + keys["huge"] in line:
            return "", endless(envelope_head(1 << 40) + b"\0" * 65536)  # its header declares 1 TiB
        if "/v1/artifacts/" + keys["longer"] in line:
            return "", endless(envelope_head(1 * MiB) + b"\0" * 65536)  # declares 1 MiB, sends on
        if "/v1/artifacts/" + keys["declared"] in line:
            return f"content-length: {10 << 30}\r\n", endless(b"\0" * 65536)
        # the listing (ls, prefetch's larger classes): JSON with no end
        return "", iter([b'{"items": [', *([b'{"key": "' + b"a" * 64 + b'", "size": 1},' * 1000] * 100000)])

    server = Hostile(answer)
    try:
        calls = {
            "garbage": ["get", keys["garbage"]],
            "huge": ["get", keys["huge"]],
            "longer": ["get", keys["longer"]],
            "declared": ["get", keys["declared"]],
            "listing": ["items"],
            "batch": ["get_many", [keys["huge"]]],
        }
        # Each call its own store: a refused answer pauses the store, as a server that does not answer does.
        seen = client_calls(server.url, calls, {"GRAPHCACHE_MAX_ARTIFACT": str(limit)})
    finally:
        server.close()
    garbage = seen.pop("garbage")
    assert garbage["result"] == "None" and garbage["corrupt"] == 1, garbage  # no envelope: stopped at once
    expected = {
        "huge": (1 << 40, "header declares"),
        "longer": (1 * MiB, "the size its own envelope declares"),
        "declared": (10 << 30, "it declared"),
        "listing": (limit, "GRAPHCACHE_MAX_ARTIFACT"),
        "batch": (limit, "GRAPHCACHE_MAX_ARTIFACT"),
    }
    for name, said in seen.items():
        bound, words = expected[name]
        assert said.get("error") == "AnswerTooLarge", (name, said)
        assert said["limit"] <= limit and said["sent"] > said["limit"], (name, said)
        assert str(said["sent"]) in said["message"] and str(said["limit"]) in said["message"], (name, said)
        assert words in said["message"], (name, said)
        assert said["grew"] < limit / MiB + 16, (name, said)  # at most the bound held, never the stream
        assert said["seconds"] < 10, (name, said)


def test_an_artifact_past_the_clients_bound_is_refused_from_its_length_and_still_exists(tmp_path):
    """Finding 4, the honest server: an artifact larger than the client
    reads (GRAPHCACHE_MAX_ARTIFACT below the server's upload limit) is
    refused from its Content-Length before a byte is read, saying to raise
    the bound; HEAD (exists) still answers, and the store is not paused."""
    from graphcache.errors import AnswerTooLarge
    from graphcache.settings import Settings
    from graphcache.stores import open_store

    big, small = make_artifact(spec(batch=1), size=2 * MiB), make_artifact(spec(batch=2))
    stored(tmp_path, big, small)
    with serve_one_worker({"GRAPHCACHE_DIR": str(tmp_path)}) as (url, _):
        client = open_store(Settings.from_env({"GRAPHCACHE_MAX_ARTIFACT": str(MiB)}), url)
        with pytest.raises(AnswerTooLarge) as refused:
            client.get(big.key)
        assert refused.value.sent == len(big.encode()) and refused.value.limit == MiB
        assert "raise GRAPHCACHE_MAX_ARTIFACT" in str(refused.value)
        assert client.exists(big.key)
        with pytest.raises(AnswerTooLarge, match="raise GRAPHCACHE_MAX_ARTIFACT"):
            client.get_many([small.key, big.key])  # its record refused from its head
        assert client.get(small.key) == small.encode()  # not paused: the server did nothing wrong


# -- 7: layout texts are bounded as sizes are ----------------------------------------------------------

GAP = "bhs[+99999999999999999999999999999999999999]d"


def test_a_layout_group_past_what_cuDNN_holds_is_refused_naming_the_field(tmp_path):
    """Finding 7: `/v1/resolve` answered 200 with a key for a `[+N]` of 38
    digits and `warm` built and stored it. A group's N is bounded as every
    size is (2**31 - 1), and the buffer a grouped tensor spans within
    int64: 422 naming the field, and `warm` refuses in one line."""
    body = {"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64, "dtype": "bfloat16"}
    spans = {**body, "batch": 65536, "seq_q": 65536, "layout_q": "bs[2147483647]hd"}  # each size allowed
    with serve_one_worker({"GRAPHCACHE_DIR": str(tmp_path / "served")}) as (url, _):
        for sent, field, said in (
            ({**body, "layout": GAP}, "spec.layout", "2147483647"),
            ({**body, "layout_v": "bs[+2147483648]hd"}, "spec.layout_v", "2147483647"),
            (spans, "spec.layout_q", str(2**63 - 1)),
        ):
            answer = httpx.post(f"{url}/v1/resolve", json={"spec": sent, "target": str(TARGET)}, timeout=10)
            assert answer.status_code == 422, answer.text
            assert answer.json()["detail"].startswith(field) and said in answer.json()["detail"], answer.text
        good = httpx.post(f"{url}/v1/resolve", json={"spec": {**body, "layout": "bs[+2]hd"}, "target": str(TARGET)})
        assert good.status_code == 200, good.text  # a real fused projection's group still keys
    manifest = tmp_path / "gap.yaml"
    manifest.write_text(
        "defaults: {heads_q: 8, head_dim: 64, dtype: bfloat16}\n"
        f"graphs:\n  - {{name: gap, batch: 1, seq_q: 128, layout: '{GAP}'}}\n"
    )
    store = tmp_path / "warmed"
    done = cli("warm", str(manifest), "--compiler", "reference", "--cache-dir", str(store), timeout=120)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stdout + done.stderr
    assert "field 'layout'" in done.stderr and "2147483647" in done.stderr and "Traceback" not in done.stderr
    assert not any(store.rglob("*.val")) and len(list(DiskStore(store).keys())) == 0  # nothing built or stored


# -- 8: a manifest posted without a token has a bounded cost -------------------------------------------

# About 1 KB naming 4,096 exact specs: 0.5 s and more of the server's CPU per target stored.
M4096 = (
    "defaults: {heads_q: 8, head_dim: 64, dtype: bfloat16, shapes: exact}\ngraphs:\n  - name: m\n"
    f"    batch: [{','.join(map(str, range(1, 17)))}]\n    seq_q: [{','.join(map(str, range(1, 257)))}]\n"
)
SMALL = "defaults: {heads_q: 8, head_dim: 64}\ngraphs:\n  - {name: s, batch: [1, 2], seq_q: 128}\n"


@contextlib.contextmanager
def in_process(env: dict[str, str]) -> Iterator[tuple[str, None]]:
    """The app made by create_app in this process, over a store handed to
    it, under the shipped uvicorn configuration: its checks run in a scan
    thread (`graphcache serve` runs them in a helper process)."""
    from graphcache.settings import Settings
    from service.app import create_app

    settings = Settings.from_env(env)
    with ServerThread(create_app(settings, store=DiskStore(settings.cache_dir))) as server:
        yield server.url, None


@pytest.mark.parametrize("where", ["serve", "thread"])
def test_a_manifest_check_costs_at_most_its_budget_per_request_and_per_client(tmp_path, where):
    """Finding 8: a 1 KB manifest (4,096 specs) took 1.2 to 1.6 s of server
    time, anyone's to ask for. A check may take GRAPHCACHE_MANIFEST_SECONDS
    of CPU (then 413), a client GRAPHCACHE_CLIENT_SECONDS a minute, each
    check reserving its budget (then 429 with Retry-After); another client
    is not held back, and a small manifest is answered as before. As
    `graphcache serve` runs them (a helper process) and in a scan thread."""
    stored(tmp_path / "store", make_artifact(spec()))
    named = tmp_path / "manifests"
    named.mkdir()
    (named / "big.yaml").write_text(M4096)
    env = {
        "GRAPHCACHE_DIR": str(tmp_path / "store"),
        "GRAPHCACHE_MANIFESTS": str(named),
        "GRAPHCACHE_MANIFEST_SECONDS": "0.05",
        "GRAPHCACHE_CLIENT_SECONDS": "0.12",
    }
    assert len(M4096) < 1100
    with (serve_one_worker if where == "serve" else in_process)(env) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as client:
            small = client.post("/", content=SMALL)
            assert small.status_code == 200 and "id=coverage" in small.text, small.text[-500:]
            big = client.post("/", content=M4096)
            assert big.status_code == 413, big.text[-500:]
            assert big.json()["error"] == "manifest_budget" and "GRAPHCACHE_MANIFEST_SECONDS" in big.json()["detail"]
            named_big = client.get("/", params={"manifest": "big.yaml"})  # a named manifest is checked as one posted
            assert named_big.status_code == 413 and named_big.json()["error"] == "manifest_budget", named_big.text
            # 0.05 s spent twice of the client's 0.12: less than a check's reservation is left.
            refused = client.post("/", content=SMALL)
            assert refused.status_code == 429, refused.text[-500:]
            assert (
                refused.json()["error"] == "client_budget" and "GRAPHCACHE_CLIENT_SECONDS" in refused.json()["detail"]
            )
            assert int(refused.headers["retry-after"]) >= 1
        # Another client (another loopback address) has its own share.
        other = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=url, timeout=60, transport=other) as client:
            assert client.post("/", content=SMALL).status_code == 200
            assert client.get("/healthz").status_code == 200


# -- 9: the smaller findings ---------------------------------------------------------------------------

CHILD = (
    "import sys, torch, torch.nn.functional as F\n"
    "q = torch.randn(1, 8, 128, 64)\n"
    "F.scaled_dot_product_attention(q, q, q)\n"
)


def test_run_stats_are_private_and_hold_no_argv_and_a_record_failure_keeps_the_status(tmp_path):
    """Finding 9: `graphcache run --stats FILE` wrote each child's argv,
    secrets included, to a 0644 file; `--record` to a path that cannot be
    written exited 1 where the command exited 0."""
    pytest.importorskip("torch", reason="graphcache run serves torch programs")
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    stats = tmp_path / "stats.json"
    stats.write_text("{}")
    stats.chmod(0o644)  # a file that was there, readable by others
    done = cli(
        "run", "--compiler", "reference", "--record", "/dev/full", "--dtype", "bfloat16", "--stats", str(stats),
        "--", sys.executable, str(child), "--token=s3cret-of-the-child", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # the program's status, though the manifest could not be written
    assert "error: --record /dev/full: not written (No space left on device" in done.stderr, done.stderr
    assert "exited with status 0" in done.stderr
    assert "Traceback" not in done.stderr
    assert stat.S_IMODE(stats.stat().st_mode) == 0o600
    written = json.loads(stats.read_text())
    assert written["total"]["calls"] >= 1 and written["processes"]
    assert "s3cret" not in stats.read_text() and all("argv" not in p for p in written["processes"])
    asked = cli(
        "run", "--compiler", "reference", "--stats", str(stats), "--stats-argv",
        "--", sys.executable, str(child), "--token=s3cret-of-the-child", timeout=300,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    assert "--token=s3cret-of-the-child" in json.loads(stats.read_text())["processes"][0]["argv"]
    assert stat.S_IMODE(stats.stat().st_mode) == 0o600


def test_a_store_password_is_taken_from_a_file_never_the_command_line(tmp_path):
    """Finding 9: `serve --store redis://:PW@host` showed the password in
    `ps`. GRAPHCACHE_STORE_FILE names a file holding the URL (a mounted
    secret), `serve` without --store uses it, and a password given with
    --store is warned about."""
    import redis

    with RedisServer() as server:
        password = "s3cret-redis-pw"
        redis.Redis.from_url(server.url).config_set("requirepass", password)
        url = server.url.replace("redis://", f"redis://:{password}@")
        secret = tmp_path / "store-url"
        secret.write_text(url + "\n")
        secret.chmod(0o600)
        art = make_artifact(spec())
        env = {"GRAPHCACHE_STORE_FILE": str(secret), "GRAPHCACHE_DIR": str(tmp_path / "not-this")}
        with serve_one_worker(env) as (served, proc):
            put = httpx.put(f"{served}/v1/artifacts/{art.key}", content=art.encode(), timeout=10)
            assert put.status_code == 201, put.text
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            health = httpx.get(f"{served}/healthz", timeout=5).text
        assert redis.Redis.from_url(url).dbsize() >= 1  # stored in the Redis the file names
        assert password.encode() not in cmdline and password not in health
        port = free_port()
        given = subprocess.Popen(
            [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--workers", "1", "--store", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "GRAPHCACHE_STORE_FILE": str(secret)},  # --store wins over it, in the workers too
        )
        try:
            wait_for_server(f"http://127.0.0.1:{port}", given, healthy=True)
        finally:
            given.terminate()
            _, err = given.communicate(timeout=30)
    assert "warning: --store holds a password" in err and "GRAPHCACHE_STORE_FILE" in err, err
    assert password not in err


def test_a_slow_upload_to_one_server_is_not_swept_by_another_sharing_its_folder(tmp_path):
    """Finding 9: two servers on one folder: one swept the other's
    in-flight upload as dead after about 160 s (the upload survived, the log
    said it died). A file a live server holds is never swept; here it is
    made to look 10 minutes idle, and a second server starts (a sweep)."""
    art = make_artifact(spec(), size=3 * MiB)
    data = art.encode()
    incoming = tmp_path / "incoming"
    with serve_one_worker({"GRAPHCACHE_DIR": str(tmp_path)}) as (url, _):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as sock:
            head = f"PUT /v1/artifacts/{art.key} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(data)}\r\n\r\n"
            sock.sendall(head.encode() + data[: 2 * MiB])  # past the first spooled MiB, then a pause
            deadline = time.monotonic() + 10
            while not list(incoming.glob(".upload-*")):
                assert time.monotonic() < deadline, "the upload's file never appeared"
                time.sleep(0.05)
            (spooled,) = incoming.glob(".upload-*")
            old = time.time() - 3600
            os.utime(spooled, (old, old))  # idle past every server's spool age
            other_port = free_port()
            other = subprocess.Popen(
                [sys.executable, "-m", "graphcache", "serve", "--port", str(other_port), "--workers", "1"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "GRAPHCACHE_DIR": str(tmp_path)},
            )
            try:
                wait_for_server(f"http://127.0.0.1:{other_port}", other, healthy=True)
            finally:
                other.terminate()
                _, said = other.communicate(timeout=30)
            assert spooled.exists(), "the other server swept an upload in flight"
            assert "upload file" not in said, said
            sock.sendall(data[2 * MiB :])
            answer = sock.recv(65536)
        assert answer.split(b" ", 2)[1] == b"201", answer
        assert httpx.get(f"{url}/v1/artifacts/{art.key}", timeout=10).content == data
    assert not list(incoming.glob(".upload-*"))


def test_the_quarantine_keeps_its_cap_oldest_dropped_first_and_counted(tmp_path):
    """Finding 9: the quarantine folder had no cap. It keeps
    GRAPHCACHE_QUARANTINE_SIZE bytes, dropping the oldest copies first,
    each counted in graphcache_quarantine_dropped_total."""
    arts = [make_artifact(spec(batch=n), size=100_000) for n in range(1, 7)]
    store = DiskStore(tmp_path)
    for art in arts:
        bad = bytearray(art.encode())
        bad[-1] ^= 0xFF  # the payload no longer matches its digest
        store.put(art.key, bytes(bad))
    store.close()
    size = len(arts[0].encode())
    env = {"GRAPHCACHE_DIR": str(tmp_path), "GRAPHCACHE_QUARANTINE_SIZE": str(3 * size + size // 2)}
    with serve_one_worker(env) as (url, _):
        for art in arts:
            answer = httpx.get(f"{url}/v1/artifacts/{art.key}", timeout=10)
            assert answer.status_code == 404 and "quarantined" in answer.text, answer.text
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    kept = sorted(p.name.split(".")[0] for p in (tmp_path / "quarantine").iterdir())
    assert kept == sorted(art.key for art in arts[3:])  # the three set aside last
    assert "graphcache_quarantine_dropped_total 3.0" in metrics
    assert 'graphcache_quarantined_total{reason="digest_mismatch"} 6.0' in metrics


@pytest.mark.parametrize("name", ["GRAPHCACHE_MANIFEST_SECONDS", "GRAPHCACHE_CLIENT_SECONDS"])
def test_an_endless_manifest_budget_is_refused_at_start_naming_the_setting(name, tmp_path):
    # inf parses as seconds, but a client's share of inf minus inf is no budget at all.
    env = {"GRAPHCACHE_MANIFEST_SECONDS": "inf", "GRAPHCACHE_CLIENT_SECONDS": "inf", name: "inf"}
    if name == "GRAPHCACHE_CLIENT_SECONDS":
        env["GRAPHCACHE_MANIFEST_SECONDS"] = "2"
    started = cli("serve", "--port", str(free_port()), env={**env, "GRAPHCACHE_DIR": str(tmp_path)}, timeout=60)
    assert started.returncode != 0
    assert f"{name}='inf' must be a finite number of CPU seconds" in started.stderr + started.stdout


def test_a_byte_size_setting_below_one_says_the_unit_and_gives_an_example():
    from graphcache.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match=r"GRAPHCACHE_MAX_ARTIFACT='0' must be > 0 bytes, e\.g\. GRAPHCACHE_MAX"):
        Settings.from_env({"GRAPHCACHE_MAX_ARTIFACT": "0"})
    with pytest.raises(SettingsError, match=r"GRAPHCACHE_HOT_CACHE='-1' must be >= 0 bytes"):
        Settings.from_env({"GRAPHCACHE_HOT_CACHE": "-1"})


def test_a_batch_answers_overlong_record_names_the_setting_only_where_raising_it_helps():
    """An envelope record past GRAPHCACHE_MAX_ARTIFACT may be a larger plan: the
    error says to raise it. A note record (absent, end) past its 64 KiB is no
    answer any setting makes readable: the error does not send the user there."""
    from graphcache.batch import ABSENT, ENVELOPE, MAGIC, record_head
    from graphcache.errors import AnswerTooLarge
    from graphcache.stores import HttpStore

    key = "ab" * 32
    heads = {ENVELOPE: record_head(ENVELOPE, key, 1 << 40), ABSENT: record_head(ABSENT, key, 1 << 20)}
    for kind, hint in ((ENVELOPE, True), (ABSENT, False)):
        server = Hostile(lambda line, kind=kind: ("", iter([MAGIC + heads[kind], b"\0" * 4096])))
        try:
            with pytest.raises(AnswerTooLarge) as refused:
                HttpStore(server.url, timeout=10, max_artifact=8 * MiB).get_many([key])
        finally:
            server.close()
        assert ("raise GRAPHCACHE_MAX_ARTIFACT" in str(refused.value)) is hint, str(refused.value)


def test_entries_set_aside_unread_keep_the_quarantine_cap_too(tmp_path):
    """The other way into quarantine: a value file that cannot be read (here a
    planted symlink, set aside as itself, never followed) counts against
    GRAPHCACHE_QUARANTINE_SIZE as a corrupt copy does, oldest dropped first."""
    from tests.test_trust_four import value_file

    arts = [make_artifact(spec(batch=n), size=100_000) for n in range(1, 5)]  # in value files
    stored(tmp_path / "store", *arts)
    target = "/nonexistent/" + "x" * 187  # a link's size is its target's length: 200 bytes
    for art in arts:
        path = value_file(tmp_path / "store", art.key)
        path.unlink()
        path.symlink_to(target)
    env = {"GRAPHCACHE_DIR": str(tmp_path / "store"), "GRAPHCACHE_QUARANTINE_SIZE": "450"}
    with serve_one_worker(env) as (url, _):
        for art in arts:
            answer = httpx.get(f"{url}/v1/artifacts/{art.key}", timeout=10)
            assert answer.status_code == 404 and "unreadable" in answer.text, answer.text
            time.sleep(0.01)  # set aside in this order
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    kept = sorted(p.name.split(".")[0] for p in (tmp_path / "store" / "quarantine").iterdir())
    assert kept == sorted(art.key for art in arts[2:])  # two links of 200 bytes fit in 450
    assert "graphcache_quarantine_dropped_total 2.0" in metrics


def test_an_upload_cut_by_shutdown_is_one_log_line_not_a_traceback(tmp_path):
    """Finding 9: a slow upload cut by SIGTERM logged a CancelledError
    traceback. It is one line saying what was cut."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GRAPHCACHE_DIR": str(tmp_path)},
    )
    try:
        wait_for_server(f"http://127.0.0.1:{port}", proc, healthy=True)
        art = make_artifact(spec())
        data = art.encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            head = f"PUT /v1/artifacts/{art.key} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(data) + MiB}\r\n\r\n"
            sock.sendall(head.encode() + data[:100])
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)  # its grace (10 s) passes with the body still arriving
            _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, -signal.SIGTERM), err  # uvicorn ends by the signal it was sent
    assert "Traceback" not in err and "CancelledError" not in err, err
    cut = [line for line in err.splitlines() if "shut down while its body was arriving" in line]
    assert len(cut) == 1 and f"PUT /v1/artifacts/{art.key}" in cut[0] and "100 of" in cut[0], err
