"""Trust, round five, the service's half: a worker bounds what a server
sends, layout texts are bounded as sizes are, a manifest posted without a
token has a bounded cost, and the smaller findings. Each as it was found:
through `graphcache serve` as the docs start it (127.0.0.1, one worker
unless said), the CLI, or the library; docs/reliability.md lists them."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from graphcache.artifact import Artifact, frame
from tests.fakes import TARGET, make_artifact, spec

MiB = 1024**2


# -- 4: a worker bounds what a server sends ------------------------------------------------------------


class Hostile:
    """A server on 127.0.0.1 that answers every request with what ``answer``
    returns for its request line: the head's extra lines and an iterator of
    body pieces, sent chunked (endless where the iterator is)."""

    def __init__(self, answer) -> None:  # noqa: ANN001 - a function of the request line
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            head = b""
            while b"\r\n\r\n" not in head:
                got = conn.recv(65536)
                if not got:
                    return
                head += got
            line = head.split(b"\r\n", 1)[0].decode()
            extra, pieces = self.answer(line)
            chunked = "content-length" not in extra.lower()
            conn.sendall(
                f"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n{extra}".encode()
                + (b"transfer-encoding: chunked\r\n" if chunked else b"")
                + b"\r\n"
            )
            for piece in pieces:
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)

    def close(self) -> None:
        self.sock.close()


def endless(piece: bytes) -> Iterator[bytes]:
    while True:
        yield piece


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
    import os

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
