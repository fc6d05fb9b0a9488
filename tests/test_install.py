"""The README's two commands where the system Python refuses `pip install`
outside a virtual environment (PEP 668, current Debian and Ubuntu).

A stand-in `python3` on PATH plays that system Python: it refuses
`-m pip` with the externally-managed-environment error and otherwise runs
this host's base (non-venv) Python; `-m venv DIR` makes DIR/bin/python (with
an activate script and the graphcache console script), a stand-in venv Python that records pip, ruff, mypy, mkdocs and pytest calls instead of
running them (no network, and no second test suite inside this one) and runs
everything else, graphcache included, on this checkout.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_examples import example
from tests.servers import wait_for_server

ROOT = Path(__file__).parent.parent

SYSTEM_PYTHON = r"""#!/bin/bash
echo "system $*" >> "$SHIM_LOG"
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "error: externally-managed-environment" >&2
  echo "This environment is externally managed (PEP 668): use a virtual environment." >&2
  exit 1
fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  dir="${@: -1}"  # the folder is the last argument, after any options
  mkdir -p "$dir/bin"
  sed "s#@REAL@#$VENV_REAL#" "$SHIM_DIR/venv-python.in" > "$dir/bin/python"
  # What activation and pip's console script give: bin/ first on PATH, and
  # bin/graphcache running this venv's python.
  bin="$(cd "$dir/bin" && pwd)"
  printf 'export VIRTUAL_ENV="%s"\nexport PATH="%s:$PATH"\n' "${bin%/bin}" "$bin" > "$dir/bin/activate"
  printf '#!/bin/bash\nexec "%s/python" -m graphcache "$@"\n' "$bin" > "$dir/bin/graphcache"
  chmod +x "$dir/bin/python" "$dir/bin/graphcache"
  exit 0
fi
exec "$BASE_PYTHON" "$@"
"""

VENV_PYTHON = r"""#!/bin/bash
echo "venv $*" >> "$SHIM_LOG"
# pip's index, asked by scripts/tools/cpu_torch.sh, lists the lock's CPU torch: whatever torch the Python
# running these tests has (scripts/test.sh --torch runs them on another), cpu_torch.sh finds the lock's
# here, never over the network.
case "$*" in
  *"-m pip --disable-pip-version-check index versions torch "*) echo "Available versions: $SHIM_TORCH"; exit 0 ;;
esac
case "$1 $2" in
  "-m pip"|"-m ruff"|"-m mypy"|"-m mkdocs"|"-m pytest") exit 0 ;;
esac
case "$1" in
  # What it checks is the real pip's work, recorded above instead; asked for
  # the packages the lock does not name, it answers SHIM_EXTRAS.
  scripts/tools/lock_check.py) if [[ "$*" == *--extras* ]]; then echo "${SHIM_EXTRAS:-}"; fi; exit 0 ;;
esac
exec @REAL@ "$@"
"""


def shims(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(SYSTEM_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    (bin_dir / "venv-python.in").write_text(VENV_PYTHON)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON")}
    base = Path(sys.base_prefix) / "bin" / "python3"
    assert base.exists(), base
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        SHIM_LOG=str(tmp_path / "calls.log"),
        SHIM_DIR=str(bin_dir),
        BASE_PYTHON=str(base),
        VENV_REAL=sys.executable,  # this test's Python, which has graphcache's dependencies
        SHIM_TORCH=re.search(r"^torch==(\S+)", (ROOT / "requirements" / "test.in").read_text(), re.M).group(1),
        PYTHONPATH=str(ROOT),
    )
    return env


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def run_test_sh(tmp_path: Path, *args: str, cuda_torch: str = "", **extra: str) -> list[str]:
    """scripts/test.sh ARGS with the stand-in Pythons; the calls they recorded
    (``cuda_torch``: the one torch not a CPU build that it may install)."""
    env = {**shims(tmp_path), **extra}
    env["GRAPHCACHE_VENV"] = str(tmp_path / "venv")
    # scripts/tools/old_frontends.sh's cache, as a previous run leaves it (its
    # .complete stamps), so that it installs nothing here and writes nothing
    # into the checkout.
    cache = tmp_path / "old-frontends"
    env.update(GRAPHCACHE_OLD_FRONTENDS=str(cache), OLD_FRONTENDS_RUNTIME="stand-in-runtime")
    (cache / "runtime").mkdir(parents=True)
    (cache / "runtime" / ".complete").write_text("stand-in-runtime\n")
    listed = re.search(r"^FRONTENDS=\(([^)]*)\)", (ROOT / "scripts" / "tools" / "old_frontends.sh").read_text(), re.M)
    for version in listed.group(1).split() if listed else ():
        (cache / f"fe-{version}").mkdir()
        (cache / f"fe-{version}" / ".complete").touch()
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test.sh"), *args], env=env, capture_output=True, text=True, timeout=300
    )
    log = calls(tmp_path)
    assert out.returncode == 0, out.stderr + "\n".join(log)
    assert not [c for c in log if c.startswith("system -m pip")], log
    assert any(c.startswith("system -m venv") for c in log), log
    installs = [c for c in log if c.startswith("venv -m pip install")]
    others = [c for c in installs if "torch" in c and "+cpu" not in c and not c.endswith(f" torch=={cuda_torch}")]
    assert not others, "torch only as its CPU build, but for --torch's"
    assert any(c.startswith("venv -m mkdocs build --strict") for c in log), log  # the docs site, as CI builds it
    assert any(c.startswith("venv -m pytest") for c in log), log
    return log


def test_scripts_test_sh_installs_the_lock_into_a_venv_never_the_system_python(tmp_path):
    # The venv it made holds a package an earlier lock named and this one does not.
    log = run_test_sh(tmp_path, "-q", SHIM_EXTRAS="kernels tomlkit")
    # The lock, hash-checked, then graphcache itself with nothing more, then the check that the venv is the lock.
    locked = next(i for i, c in enumerate(log) if "--require-hashes --no-deps -r requirements/test.lock" in c)
    editable = next(i for i, c in enumerate(log) if c.endswith("--disable-pip-version-check --no-deps -e ."))
    checked = next(
        i
        for i, c in enumerate(log)
        if c == "venv scripts/tools/lock_check.py requirements/test.lock --torch 2.13.0+cpu"
    )
    removed = log.index("venv -m pip uninstall --quiet --yes kernels tomlkit")
    assert locked < editable < removed < checked, log
    assert not [c for c in log if "--upgrade" in c], log


def test_scripts_test_sh_latest_takes_the_newest_releases_and_says_what_differs_from_the_lock(tmp_path):
    log = run_test_sh(tmp_path, "--latest", "-q")
    (upgrade,) = [c for c in log if "--upgrade" in c]
    assert upgrade.endswith("--upgrade --upgrade-strategy eager -c requirements/test.in -e .[dev,gpu,hf]"), upgrade
    assert "venv scripts/tools/lock_check.py requirements/test.lock --torch 2.13.0+cpu --report-only" in log
    assert not [c for c in log if "--require-hashes" in c], log
    assert [c for c in log if c.startswith("venv -m pytest")] == ["venv -m pytest -q"], "--latest is not pytest's"


def test_scripts_test_sh_torch_runs_the_suite_on_the_torch_a_users_pip_gives_beside_the_lock(tmp_path):
    log = run_test_sh(tmp_path, "--torch", "2.15.0", "-q", "tests/test_torch_door.py", cuda_torch="2.15.0")
    # The lock, hash-checked; then torch 2.15.0 as pip gives it, its own requirements resolved (no --no-deps);
    # then graphcache with nothing more; then what differs from the lock, said and not refused.
    locked = next(i for i, c in enumerate(log) if "--require-hashes --no-deps -r requirements/test.lock" in c)
    torch_at = log.index("venv -m pip install --quiet --disable-pip-version-check torch==2.15.0")
    editable = next(i for i, c in enumerate(log) if c.endswith("--disable-pip-version-check --no-deps -e ."))
    reported = log.index("venv scripts/tools/lock_check.py requirements/test.lock --torch 2.15.0 --report-only")
    assert locked < torch_at < editable < reported, log
    # The lock's torch stays out, and nothing is removed from the venv for being beyond the lock.
    assert not [c for c in log if "uninstall" in c or c.endswith("--torch 2.13.0+cpu")], log
    assert [c for c in log if c.startswith("venv -m pytest")] == ["venv -m pytest -q tests/test_torch_door.py"]


@pytest.mark.parametrize(
    "args",
    [("--torch",), ("--torch", "latest"), ("--torch", ">=2.15"), ("--torch=",), ("--latest", "--torch", "2.15.0")],
)
def test_scripts_test_sh_torch_refuses_what_is_not_one_version_before_installing_anything(tmp_path, args):
    env = {**shims(tmp_path), "GRAPHCACHE_VENV": str(tmp_path / "venv")}
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test.sh"), *args, "-q"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2, out.stderr
    assert "--torch" in out.stderr and ("e.g. --torch 2.15.0" in out.stderr or "one of --latest" in out.stderr)
    assert calls(tmp_path) == [] and not (tmp_path / "venv").exists()


def test_readme_serve_command_works_where_pip_refuses_the_system_python(tmp_path):
    lines = example("serve").commands()
    assert len(lines) == 1 and "pip install" in lines[0] and "graphcache serve" in lines[0], lines
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = re.sub(r"--port \d+", f"--port {port}", lines[0])
    env = shims(tmp_path)
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        health = wait_for_server(f"http://127.0.0.1:{port}", proc, timeout=60)
        assert health.status_code == 200 and "cache" in health.json()["store"]
        assert (tmp_path / "cache").is_dir()
        assert not [c for c in calls(tmp_path) if c.startswith("system -m pip")]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the group this test started: bash and the server
        except ProcessLookupError:
            pass
        proc.wait(15)
