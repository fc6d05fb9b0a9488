"""POST /v1/batch, HttpStore/TieredStore.get_many and GraphCache.prefetch,
against a real server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx
import pytest

from graphcache import Artifact, CorruptArtifact, GraphCache, StoreUnavailable
from graphcache.batch import ABSENT, ENVELOPE, MAGIC, MEDIA_TYPE, BatchParser, end_record, record
from graphcache.settings import Settings
from graphcache.stores import DiskStore, HttpStore, TieredStore
from service.app import create_app
from tests.clirun import cli
from tests.fakes import TARGET, make_artifact, spec
from tests.servers import ServerThread

READ = "r-token"


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path / "server")


def serve(store, **settings):
    return ServerThread(create_app(Settings(cache_dir=store.path, **settings), store=store))


@pytest.fixture
def server(store):
    with serve(store) as srv:
        yield srv


def stored(store, count, size=20_000, **changes):
    arts = [make_artifact(spec(seq_q=128 * (i + 1), **changes), size=size) for i in range(count)]
    for art in arts:
        store.put(art.key, art.encode())
    return arts


def records(body: bytes) -> tuple[list, dict]:
    parser = BatchParser()
    got = list(parser.feed(body))
    assert parser.complete
    return got, parser.summary


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_batch_streams_each_envelope_once_and_names_the_absent(server, store):
    arts = stored(store, 3)
    absent = make_artifact(spec(seq_q=9999)).key
    keys = [arts[0].key, absent, arts[1].key, arts[0].key, arts[2].key]
    response = httpx.post(server.url + "/v1/batch", json={"keys": keys})
    assert response.status_code == 200
    assert response.headers["content-type"] == MEDIA_TYPE
    assert response.content.startswith(MAGIC)
    got, summary = records(response.content)
    assert [(r.kind, r.key) for r in got] == [
        (ENVELOPE, arts[0].key),
        (ABSENT, absent),
        (ENVELOPE, arts[1].key),
        (ENVELOPE, arts[2].key),
    ]
    assert got[0].body == arts[0].encode() and got[2].body == arts[1].encode()
    assert got[1].body == b"absent"
    assert summary == {"found": 3, "absent": 1}
    # the same counters as single GETs, and the build seconds they saved (0.5 s each)
    assert metric(server.url, "graphcache_hits_total") == 3
    assert metric(server.url, "graphcache_misses_total") == 1
    assert metric(server.url, "graphcache_served_build_seconds_total") == 1.5
    assert metric(server.url, "graphcache_served_artifact_bytes_count") == 3
    assert httpx.get(server.url + "/v1/stats").json()["served_build_seconds"] == 1.5


def test_batch_bad_input_is_refused_naming_the_problem(store):
    arts = stored(store, 1)
    with serve(store, max_batch=3) as srv:
        post = lambda body: httpx.post(srv.url + "/v1/batch", json=body)  # noqa: E731
        empty = post({"keys": []})
        assert empty.status_code == 400 and empty.json()["error"] == "empty_batch"
        over = post({"keys": [arts[0].key] * 4})
        assert over.status_code == 413 and "GRAPHCACHE_MAX_BATCH" in over.json()["detail"]
        bad = post({"keys": [arts[0].key, "../etc/passwd", "ABC"]})
        assert bad.status_code == 400 and bad.json()["error"] == "invalid_key"
        assert "'../etc/passwd'" in bad.json()["detail"] and "'ABC'" in bad.json()["detail"]
        assert arts[0].key not in bad.json()["detail"]
        shape = post({"key": [arts[0].key]})
        assert shape.status_code == 422 and "keys" in shape.json()["detail"]
        assert post({"keys": [arts[0].key] * 3}).status_code == 200


def test_batch_needs_a_read_token_when_reads_are_closed(store):
    arts = stored(store, 1)
    with serve(store, read_tokens=(READ,)) as srv:
        assert httpx.post(srv.url + "/v1/batch", json={"keys": [arts[0].key]}).status_code == 401
        assert HttpStore(srv.url, token=READ).get_many([arts[0].key]) == {arts[0].key: arts[0].encode()}


def test_a_corrupt_entry_is_reported_quarantined_and_the_others_served(server, store):
    good, bad = stored(store, 2, size=50_000)
    data = bytearray(bad.encode())
    data[-10] ^= 0xFF
    store.put(bad.key, bytes(data))
    got, summary = records(httpx.post(server.url + "/v1/batch", json={"keys": [bad.key, good.key]}).content)
    assert [(r.kind, r.key) for r in got] == [(ABSENT, bad.key), (ENVELOPE, good.key)]
    assert got[0].body.startswith(b"quarantined")
    with pytest.raises(CorruptArtifact) as why:
        Artifact.decode(bytes(data), expected_key=bad.key)
    assert got[0].body == f"quarantined: {why.value.reason}".encode()  # graphcache/batch.py's layout
    assert got[1].body == good.encode()
    assert summary == {"found": 1, "absent": 1}
    assert store.get(bad.key) is None
    assert [p.name.split(".")[0] for p in (store.path / "quarantine").iterdir()] == [bad.key]


def test_large_entries_stream_from_their_files(server, store):
    arts = stored(store, 3, size=3 * 1024 * 1024)
    client = HttpStore(server.url)
    for _ in range(2):  # the second time, verified files are streamed from the open handle
        assert client.get_many([a.key for a in arts]) == {a.key: a.encode() for a in arts}


def test_a_batch_past_the_held_budget_streams_the_rest(server, store):
    arts = stored(store, 40, size=900 * 1024)  # 35 MiB of entries below the streaming size: past HELD_MAX
    keys = [a.key for a in arts]
    response = httpx.post(server.url + "/v1/batch", json={"keys": keys}, timeout=60)
    assert response.headers.get("transfer-encoding") == "chunked" and "content-length" not in response.headers
    got, summary = records(response.content)
    assert [(r.kind, r.key, r.body) for r in got] == [(ENVELOPE, a.key, a.encode()) for a in arts]
    assert summary == {"found": 40, "absent": 0}
    assert metric(server.url, "graphcache_hits_total") == 40
    small = httpx.post(server.url + "/v1/batch", json={"keys": keys[:3]})
    assert small.headers["content-length"] == str(len(small.content))  # resolved first: the length is known
    assert records(small.content)[1] == {"found": 3, "absent": 0}


def _store_fds(path) -> int:
    """Open file descriptors of this process (the server runs in a thread of it) into ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(path)):
                count += 1
        except OSError:
            pass
    return count


def test_a_client_that_disconnects_mid_stream_leaks_no_file_handles(server, store):
    arts = stored(store, 8, size=2 * 1024 * 1024)
    keys = [a.key for a in arts]
    HttpStore(server.url).get_many(keys)  # verified: the next batch streams from open files
    before = _store_fds(store.path)
    body = json.dumps({"keys": keys}).encode()
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                b"POST /v1/batch HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            deadline = time.monotonic() + 5
            while _store_fds(store.path) == before and time.monotonic() < deadline:
                time.sleep(0.01)
            # the server is blocked mid-entry on a full socket, with that entry's file open
            assert _store_fds(store.path) > before
    # The server may still be winding down the last answer (a handle opened
    # for the next entry, closed when it notices the client left): wait for
    # the count to settle at its old value, not for one lucky sample.
    deadline = time.monotonic() + 10
    settled = 0
    while settled < 10 and time.monotonic() < deadline:
        settled = settled + 1 if _store_fds(store.path) == before else 0
        time.sleep(0.05)
    assert _store_fds(store.path) == before and settled >= 10
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert HttpStore(server.url).get_many(keys) == {a.key: a.encode() for a in arts}


def _fake_batch_server(body: bytes) -> ServerThread:
    """A misbehaving server (or proxy) answering every batch with ``body``."""

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", MEDIA_TYPE.encode())]})
        await send({"type": "http.response.body", "body": body})

    return ServerThread(app)


def test_get_many_drops_and_counts_corrupt_envelopes():
    good, bad = make_artifact(spec(seq_q=128)), make_artifact(spec(seq_q=256))
    flipped = bytearray(bad.encode())
    flipped[-1] ^= 1
    body = MAGIC + record(ENVELOPE, good.key, good.encode()) + record(ENVELOPE, bad.key, bytes(flipped))
    with _fake_batch_server(body + end_record(2, 0)) as srv:
        client = HttpStore(srv.url)
        assert client.get_many([good.key, bad.key]) == {good.key: good.encode()}
        assert client.corrupt == 1


def test_get_many_a_stream_cut_short_is_unavailable_not_absent():
    good, other = make_artifact(spec(seq_q=128)), make_artifact(spec(seq_q=256))
    with _fake_batch_server(MAGIC + record(ENVELOPE, good.key, good.encode())) as srv:
        with pytest.raises(StoreUnavailable, match="cut the batch answer short after 1 of 2"):
            HttpStore(srv.url).get_many([good.key, other.key])


def test_get_many_refuses_a_key_it_did_not_ask_for():
    good, other = make_artifact(spec(seq_q=128)), make_artifact(spec(seq_q=256))
    body = MAGIC + record(ENVELOPE, other.key, other.encode()) + end_record(1, 0)
    with _fake_batch_server(body) as srv:
        with pytest.raises(StoreUnavailable, match="not asked for"):
            HttpStore(srv.url).get_many([good.key])


def test_get_many_splits_to_the_servers_batch_limit(store):
    arts = stored(store, 5)
    with serve(store, max_batch=2) as srv:
        assert HttpStore(srv.url).get_many([a.key for a in arts]) == {a.key: a.encode() for a in arts}


def test_tiered_get_many_reads_local_first_then_one_request_and_writes_back(server, store, tmp_path):
    arts = stored(store, 6)
    local = DiskStore(tmp_path / "local")
    local.put(arts[0].key, arts[0].encode())
    tiered = TieredStore(local, HttpStore(server.url))
    absent = make_artifact(spec(seq_q=9999)).key
    got = tiered.get_many([a.key for a in arts] + [absent])
    assert got == {a.key: a.encode() for a in arts}
    assert metric(server.url, 'graphcache_requests_total{method="POST",route="/v1/batch",status="200"}') == 1
    assert metric(server.url, "graphcache_hits_total") == 5  # arts[0] came from the local tier
    assert sorted(local.keys()) == sorted(a.key for a in arts)


def test_tiered_get_many_answers_from_local_when_the_server_is_down(tmp_path):
    art = make_artifact(spec())
    local = DiskStore(tmp_path / "local")
    local.put(art.key, art.encode())
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    tiered = TieredStore(local, HttpStore(dead, timeout=1))
    assert tiered.get_many([art.key, make_artifact(spec(seq_q=256)).key]) == {art.key: art.encode()}
    assert tiered.remote_errors == 1


def test_prefetch_fills_the_local_tier_and_reports(server, store, tmp_path):
    arts = stored(store, 4)
    specs = [a.spec for a in arts] + [spec(seq_q=9999)]
    local = DiskStore(tmp_path / "local")
    cache = GraphCache(TieredStore(local, HttpStore(server.url)))
    seen: list[str] = []
    report = cache.prefetch(specs, TARGET, progress=seen.append)
    assert report.present == 4 and report.missing == (spec(seq_q=9999),)
    assert report.bytes == sum(len(a.encode()) for a in arts) and report.seconds > 0
    assert sorted(seen) == sorted([a.key for a in arts] + [cache.key(spec(seq_q=9999), TARGET)])
    assert sorted(local.keys()) == sorted(a.key for a in arts)
    # the loads that follow never ask the server, and count what they saved
    offline = GraphCache(local)
    for art in arts:
        assert offline.lookup(art.spec, TARGET) is not None
        offline.get(art.spec, TARGET)
    assert offline.stats()["hits"] == 4 and offline.stats()["build_seconds_saved"] == 2.0


def test_prefetch_counts_a_corrupt_local_entry_missing(tmp_path):
    art = make_artifact(spec())
    local = DiskStore(tmp_path / "local")
    data = bytearray(art.encode())
    data[-1] ^= 1
    local.put(art.key, bytes(data))
    cache = GraphCache(local)
    report = cache.prefetch([art.spec], TARGET)
    assert report.present == 0 and report.corrupt == 1 and report.missing == (art.spec,)
    assert local.get(art.key) is None


def test_cli_prefetch_fills_the_cache_dir_and_prints_a_table(server, store, tmp_path):
    arts = stored(store, 3)
    manifest = tmp_path / "model.yaml"
    manifest.write_text(
        "graphs:\n  - name: m\n    batch: 1\n    heads_q: 8\n    head_dim: 64\n    mask: causal\n"
        "    seq_q: [128, 256, 384, 512]\n"
    )
    local = tmp_path / "worker"
    result = cli("prefetch", str(manifest), "--target", str(TARGET), "--server", server.url, "--cache-dir", str(local))
    assert result.returncode == 0, result.stderr
    assert "present" in result.stdout and "missing" in result.stdout
    row = next(line for line in result.stdout.splitlines() if str(TARGET) in line and "│" in line)
    assert [c.strip() for c in row.split("│")][2:4] == ["3", "1"]
    assert sorted(DiskStore(local).keys()) == sorted(a.key for a in arts)
    strict = cli(
        "prefetch",
        str(manifest),
        "--target",
        str(TARGET),
        "--server",
        server.url,
        "--cache-dir",
        str(local),
        "--strict",
    )
    assert strict.returncode == 1 and "1 spec(s) missing" in strict.stderr
    nowhere = cli(
        "prefetch", str(manifest), "--target", str(TARGET), "--cache-dir", str(local), env={"GRAPHCACHE_SERVER": ""}
    )
    assert nowhere.returncode != 0 and "--server" in nowhere.stderr


def test_cli_prefetch_from_a_server_that_fails_is_one_error_line(server, store, tmp_path):
    """Down, refused or of a scheme no server speaks: one plain line and exit 1,
    not a warning and a table of every spec "missing"."""
    stored(store, 1)
    manifest = tmp_path / "model.yaml"
    manifest.write_text("graphs:\n  - {name: m, batch: 1, heads_q: 8, head_dim: 64, mask: causal, seq_q: 128}\n")
    base = ["prefetch", str(manifest), "--target", str(TARGET), "--cache-dir", str(tmp_path / "w")]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: refused
        cases = {
            "down": cli(*base, "--server", down),
            "scheme": cli(*base, "--server", "ftp://x"),
        }
    for name, out in cases.items():
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), (name, out.stderr)
        assert "[" not in lines[0].split(":")[0] and "Traceback" not in out.stderr
    assert "did not answer" in cases["down"].stderr
    assert "http:// or https://" in cases["scheme"].stderr
    assert not (tmp_path / "ftp:").exists()


def test_cli_prefetch_refused_says_what_the_server_said(tmp_path):
    store = DiskStore(tmp_path / "srv")
    stored(store, 1)
    manifest = tmp_path / "model.yaml"
    manifest.write_text("graphs:\n  - {name: m, batch: 1, heads_q: 8, head_dim: 64, mask: causal, seq_q: 128}\n")
    with ServerThread(create_app(Settings(read_tokens=("r",)), store=store)) as srv:
        out = cli(
            "prefetch", str(manifest), "--target", str(TARGET), "--server", srv.url,
            "--cache-dir", str(tmp_path / "w"), env={"GRAPHCACHE_TOKEN": "wrong"},
        )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and "403" in lines[0] and "read token" in lines[0], out.stderr


def _raw(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict, bytes]:
    """One request over a fresh socket, as bytes; the answer's status, headers and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        top, _, rest = data.partition(b"\r\n\r\n")
        lines = top.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            rest += sock.recv(65536)
        return int(lines[0].split()[1]), headers, rest


ODD_BATCHES = [
    ("text/plain", b'{"keys": ["%s"]}'),
    (None, b'{"keys": ["%s"]}'),
    ("application/json; charset=utf-8", b'{"keys": ["%s"]}'),
    ("application/json", b'{"keys": ["%s"], "keys": ["%s"]}'),
    ("application/json", b'  {"keys" : [ "%s" , "%s" ] }  '),
    ("application/json", b'{"keys": ["%s"], "more": 1}'),
    ("application/json", b'{"keys": "%s"}'),
    ("application/json", b'{"keys": [null, "%s"]}'),
    ("application/json", b'["%s"]'),
    ("application/json", b'{"keys": ["%s"'),
    ("application/json", b"\xff\xfe"),
    ("application/json", b'{"keys": ["%s"]} trailing'),
]


@pytest.mark.parametrize(("ctype", "template"), ODD_BATCHES)
def test_the_batch_fast_path_answers_every_request_as_the_route_does(store, ctype, template):
    """POST /v1/batch is answered in front of FastAPI (service.routes.batch.BatchFastPath)
    for well-formed requests and handed to the FastAPI route otherwise: either
    way the answer is the route's own, byte for byte."""
    arts = stored(store, 2)
    body = template.replace(b"%s", arts[0].key.encode(), 1).replace(b"%s", arts[1].key.encode())
    head = b"POST /v1/batch HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
    if ctype is not None:
        head += f"content-type: {ctype}\r\n".encode()
    head += f"content-length: {len(body)}\r\n\r\n".encode()
    answers = []
    for fast in (True, False):
        app = create_app(Settings(cache_dir=store.path), store=store)
        if not fast:
            app.batch_path = None
        with ServerThread(app) as srv:
            answers.append(_raw(srv.port, head, body))
    (status, headers, got), (route_status, route_headers, route_got) = answers
    assert (status, got) == (route_status, route_got)
    assert headers.get("content-type") == route_headers.get("content-type")


@pytest.mark.parametrize("framing", ["content-length", "chunked", "text/plain"])
def test_a_batch_request_body_that_stalls_is_cut_off_with_408(store, framing):
    """Whatever the request looks like (one the fast path answers, a chunked
    body, another content type the route would judge), its body is read
    within GRAPHCACHE_UPLOAD_TIMEOUT."""
    arts = stored(store, 1)
    body = json.dumps({"keys": [arts[0].key]}).encode()
    ctype = "text/plain" if framing == "text/plain" else "application/json"
    head = f"POST /v1/batch HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: {ctype}\r\n"
    if framing == "chunked":
        head += "transfer-encoding: chunked\r\n\r\n"
        start = f"{20:x}\r\n".encode() + body[:20] + b"\r\n"
    else:
        head += f"content-length: {len(body)}\r\n\r\n"
        start = body[:20]
    with serve(store, upload_timeout=0.5) as srv:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(head.encode() + start)
            began = time.monotonic()
            answer = sock.recv(65536)
            waited = time.monotonic() - began
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"GRAPHCACHE_UPLOAD_TIMEOUT" in answer
        assert 0.4 < waited < 5
        assert httpx.post(srv.url + "/v1/batch", json={"keys": [arts[0].key]}).status_code == 200


def test_a_batch_request_body_past_its_bound_is_refused_413_unread(store):
    with serve(store, max_batch=4) as srv:
        url = srv.url + "/v1/batch"
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 9000000\r\n\r\n"
            )
            answer = sock.recv(65536)  # answered before any of the body was sent
        assert answer.startswith(b"HTTP/1.1 413") and b"split the batch" in answer

        def stream():
            yield b'{"keys": ['
            for _ in range(1000):
                yield b'"' + b"0" * 64 + b'", '

        chunked = httpx.post(url, content=stream(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413 and chunked.json()["error"] == "too_large"
        assert httpx.get(srv.url + "/healthz").status_code == 200


def test_batches_are_counted_as_requests(server, store):
    arts = stored(store, 2)
    for _ in range(3):
        assert httpx.post(server.url + "/v1/batch", json={"keys": [a.key for a in arts]}).status_code == 200
    assert httpx.post(server.url + "/v1/batch", json={"keys": []}).status_code == 400
    text = httpx.get(server.url + "/metrics").text
    assert 'graphcache_requests_total{method="POST",route="/v1/batch",status="200"} 3.0' in text
    assert 'graphcache_requests_total{method="POST",route="/v1/batch",status="400"} 1.0' in text
    assert metric(server.url, "graphcache_batches_total") == 3


def test_the_shipped_server_writes_a_batch_without_joining_it_and_sends_the_same_bytes(store, monkeypatch):
    """`graphcache serve`'s protocol (service.transport) hands the held
    entries to the socket as they are; under another server (uvicorn's h11
    protocol here) they are joined into writes. The answer is the same."""
    import service.routes.batch as batch_route

    arts = stored(store, 5, size=70_000)
    absent = make_artifact(spec(seq_q=9999)).key
    keys = [a.key for a in arts[:3]] + [absent] + [a.key for a in arts[3:]]
    joins = []
    real = batch_route._in_writes
    monkeypatch.setattr(batch_route, "_in_writes", lambda pieces: joins.append(1) or real(pieces))
    answers = {}
    for http in ("shipped", "h11"):
        srv = serve(store)
        if http == "h11":
            srv.server.config.http = "h11"
        with srv:
            for _ in range(2):  # the first verifies, the second serves from memory
                response = httpx.post(srv.url + "/v1/batch", json={"keys": keys})
                assert response.headers["content-length"] == str(len(response.content))
            answers[http] = (response.content, len(joins))
    assert answers["shipped"][0] == answers["h11"][0]
    got, summary = records(answers["shipped"][0])
    assert [r.body for r in got if r.kind == ENVELOPE] == [a.encode() for a in arts]
    assert summary == {"found": 5, "absent": 1}
    assert answers["shipped"][1] == 0, "the shipped server joined the entries"
    assert answers["h11"][1] == 2


def test_the_entry_at_the_held_budgets_edge_is_fetched_and_verified_once(redis_store, monkeypatch):
    """On a store of bytes (Redis: every read fetches and hashes), the entry
    that tips a batch past HELD_MAX is streamed as resolved, not fetched and
    verified a second time."""
    from service.reader import ArtifactReader

    arts = stored(redis_store, 6, size=2 * 1024 * 1024)  # 12 MiB: past the 8 MiB held budget
    verified = []
    real = ArtifactReader.verify
    monkeypatch.setattr(
        ArtifactReader, "verify", lambda self, key, entry: verified.append(key) or real(self, key, entry)
    )
    app = create_app(Settings(hot_cache_bytes=0), store=redis_store)
    with ServerThread(app) as srv:
        got, summary = records(httpx.post(srv.url + "/v1/batch", json={"keys": [a.key for a in arts]}).content)
    assert [(r.key, r.body) for r in got] == [(a.key, a.encode()) for a in arts]
    assert sorted(verified) == sorted(a.key for a in arts)  # each once
