"""A host without torch or cudnn (the server host the README installs): the
no-GPU paths run there, and what needs torch says so at once.

torch and cudnn are hidden from subprocesses by tests/hidden/sitecustomize.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from graphcache.stores import DiskStore
from tests.clirun import HIDDEN_DIR, cli
from tests.fakes import TARGET, make_artifact, spec

ROOT = Path(__file__).parent.parent
NO_TORCH = ("torch", "cudnn")


def hidden_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HIDDEN_DIR), str(ROOT)]),
        "GRAPHCACHE_TEST_HIDE": ",".join(NO_TORCH),
        **extra,
    }


LOAD = """
import sys
from graphcache import GraphCache, GraphCacheError, GraphSpec
from graphcache.compilers.cudnn import CudnnCompiler

cache = GraphCache.from_env(CudnnCompiler(), torch_fallback=True)
spec = GraphSpec.from_dict({"batch": 1, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "causal"})
try:
    graph = cache.load(spec)
except GraphCacheError as exc:
    print(f"{type(exc).__name__}: {exc}")
    sys.exit(3)
print(f"loaded {graph.backend}")
"""


def test_torch_fallback_without_torch_fails_at_load_with_one_clear_error(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", LOAD],
        capture_output=True,
        text=True,
        timeout=120,
        env=hidden_env(GRAPHCACHE_DIR=str(tmp_path / "c")),
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert out.stdout.startswith("NoGpu: ")
    assert "torch fallback needs torch" in out.stdout and "pip install 'graphcache[gpu]'" in out.stdout
    assert "b1 h8 s128 d64" in out.stdout  # which spec could not be served


def test_warm_check_runs_without_torch(tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "graphs:\n  - name: t\n    batch: 1\n    heads_q: 8\n    head_dim: 64\n    mask: causal\n    seq_q: [128, 256]\n"
    )
    folder = tmp_path / "c"
    store = DiskStore(folder)
    art = make_artifact(spec())
    store.put(art.key, art.encode())
    store.close()
    args = ("--cache-dir", str(folder), "warm", str(manifest), "--check", "--target", str(TARGET))
    out = cli(*args, hide=NO_TORCH)
    assert out.returncode == 1, out.stderr
    assert "1/2 present" in out.stdout and "coverage gate failed" in out.stderr
    other = make_artifact(spec(seq_q=256))
    DiskStore(folder).put(other.key, other.encode())
    out = cli(*args, hide=NO_TORCH)
    assert out.returncode == 0 and "2/2 present" in out.stdout


def test_warm_without_torch_says_what_to_install(tmp_path):
    manifest = ROOT / "docs" / "examples" / "llama3-8b.yaml"
    out = cli("--cache-dir", str(tmp_path / "c"), "warm", str(manifest), hide=NO_TORCH)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert "pip install 'graphcache[gpu]'" in out.stderr


TORCH_FILES = [
    "tests/test_torch_sdpa.py",
    "tests/test_cache.py",
    "tests/test_target.py",
    "tests/test_compiler_cudnn.py",
    "tests/test_ops.py",
]


def pytest_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args, *TORCH_FILES],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=hidden_env(),
    )


def test_tests_that_need_torch_or_cudnn_say_so_and_skip_cleanly_without_them():
    marked = pytest_without_torch("-m", "torch or cudnn")
    assert marked.returncode == 0, marked.stdout[-3000:]
    assert " passed" not in marked.stdout and " skipped" in marked.stdout, marked.stdout[-3000:]
    assert "needs torch, which is not installed" in marked.stdout
    assert "needs nvidia-cudnn-frontend, which is not installed" in marked.stdout
    rest = pytest_without_torch("-m", "not torch and not cudnn and not gpu")
    assert rest.returncode == 0, rest.stdout[-3000:]
    assert " passed" in rest.stdout and " skipped" not in rest.stdout, rest.stdout[-3000:]
