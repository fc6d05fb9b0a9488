"""Real servers on 127.0.0.1 for tests: the app under uvicorn in a thread,
configured by the same factory as `graphcache serve` (service.server)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from service.server import config as server_config


class ServerThread:
    """Runs an ASGI app under uvicorn on an ephemeral 127.0.0.1 port."""

    def __init__(self, app: Any, **options: Any) -> None:
        """``options``: more of service.server's options (limit_concurrency, ...)."""
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # The shipped configuration (service.server, as `graphcache serve` runs
        # it: uvloop, httptools, its limits); only the log level and the
        # shutdown grace differ, so that a test's server stops at once.
        config = server_config(
            app, host="127.0.0.1", port=self.port, **{"log_level": "warning", "shutdown_grace": 1, **options}
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer:
    """A private redis-server on 127.0.0.1 for one test or session."""

    def __init__(self, *args: str) -> None:
        import shutil

        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *args]
        self.proc: Any = None

    def start(self) -> RedisServer:
        import subprocess

        import redis

        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()  # not left running when the caller's `with` never began
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def static_nginx_conf(port: int, tmp: Any) -> str:
    """The benchmarks' baseline: nginx (one worker, sendfile, tcp_nopush)
    serving ``tmp``/static on 127.0.0.1:``port``, in the foreground."""
    import os

    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""
worker_processes 1;
{user}daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  default_type application/octet-stream;
  server {{ listen 127.0.0.1:{port}; root {tmp}/static; }}
}}
"""


def nginx_binary() -> str | None:
    import os
    import shutil

    found = shutil.which("nginx")
    return found or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def chromium() -> str:
    """The headless browser the rendering tests use, or a skip saying why."""
    import shutil

    import pytest

    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium on this machine (scripts/test.sh installs Debian's chromium; it could not here)")


def local_nginx_conf(replicas: list[str], port: int, tmp: Any) -> str:
    """docker/nginx.conf as shipped, pointed at local replicas ("127.0.0.1:PORT")
    and run from ``tmp`` (pid, logs, cache, temp files), in the foreground."""
    import os
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docker" / "nginx.conf").read_text()
    for name, where in zip(("replica-a:8080", "replica-b:8080"), replicas, strict=True):
        text = text.replace(f"server {name}", f"server {where}")
    text = text.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    text = text.replace("/var/cache/nginx/graphcache", f"{tmp}/cache")
    head = f"daemon off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/nginx-error.log;\n"
    if os.geteuid() == 0:
        head += "user root;\n"  # workers write the cache folder under tmp
    temps = "".join(
        f"  {kind}_temp_path {tmp}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    text = text.replace("worker_processes auto;", "worker_processes 1;\n" + head, 1)
    return text.replace("http {\n", "http {\n" + temps, 1)


class NginxServer:
    """nginx in the foreground with a given config file, on 127.0.0.1."""

    def __init__(self, conf_path: Any, port: int) -> None:
        self.conf_path = conf_path
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: Any = None

    def start(self) -> NginxServer:
        import subprocess
        from pathlib import Path

        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed")
        prefix = str(Path(self.conf_path).parent)
        self.proc = subprocess.Popen(
            [binary, "-c", str(self.conf_path), "-p", prefix], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
                    raise RuntimeError(f"nginx did not start: {err}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def __enter__(self) -> NginxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for_server(url: str, proc: Any = None, timeout: float = 30.0, *, healthy: bool = False) -> Any:
    """Poll ``url``/healthz until the server answers (200 with ``healthy``);
    returns that response. Fails the test when ``proc`` exits first or
    ``timeout`` seconds pass."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if getattr(proc, "stderr", None) else ""
            raise AssertionError(f"the server exited with {proc.returncode}: {err}")
        try:
            response = httpx.get(f"{url}/healthz", timeout=1)
            if not healthy or response.status_code == 200:
                return response
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"no server answered at {url} within {timeout:.0f}s"
        time.sleep(0.2)


# -- processes, for the benchmarks in scripts/ ----------------------------------------


def serve_process(port: int, env: dict[str, str], extra: list[str] | tuple[str, ...] = ()) -> Any:
    """`graphcache serve` as a user starts it (defaults, plus ``extra``) on
    127.0.0.1:``port``, its log quiet; a subprocess.Popen."""
    import subprocess
    import sys
    from pathlib import Path

    cmd = [sys.executable, "-m", "graphcache.cli", "serve", "--port", str(port), "--log-level", "warning", *extra]
    return subprocess.Popen(cmd, env=env, cwd=Path(__file__).resolve().parents[1], stderr=subprocess.DEVNULL)


def stop_processes(procs: list[Any]) -> None:
    """SIGTERM each, then wait (kill after 15 s)."""
    import signal
    import subprocess

    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def wait_http(url: str, timeout: float = 30) -> None:
    """Poll ``url`` until anything answers it over HTTP."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # an answer, if not a 200
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def slow_sender(port: int, stop: Any, path: str = "/v1/resolve") -> str:
    """A POST whose 200-byte body comes a byte a second, until ``stop`` (an
    asyncio.Event) is set: the status the server answered before closing
    the connection ("408"), "still open", or the error that ended it."""
    import asyncio
    import contextlib

    answer = b""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n".encode())
        writer.write(b"content-length: 200\r\n\r\n")
        try:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    writer.write(b" ")
                    await writer.drain()
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    continue
                if not chunk:
                    return answer.split(b" ", 2)[1].decode() if answer else "closed"
                answer += chunk
            return "still open"
        finally:
            writer.close()
    except OSError as exc:  # a reset after the answer: the server closed with the body unread
        return answer.split(b" ", 2)[1].decode() if answer else type(exc).__name__


async def raw_gets(port: int, paths: list[str]) -> list[tuple[int, bytes, float]]:
    """GET each of ``paths`` in turn on one kept-alive connection: (status,
    body, seconds) each. Asyncio streams: httpx's connection pool costs more
    CPU than the server at 200 connections (4,000 GETs took 67 s through it,
    3.4 s so)."""
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for path in paths:
            start = time.perf_counter()
            writer.write(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
            data = await reader.readexactly(int(fields["content-length"]))
            out.append((int(lines[0].split()[1]), data, time.perf_counter() - start))
    finally:
        writer.close()
    return out


def serve_one_worker(env: dict[str, str], *args: str, tree: Any = None) -> Any:
    """A context manager: `python -m graphcache serve --workers 1` on a free
    127.0.0.1 port with ``env`` added to the environment and ``args`` after
    the command (``tree``: serve that checkout's code, a baseline worktree);
    yields its URL and process, stopped at the end."""
    return serve_workers(env, *args, workers=1, tree=tree)


def serve_workers(env: dict[str, str], *args: str, workers: int, tree: Any = None) -> Any:
    """``serve_one_worker`` with ``--workers N``: one server of N worker
    processes sharing the port, as `graphcache serve --workers N` runs it."""
    import contextlib
    import os
    import subprocess
    import sys
    from pathlib import Path

    @contextlib.contextmanager
    def running() -> Any:
        root = Path(tree) if tree is not None else Path(__file__).resolve().parents[1]
        port = free_port()
        cmd = [sys.executable, "-m", "graphcache", "serve", "--port", str(port), "--workers", str(workers)]
        cmd += ["--log-level", "critical", *args]
        env_all = {**os.environ, **({"PYTHONPATH": str(root)} if tree is not None else {}), **env}
        proc = subprocess.Popen(cmd, env=env_all, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for_server(url, proc)
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:  # a server busy past its grace (a baseline tree's probe)
                proc.kill()
                proc.wait(15)

    return running()


def raw_put(port: int, key: str, parts: list[bytes], token: str | None = None) -> tuple[int, dict[str, Any]]:
    """PUT /v1/artifacts/``key`` with the concatenation of ``parts`` as the
    body (sent piece by piece, never joined: a 63 MiB payload is not copied);
    the status and the JSON answer."""
    import json

    size = sum(len(p) for p in parts)
    head = f"PUT /v1/artifacts/{key} HTTP/1.1\r\nhost: t\r\n"
    if token is not None:
        head += f"authorization: Bearer {token}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(f"{head}content-length: {size}\r\nconnection: close\r\n\r\n".encode())
        for part in parts:
            sock.sendall(part)
        sock.settimeout(120)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), json.loads(answer.partition(b"\r\n\r\n")[2])


def non_reader(port: int, request: bytes) -> socket.socket:
    """A client with a 4 KiB receive buffer that sends ``request`` and never
    reads the answer (the caller closes it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    return sock


def batch_request(keys: list[str]) -> bytes:
    """A whole POST /v1/batch request for ``keys``, as bytes."""
    import json

    data = json.dumps({"keys": keys}).encode()
    head = f"POST /v1/batch HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
    return head.encode() + b"\r\n" + data


def drained(sock: socket.socket, timeout: float = 10) -> tuple[int, bool]:
    """Read what the server sends until it closes the connection: (bytes
    read, whether it closed within ``timeout`` seconds of silence)."""
    sock.settimeout(timeout)
    size = 0
    try:
        while chunk := sock.recv(1 << 20):
            size += len(chunk)
    except (TimeoutError, ConnectionResetError) as exc:
        return size, isinstance(exc, ConnectionResetError)
    return size, True


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


def endless(piece: bytes, first: bytes = b"") -> Iterator[bytes]:
    """``first``, then ``piece`` without end: an endless body for ``Hostile``."""
    if first:
        yield first
    while True:
        yield piece
