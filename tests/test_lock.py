"""What the test suite installs (issue 39): requirements/test.lock, made by
scripts/tools/lock.sh (uv pip compile, with hashes), agrees with pyproject.toml's
ranges and holds no CUDA build; scripts/tools/lock_check.py names every way a venv
differs from it; scripts/tools/cpu_torch.sh finds torch's CPU build before any
download, says where in one line, or says why not in one line, quickly.

scripts/test.sh runs lock_check.py on the venv it installed (so CI fails when
the venv is not the lock); a fresh clone's whole install is not rerun here
(minutes of downloads): the report of issue 39 gives that run."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
LOCK = (ROOT / "requirements" / "test.lock").read_text()
PINS_IN = (ROOT / "requirements" / "test.in").read_text()


def lock_check():  # noqa: ANN201 - the script's module
    spec = importlib.util.spec_from_file_location("lock_check", ROOT / "scripts" / "tools" / "lock_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lock_pins_every_requirement_of_the_suite_inside_pyprojects_ranges():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"]]
    for extra in ("dev", "gpu", "hf"):
        wanted += project["optional-dependencies"][extra]
    torch_needs = [line for line in (ROOT / "requirements" / "torch-requires.txt").read_text().splitlines()]
    wanted += [line for line in torch_needs if line and not line.startswith("#")]
    pins = lock_check().pins(LOCK)
    for text in wanted:
        requirement = Requirement(text)
        name = requirement.name.lower()
        if name == "torch":
            continue  # its CPU build, installed beside the lock (scripts/tools/cpu_torch.sh)
        assert name in pins, f"{text}: not in requirements/test.lock (rerun scripts/tools/lock.sh)"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{text}: the lock pins {pins[name]}"
    # The suite's own pins: cudnn-frontend's in the lock, torch's CPU build beside it.
    assert pins["nvidia-cudnn-frontend"] == re.search(r"^nvidia-cudnn-frontend==(\S+)", PINS_IN, re.M).group(1)
    assert re.search(r"^torch==\S+\+cpu$", PINS_IN, re.M), "torch's pin names its CPU build"


def test_the_lock_holds_hashes_and_no_cuda_build():
    blocks = re.split(r"\n(?=[a-z0-9])", LOCK)
    pinned = [b for b in blocks if re.match(r"[a-z0-9][a-z0-9._-]*==", b)]
    assert len(pinned) > 50
    assert all("--hash=sha256:" in b for b in pinned), [b.split()[0] for b in pinned if "--hash" not in b]
    names = {b.split("==")[0] for b in pinned}
    assert "torch" not in names and "triton" not in names  # PyPI's CUDA torch would bring triton ...
    assert not {
        n for n in names if re.match(r"nvidia-(cublas|cuda-runtime|cudnn-cu|nccl|cusparse)", n)
    }  # ... and these


def test_lock_check_names_each_difference_and_evaluates_markers():
    check = lock_check()
    text = (
        "a==1.0 \\\n    --hash=sha256:00\n"
        "b==2.0 ; python_full_version < '3.0' \\\n    --hash=sha256:11\n"
        "c==3.0 \\\n    --hash=sha256:22\n"
    )
    locked = {**check.pins(text), "torch": "2.13.0+cpu"}
    assert locked == {"a": "1.0", "c": "3.0", "torch": "2.13.0+cpu"}  # b is for Python 2 only
    same = {"a": "1.0", "c": "3.0", "torch": "2.13.0+cpu", "pip": "25.0", "graphcache": "0.1.0"}
    assert check.differences(locked, same) == []
    other = {"a": "1.1", "torch": "2.13.0", "pytest-benchmark": "5.2.3"}  # PyPI's torch: the CUDA build
    assert check.differences(locked, other) == [
        "a is 1.1, the lock pins 1.0",
        "c 3.0 is missing",
        "torch is 2.13.0, the lock pins 2.13.0+cpu",
        "pytest-benchmark 5.2.3 is installed and the lock has no such package",
    ]


# -- scripts/tools/cpu_torch.sh ------------------------------------------------------------------------

VERSION = "9.9.9+cpu"  # no such torch: the decision is what is tested, not a real wheel
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


def fake_wheel(folder: Path) -> Path:
    """A wheel named torch 9.9.9+cpu for this Python: a module that says its version."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{VERSION}-{TAG}-{TAG}-linux_x86_64.whl"
    info = f"torch-{VERSION}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("torch/__init__.py", f"__version__ = {VERSION!r}\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {VERSION}\n")
        wheel.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {TAG}-{TAG}-linux_x86_64\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


@contextmanager
def served(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on 127.0.0.1: a stand-in for PyTorch's CPU index."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cpu_torch(
    python: str, tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    # pip sees none of this machine's configuration: its own sources are only what env names.
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    base.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=f"http://127.0.0.1:{closed_port()}/simple",
        PIP_NO_CACHE_DIR="1",
        HOME=str(tmp_path),
        GRAPHCACHE_TORCH_INDEX=f"http://127.0.0.1:{closed_port()}/whl/cpu",
    )
    started = time.monotonic()
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "tools" / "cpu_torch.sh"), *args, python, VERSION],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out, time.monotonic() - started


def bare_venv(tmp_path: Path) -> str:
    """A venv without torch whose pip is the base Python's (no pip install: fast)."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True, timeout=60
    )
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("the base Python has no pip for a venv to borrow")
    return python


def test_cpu_torch_takes_a_wheel_pips_own_sources_list_without_asking_pytorchs_index(tmp_path):
    python = bare_venv(tmp_path)
    fake_wheel(tmp_path / "wheels")
    out, seconds = run_cpu_torch(python, tmp_path, "--which", PIP_FIND_LINKS=str(tmp_path / "wheels"))
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    assert line.startswith(f"torch {VERSION} (CPU build): from pip's own sources (find-links {tmp_path / 'wheels'}; ")
    assert line.endswith("), no PyTorch index needed")


def test_cpu_torch_installs_from_pytorchs_cpu_index_where_pip_has_no_such_wheel(tmp_path):
    python = bare_venv(tmp_path)
    index = tmp_path / "index"
    wheel = fake_wheel(index / "torch")
    link = wheel.name.replace("+", "%2B")
    (index / "torch" / "index.html").write_text(f'<html><body><a href="{link}">{wheel.name}</a></body></html>')
    with served(index) as url:
        out, _ = run_cpu_torch(python, tmp_path, GRAPHCACHE_TORCH_INDEX=url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"torch {VERSION} (CPU build): from PyTorch's CPU index, {url} (pip's own sources have no such wheel)"
    ]
    got = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    assert got.stdout.strip() == VERSION
    again, _ = run_cpu_torch(python, tmp_path, GRAPHCACHE_TORCH_INDEX=url)
    assert again.stdout.splitlines() == [f"torch {VERSION} (CPU build): already installed"]


def test_cpu_torch_says_in_one_line_within_seconds_why_no_source_has_it(tmp_path):
    python = bare_venv(tmp_path)
    out, seconds = run_cpu_torch(python, tmp_path)  # pip's index and PyTorch's both refuse connections
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"error: no CPU build of torch {VERSION} for Python ")
    assert "did not answer within 5 s" in line and "PIP_FIND_LINKS=DIR" in line and "GRAPHCACHE_TORCH_INDEX" in line
    assert seconds < 60, "no retries: pip's five would take minutes where an index is unreachable"
    with served(tmp_path) as url:  # an index that answers without the wheel
        out, _ = run_cpu_torch(python, tmp_path, GRAPHCACHE_TORCH_INDEX=url)
    assert out.returncode == 1 and f"{url} answers but has no torch page (HTTP 404)" in out.stderr
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<html><body>torch-2.13.0+cpu-cp311-none</body></html>")
    with served(tmp_path) as url:
        out, _ = run_cpu_torch(python, tmp_path, GRAPHCACHE_TORCH_INDEX=url)
    assert out.returncode == 1 and f"{url} answers but lists no torch-{VERSION} wheel for {TAG}" in out.stderr
