"""Caching headers on artifact GETs, and nginx's proxy_cache (docker/nginx.conf)
in front of two `graphcache serve` processes on one Redis, on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from graphcache.settings import Settings
from graphcache.stores import DiskStore, HttpStore
from service.app import create_app
from tests.clirun import cli
from tests.fakes import make_artifact, spec
from tests.servers import NginxServer, ServerThread, free_port, local_nginx_conf, nginx_binary, wait_for_server


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path / "store")


def serve(store, **settings):
    return ServerThread(create_app(Settings(cache_dir=store.path, **settings), store=store))


def test_open_reads_are_public_for_max_age(store):
    art = make_artifact(spec(), size=100_000)
    store.put(art.key, art.encode())
    with serve(store) as srv:
        response = httpx.get(f"{srv.url}/v1/artifacts/{art.key}")
        assert response.headers["cache-control"] == "public, max-age=86400"
        head = httpx.head(f"{srv.url}/v1/artifacts/{art.key}")
        assert head.headers["cache-control"] == "public, max-age=86400"
        again = httpx.get(f"{srv.url}/v1/artifacts/{art.key}", headers={"if-none-match": response.headers["etag"]})
        assert again.status_code == 304 and again.headers["etag"] == response.headers["etag"]
        assert again.headers["cache-control"] == "public, max-age=86400"
    with serve(store, http_max_age=60) as srv:
        assert httpx.get(f"{srv.url}/v1/artifacts/{art.key}").headers["cache-control"] == "public, max-age=60"


def test_read_tokens_make_artifacts_private(store):
    art = make_artifact(spec())
    store.put(art.key, art.encode())
    with serve(store, read_tokens=("r",)) as srv:
        response = httpx.get(f"{srv.url}/v1/artifacts/{art.key}", headers={"authorization": "Bearer r"})
        assert response.status_code == 200 and response.headers["cache-control"] == "private"


def test_http_max_age_from_the_environment():
    assert Settings.from_env({"GRAPHCACHE_HTTP_MAX_AGE": "600"}).http_max_age == 600
    assert Settings.from_env({}).http_max_age == 86400
    with pytest.raises(ValueError, match="GRAPHCACHE_HTTP_MAX_AGE='soon' must be a whole number of seconds"):
        Settings.from_env({"GRAPHCACHE_HTTP_MAX_AGE": "soon"})
    with pytest.raises(ValueError, match="GRAPHCACHE_MAX_BATCH='-1' must be > 0"):
        Settings.from_env({"GRAPHCACHE_MAX_BATCH": "-1"})


def test_ls_shows_build_seconds(store):
    art = make_artifact(spec())  # built in 0.5 s
    store.put(art.key, art.encode())
    result = cli("ls", "--cache-dir", str(store.path))
    assert result.returncode == 0, result.stderr
    assert "build s" in result.stdout
    row = next(line for line in result.stdout.splitlines() if art.key[:12] in line)
    assert "0.50" in row


def _serve_processes(ports: list[int], env: dict[str, str]) -> list[subprocess.Popen]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "graphcache", "serve", "--port", str(p), "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]
    for port in ports:
        wait_for_server(f"http://127.0.0.1:{port}", healthy=True)
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(10)


@pytest.mark.skipif(nginx_binary() is None, reason="needs nginx (Debian package nginx; scripts/test.sh installs it)")
def test_nginx_in_front_serves_repeats_without_reaching_python(redis_store, redis_url, tmp_path):
    ports = [free_port(), free_port()]
    env = {**os.environ, "GRAPHCACHE_STORE": redis_url, "GRAPHCACHE_WRITE_TOKENS": "w", "GRAPHCACHE_ADMIN_TOKENS": "a"}
    procs = _serve_processes(ports, env)
    conf = tmp_path / "nginx.conf"
    lb_port = free_port()
    conf.write_text(local_nginx_conf([f"127.0.0.1:{p}" for p in ports], lb_port, tmp_path))
    try:
        with NginxServer(conf, lb_port) as lb:
            art = make_artifact(spec(), size=300_000)
            assert HttpStore(lb.url, token="w").put(art.key, art.encode())  # PUT passes through
            url = f"{lb.url}/v1/artifacts/{art.key}"
            first = httpx.get(url)
            assert first.status_code == 200 and first.headers["x-cache-status"] == "MISS"
            second = httpx.get(url)
            assert second.headers["x-cache-status"] == "HIT" and second.content == art.encode()
            assert HttpStore(lb.url).get(art.key) == art.encode()  # clients verify what the cache serves
            # a hit larger than the front's two 512 KiB output buffers comes whole and intact
            big = make_artifact(spec(seq_q=512), size=3 * 1024 * 1024 + 7)
            assert HttpStore(lb.url, token="w").put(big.key, big.encode())
            big_url = f"{lb.url}/v1/artifacts/{big.key}"
            assert httpx.get(big_url).headers["x-cache-status"] == "MISS"
            hit = httpx.get(big_url)
            assert hit.headers["x-cache-status"] == "HIT" and hit.content == big.encode()
            # DELETE passes through; the cache may serve the entry until max-age (README)
            assert httpx.delete(url, headers={"authorization": "Bearer a"}).status_code == 204
            assert httpx.get(url).headers["x-cache-status"] == "HIT"
            # listings and absent keys are never cached
            absent = f"{lb.url}/v1/artifacts/{make_artifact(spec(seq_q=256)).key}"
            assert httpx.get(absent).status_code == 404 and httpx.get(absent).headers["x-cache-status"] == "MISS"
            _stop(procs)
            procs = []
            cached = httpx.get(url)  # no replica left: nginx alone answers
            assert cached.status_code == 200 and cached.content == art.encode()
    finally:
        _stop(procs)


@pytest.mark.skipif(nginx_binary() is None, reason="needs nginx (Debian package nginx; scripts/test.sh installs it)")
def test_nginx_never_caches_when_read_tokens_are_set(redis_store, redis_url, tmp_path):
    ports = [free_port(), free_port()]
    env = {**os.environ, "GRAPHCACHE_STORE": redis_url, "GRAPHCACHE_WRITE_TOKENS": "w", "GRAPHCACHE_READ_TOKENS": "r"}
    procs = _serve_processes(ports, env)
    conf = tmp_path / "nginx.conf"
    lb_port = free_port()
    conf.write_text(local_nginx_conf([f"127.0.0.1:{p}" for p in ports], lb_port, tmp_path))
    try:
        with NginxServer(conf, lb_port) as lb:
            art = make_artifact(spec())
            assert HttpStore(lb.url, token="w").put(art.key, art.encode())
            url = f"{lb.url}/v1/artifacts/{art.key}"
            for _ in range(3):
                assert httpx.get(url, headers={"authorization": "Bearer r"}).headers["x-cache-status"] == "MISS"
            assert httpx.get(url).status_code == 401  # a reader without the token is still refused
    finally:
        _stop(procs)
