"""Trust, round three (issue 33): a client without a token cannot take the
upload budget, a reader who never reads is cut at the send deadline, and
uploads stream to a temporary file instead of memory. Every server is
`graphcache serve` as a user starts it, one worker, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from graphcache.stores import DiskStore
from tests.fakes import make_artifact, spec
from tests.servers import batch_request, drained, non_reader, raw_put, serve_one_worker

WRITE = "w-token"
AUTH = {"authorization": f"Bearer {WRITE}"}
MiB = 1024**2


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def answer_of(sock: socket.socket, timeout: float = 10) -> bytes:
    """What the server sends until it closes the connection (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


# -- item 1: bodies of read routes cannot take the upload budget --------------------------------------


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_260_held_unauthenticated_bodies_leave_an_authenticated_put_at_201(tmp_path, framing):
    """260 manifests declared to POST / (open: no read tokens), none sent:
    they once reserved 260 MiB of the 256 MiB upload budget, and every PUT
    was a 503 for as long as they held."""
    env = {"GRAPHCACHE_WRITE_TOKENS": WRITE, "GRAPHCACHE_DIR": str(tmp_path)}
    length = f"content-length: {MiB}" if framing == "length" else "transfer-encoding: chunked"
    head = f"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n{length}\r\n\r\n".encode()
    stored = make_artifact(spec(batch=4), size=10_000)
    with serve_one_worker(env) as (url, _):
        assert httpx.put(f"{url}/v1/artifacts/{stored.key}", content=stored.encode(), headers=AUTH).status_code == 201
        held = []
        try:
            for _ in range(260):
                sock = socket.create_connection(("127.0.0.1", port_of(url)), timeout=10)
                sock.sendall(head)
                held.append(sock)
            time.sleep(1.0)  # every head read and its body awaited
            art = make_artifact(spec(batch=3), size=100_000)
            put = httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers=AUTH, timeout=10)
            assert put.status_code == 201, put.text
            # Reads with and without a body go on too.
            assert httpx.get(f"{url}/v1/artifacts/{art.key}", timeout=10).content == art.encode()
            batch = httpx.post(f"{url}/v1/batch", json={"keys": [art.key, stored.key]}, timeout=10)
            assert batch.status_code == 200, batch.text
            # The held bodies are still held: none was answered yet.
            for sock in held[:5]:
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
        finally:
            for sock in held:
                sock.close()


def test_read_bodies_past_the_body_budget_get_503_and_uploads_go_on(tmp_path):
    """GRAPHCACHE_BODY_BUDGET bounds the bytes of read-route bodies one
    worker holds, charged as they arrive; past it 503 body_budget, closed."""
    env = {
        "GRAPHCACHE_WRITE_TOKENS": WRITE,
        "GRAPHCACHE_DIR": str(tmp_path),
        "GRAPHCACHE_BODY_BUDGET": str(2 * MiB),
    }
    head = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 1048576\r\n\r\n"
    with serve_one_worker(env) as (url, _):
        held = [socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) for _ in range(2)]
        try:
            for sock in held:  # two manifests of 1 MiB, all but their last byte sent: the budget is used
                sock.sendall(head + b" " * (MiB - 1))
            time.sleep(1.0)
            with socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) as sock:
                sock.sendall(head + b" " * 1000)
                answer = answer_of(sock)
            assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
            assert b"retry-after: 1" in answer.lower() and b"connection: close" in answer.lower()
            got = json.loads(answer.partition(b"\r\n\r\n")[2])
            assert got["error"] == "body_budget" and "GRAPHCACHE_BODY_BUDGET" in got["detail"], got
            art = make_artifact(spec(batch=5), size=100_000)
            put = httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), headers=AUTH, timeout=10)
            assert put.status_code == 201, put.text
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.5)  # the held bodies' bytes are given back
        assert httpx.post(f"{url}/v1/batch", json={"keys": ["a" * 64]}, timeout=10).status_code == 200


def test_where_writes_are_open_a_declared_upload_holds_only_what_it_sent(tmp_path):
    """No write tokens: anyone may upload, so no upload is promised room up
    front; one that declares its size and sends nothing holds nothing."""
    env = {
        "GRAPHCACHE_DIR": str(tmp_path),
        "GRAPHCACHE_MAX_UPLOAD": str(MiB),
        "GRAPHCACHE_UPLOAD_BUDGET": str(2 * MiB),
    }
    head = f"PUT /v1/artifacts/{'a' * 64} HTTP/1.1\r\nhost: t\r\ncontent-length: {MiB}\r\n\r\n".encode()
    with serve_one_worker(env) as (url, _):
        held = [socket.create_connection(("127.0.0.1", port_of(url)), timeout=10) for _ in range(4)]
        try:
            for sock in held:
                sock.sendall(head)
            time.sleep(1.0)
            art = make_artifact(spec(batch=6), size=100_000)
            put = httpx.put(f"{url}/v1/artifacts/{art.key}", content=art.encode(), timeout=10)
            assert put.status_code == 201, put.text
        finally:
            for sock in held:
                sock.close()


def test_the_body_budget_is_checked_at_start():
    from graphcache.settings import Settings, SettingsError

    assert Settings.from_env({}).body_budget == 16 * MiB
    assert Settings.from_env({"GRAPHCACHE_BODY_BUDGET": "4194304"}).body_budget == 4 * MiB
    for value in ("0", "-1", "lots"):
        with pytest.raises(SettingsError, match="GRAPHCACHE_BODY_BUDGET"):
            Settings.from_env({"GRAPHCACHE_BODY_BUDGET": value})


def test_a_body_budget_below_the_largest_read_body_fails_the_server_at_start(tmp_path):
    from graphcache.settings import Settings, SettingsError
    from service.app import create_app

    settings = Settings.from_env({"GRAPHCACHE_BODY_BUDGET": str(MiB - 1), "GRAPHCACHE_DIR": str(tmp_path)})
    with pytest.raises(SettingsError, match="GRAPHCACHE_BODY_BUDGET=1048575 is below"):
        create_app(settings, store=DiskStore(Path(tmp_path)))


# -- item 2: a reader who never reads is cut at the send deadline ------------------------------------

SEND_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A DiskStore folder with 100 artifacts of 64 KiB and one of 8 MiB."""
    folder = tmp_path_factory.mktemp("stored")
    store = DiskStore(folder)
    small = [make_artifact(spec(batch=b), size=64 * 1024) for b in range(1, 101)]
    big = make_artifact(spec(batch=500), size=8 * MiB)
    for art in [*small, big]:
        store.put(art.key, art.encode())
    store.close()
    return folder, [a.key for a in small], big


def first_200(url: str, path: str, until: float) -> float | None:
    """When ``path`` first answered 200 (polled), or None by ``until``."""
    while time.monotonic() < until:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + path, timeout=1).status_code == 200:
                return time.monotonic()
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("what", ["batch", "get", "first-get"])
def test_16_readers_that_never_read_leave_stats_answering_within_the_send_deadline(stored, what):
    """At --limit-concurrency 16, 16 answers nobody drains (a batch of 100 x
    64 KiB, or an 8 MiB GET streamed from its file) held every slot for as
    long as the clients lived: /v1/stats was 503 throughout. The first GETs
    of an entry not yet verified are written whole: their requests ended,
    but their connections, and the 5 MiB each that the kernel did not take,
    stayed for good."""
    folder, keys, big = stored
    env = {"GRAPHCACHE_DIR": str(folder), "GRAPHCACHE_SEND_TIMEOUT": str(SEND_TIMEOUT)}
    get = f"GET /v1/artifacts/{big.key} HTTP/1.1\r\nhost: t\r\n\r\n".encode()
    request = batch_request(keys) if what == "batch" else get
    with serve_one_worker(env, "--limit-concurrency", "16") as (url, _):
        # Verified once: small entries are then served from memory, the large one from its file.
        warm = httpx.post(url + "/v1/batch", json={"keys": keys}, timeout=10)
        assert warm.status_code == 200
        whole = len(warm.content) if what == "batch" else len(big.encode())
        if what == "get":
            assert httpx.get(f"{url}/v1/artifacts/{big.key}", timeout=10).content == big.encode()
        readers = [non_reader(port_of(url), request) for _ in range(16)]
        try:
            sent = time.monotonic()
            answered = first_200(url, "/v1/stats", sent + SEND_TIMEOUT + 5)
            assert answered is not None, "/v1/stats never answered 200 while the answers were not drained"
            assert answered - sent <= SEND_TIMEOUT + 1, answered - sent
            time.sleep(max(0.0, sent + SEND_TIMEOUT + 1 - time.monotonic()))
            # Each answer was cut at the deadline: what the kernel held, then the
            # close. The kernel held little of it (TCP_NOTSENT_LOWAT; about 3 MiB
            # a connection without).
            for sock in readers:
                size, closed = drained(sock)
                assert closed and size < min(whole, MiB), (size, whole)
            assert "graphcache_send_timeouts_total 16.0" in httpx.get(url + "/metrics", timeout=10).text
        finally:
            for sock in readers:
                sock.close()


def test_60_readers_that_never_read_leave_gets_at_0_errors(stored):
    """Answers stalled on their reader do not count against
    --limit-concurrency (4 x the limit of them; each is cut at the send
    deadline), as bodies still arriving do not."""
    folder, keys, _ = stored
    env = {"GRAPHCACHE_DIR": str(folder), "GRAPHCACHE_SEND_TIMEOUT": "4"}
    with serve_one_worker(env, "--limit-concurrency", "16") as (url, _):
        assert httpx.post(url + "/v1/batch", json={"keys": keys}, timeout=10).status_code == 200
        readers = [non_reader(port_of(url), batch_request(keys)) for _ in range(60)]
        errors, gets = [], 0
        try:
            time.sleep(0.5)
            with httpx.Client(base_url=url, timeout=5) as client:
                until = time.monotonic() + 2.5
                while time.monotonic() < until:
                    for path in ("/v1/stats", f"/v1/artifacts/{keys[0]}"):
                        got = client.get(path)
                        gets += 1
                        if got.status_code != 200:
                            errors.append(f"{path}: {got.status_code} {got.text[:100]}")
        finally:
            for sock in readers:
                sock.close()
    assert gets > 20 and not errors, (gets, errors[:5])


def test_the_send_timeout_is_checked_at_start():
    from graphcache.settings import Settings, SettingsError

    assert Settings.from_env({}).send_timeout == 30.0
    assert Settings.from_env({"GRAPHCACHE_SEND_TIMEOUT": "2.5"}).send_timeout == 2.5
    for value in ("0", "-1", "soon"):
        with pytest.raises(SettingsError, match="GRAPHCACHE_SEND_TIMEOUT"):
            Settings.from_env({"GRAPHCACHE_SEND_TIMEOUT": value})


# -- item 3: uploads stream to a temporary file, verified on the way -----------------------------------


def vm(pid: int, field: str) -> int:
    """A /proc/PID/status size (VmRSS, VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def envelope_parts(art) -> list[bytes]:  # noqa: ANN001 - an Artifact
    """An artifact's envelope as (prefix and header, payload), the payload not copied."""
    from graphcache.artifact import frame

    return [frame(art.header(), b""), art.payload]


def test_16_concurrent_63_mib_uploads_grow_the_servers_memory_by_less_than_128_mib(tmp_path):
    """Each upload was held whole in memory, joined, then decoded: 16 of
    them grew the server's RSS by about 1 GiB. Streamed to a file and hashed
    on the way, each holds about one chunk."""
    from concurrent.futures import ThreadPoolExecutor

    from graphcache.artifact import Artifact
    from tests.fakes import TARGET

    payload = os.urandom(63 * MiB - 4096)
    arts = [Artifact(spec=spec(batch=b), target=TARGET, payload=payload) for b in range(1, 17)]
    env = {
        "GRAPHCACHE_WRITE_TOKENS": WRITE,
        "GRAPHCACHE_DIR": str(tmp_path / "store"),
        "GRAPHCACHE_UPLOAD_BUDGET": str(16 * 64 * MiB),  # all 16 taken in at once
    }
    with serve_one_worker(env) as (url, proc):
        warm = make_artifact(spec(batch=99), size=100_000)
        assert raw_put(port_of(url), warm.key, [warm.encode()], WRITE)[0] == 201
        before = vm(proc.pid, "VmRSS")
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda art: raw_put(port_of(url), art.key, envelope_parts(art), WRITE), arts))
        peak = vm(proc.pid, "VmHWM")
        assert [status for status, _ in answers] == [201] * 16, answers
        assert peak - before < 128 * MiB, f"RSS grew by {(peak - before) / MiB:.0f} MiB"
        got = httpx.get(f"{url}/v1/artifacts/{arts[3].key}", timeout=30)
        assert got.status_code == 200 and got.content[-1000:] == payload[-1000:]


def flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


def left_in(folder: Path) -> list[str]:
    """Upload files left in a DiskStore's incoming folder."""
    return sorted(p.name for p in (folder / "incoming").glob("*")) if (folder / "incoming").exists() else []


def test_refused_and_cut_uploads_leave_no_file_and_nothing_stored(tmp_path):
    """Every way an upload can fail removes its file: corrupt, foreign,
    unsigned, over the limit mid-body, past the deadline, the client gone."""
    env = {
        "GRAPHCACHE_WRITE_TOKENS": WRITE,
        "GRAPHCACHE_DIR": str(tmp_path),
        "GRAPHCACHE_SIGNING_KEY": "k1",
        "GRAPHCACHE_MAX_UPLOAD": str(4 * MiB),
        "GRAPHCACHE_UPLOAD_TIMEOUT": "1",
    }
    art = make_artifact(spec(batch=11), size=3 * MiB).signed(b"k1")
    data = art.encode()
    other = make_artifact(spec(batch=12)).key
    with serve_one_worker(env) as (url, _):
        port = port_of(url)
        refused = {
            "digest_mismatch": (art.key, flip(data, len(data) - 10)),
            "header_digest_mismatch": (art.key, flip(data, 60)),
            "key_mismatch": (other, data),
            "truncated": (art.key, data[: len(data) // 2]),
            "unsigned": (art.key, make_artifact(spec(batch=11), size=3 * MiB).encode()),
            "bad_signature": (art.key, make_artifact(spec(batch=11), size=3 * MiB).signed(b"k2").encode()),
        }
        for reason, (key, body) in refused.items():
            status, answer = raw_put(port, key, [body], WRITE)
            assert (status, answer["error"]) == (400, reason), answer
        # A chunked body that passes GRAPHCACHE_MAX_UPLOAD: 413 as soon as it does.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = f"PUT /v1/artifacts/{art.key} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {WRITE}\r\n"
            sock.sendall(f"{head}transfer-encoding: chunked\r\n\r\n".encode())
            with contextlib.suppress(OSError):
                for _ in range(5):
                    sock.sendall(b"100000\r\n" + bytes(MiB) + b"\r\n")
            assert answer_of(sock).startswith(b"HTTP/1.1 413")
        # Half a body, then nothing: 408 at the deadline. Half a body, then gone.
        for then in ("wait", "leave"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                head = f"PUT /v1/artifacts/{art.key} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {WRITE}\r\n"
                sock.sendall(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data[: 2 * MiB])
                time.sleep(0.5)
                assert left_in(tmp_path), "the body is written to a file as it arrives"
                if then == "wait":
                    assert answer_of(sock).startswith(b"HTTP/1.1 408")
        time.sleep(0.5)
        assert left_in(tmp_path) == []
        assert httpx.head(f"{url}/v1/artifacts/{art.key}", timeout=10).status_code == 404
        assert httpx.head(f"{url}/v1/artifacts/{other}", timeout=10).status_code == 404
        # The good one is stored, and the same bytes again are an identical upload.
        status, answer = raw_put(port, art.key, [data], WRITE)
        assert (status, answer["created"], answer["size"]) == (201, True, len(data)), answer
        status, answer = raw_put(port, art.key, [data], WRITE)
        assert (status, answer["created"]) == (200, False), answer
        assert httpx.get(f"{url}/v1/artifacts/{art.key}", timeout=10).content == data
        assert left_in(tmp_path) == []


def test_upload_files_a_killed_server_left_are_removed_at_start(tmp_path):
    incoming = tmp_path / "incoming"
    incoming.mkdir(parents=True)
    old, fresh = incoming / ".upload-0123456789abcdef", incoming / ".upload-fedcba9876543210"
    for path in (old, fresh):
        path.write_bytes(b"\0" * 1000)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    with serve_one_worker({"GRAPHCACHE_DIR": str(tmp_path)}):
        assert not old.exists() and fresh.exists()  # one being written now is left alone
