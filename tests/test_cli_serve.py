"""The serve verb (graphcache/cli/serve.py), started as the README starts it."""

from __future__ import annotations

import subprocess
import sys

from tests.servers import wait_for_server


def test_readme_serve_command_runs_the_service_on_the_given_folder(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tmp_path / "cache"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "graphcache",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--cache-dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        health = wait_for_server(f"http://127.0.0.1:{port}")
        assert health.json()["store"] == f"DiskStore('{folder}')"
    finally:
        proc.terminate()
        proc.wait(10)
