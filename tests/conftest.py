from __future__ import annotations

import os
import shutil

import pytest

# One OpenMP thread for torch, here and in every subprocess the tests start (set
# before anything imports torch; a value already set wins). The tests' tensors
# are small: a second intra-op thread buys nothing on them and, on 2 cores that
# the suite's own servers and CLI processes share, its spin-waiting costs CPU.
# Measured on this 2-core machine: tests/test_classes_cudnn.py with
# test_backward.py 21-22 s of CPU against 27-56 s with torch's default; the
# two Llama class tests with test_varlen_dropin.py 18 s against 26-43 s.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _gpu_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs a CUDA GPU: torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: none is visible to torch on this machine"
    try:
        import cudnn  # noqa: F401
    except ImportError:
        return "needs nvidia-cudnn-frontend, which is not installed"
    return None


def _missing(module: str, what: str) -> str | None:
    try:
        __import__(module)
    except ImportError:
        return f"needs {what}, which is not installed here (pip install 'graphcache[gpu]')"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """gpu, torch and cudnn markers skip, with the reason, where this host lacks them."""
    reasons = {
        "gpu": _gpu_reason(),
        "torch": _missing("torch", "torch"),
        "cudnn": _missing("cudnn", "nvidia-cudnn-frontend"),
    }
    for item in items:
        for marker, reason in reasons.items():
            if reason is not None and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
                break


@pytest.fixture
def cudnn():
    """The installed cudnn-frontend where it is 1.32 or later, the release
    whose graph code (validate, build_operation_graph, its lowering) runs on
    a CPU; the test skips, saying so, elsewhere."""
    module = pytest.importorskip("cudnn", reason="needs nvidia-cudnn-frontend (1.32 runs its graph code on a CPU)")
    if tuple(int(x) for x in module.__version__.split(".")[:2]) < (1, 32):
        pytest.skip(f"validate() and lowering without a GPU need frontend 1.32+, found {module.__version__}")
    return module


def _need_redis() -> None:
    if not (shutil.which("redis-server") or os.path.exists("/usr/bin/redis-server")):
        pytest.skip("needs redis-server (Debian package redis-server; scripts/test.sh installs it)")


@pytest.fixture(scope="session")
def redis_url():
    """A Redis for tests: the one scripts/test.sh started, else a private one.

    Under pytest-xdist each worker (gw0, gw1, ...) takes its own database of
    the shared server (1, 2, ...), so that one worker's flushdb never empties
    another's store in the middle of a test."""
    url = os.environ.get("GRAPHCACHE_TEST_REDIS_URL")
    if url:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        if worker.startswith("gw"):
            from urllib.parse import urlsplit, urlunsplit

            url = urlunsplit(urlsplit(url)._replace(path=f"/{int(worker[2:]) % 15 + 1}"))
        yield url
        return
    _need_redis()
    from tests.servers import RedisServer

    with RedisServer() as server:
        yield server.url


@pytest.fixture
def redis_store(redis_url):
    import redis

    from graphcache.stores.redis import RedisStore

    redis.Redis.from_url(redis_url).flushdb()
    store = RedisStore(redis_url)
    yield store
    store.close()


@pytest.fixture
def private_redis():
    """A redis-server of this test's own (to stop it, or to give it a memory limit)."""
    _need_redis()
    from tests.servers import RedisServer

    def start(*args: str) -> RedisServer:
        server = RedisServer(*args).start()
        started.append(server)
        return server

    started: list = []
    yield start
    for server in started:
        server.stop()


# -- the suite's time (scripts/tools/suite_times.py reads what this writes) -----------------

_TIMES = os.environ.get("GRAPHCACHE_TEST_TIMES")


if _TIMES:
    import resource
    import time

    def _cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
        """With GRAPHCACHE_TEST_TIMES=FILE: one CSV row a test (node id, wall
        seconds, CPU seconds of this process and the subprocesses it waited
        for; setup and teardown included), appended as each test ends, so a
        run cut short keeps its rows. CPU seconds, unlike wall, hardly move
        when other work shares the cores."""
        wall, cpu = time.monotonic(), _cpu()
        yield
        import csv

        with open(_TIMES, "a", newline="", encoding="utf-8") as out:  # noqa: PTH123
            csv.writer(out).writerow([item.nodeid, f"{time.monotonic() - wall:.3f}", f"{_cpu() - cpu:.3f}"])
