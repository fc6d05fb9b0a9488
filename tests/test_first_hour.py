"""A newcomer's first hour, as the README writes it (issue 34, item 5): in a
fresh clone, in fresh shells (nothing of this process's environment but a
plain PATH and a HOME of their own), the first of the two commands makes a
new venv and serves; the no-GPU walk, typed into a second shell, installs
torch's CPU build into that venv and ends with the drop-in's calls served
from the store; the Install section's extras then install into the same venv.

Nothing here uses the suite's venv: the venv is the one the README's first
command creates, from the machine's python3. pip's own cache is shared with
the user running the suite, and so is pip's configuration (where the
machine's packages come from), as a newcomer's own shells would have them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.docs_examples import ROOT, example
from tests.servers import free_port, wait_for_server
from tests.test_readme_commands import assert_walk_output, serve_command, walk_commands

PLAIN_PATH = "/usr/local/bin:/usr/bin:/bin"


def clone(tmp_path: Path) -> Path:
    """A git clone of this checkout, with the work tree's uncommitted changes
    laid over it (in CI, a clean clone: the two are the same)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    work = tmp_path / "graphcache"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(work)], check=True, timeout=120)
    changed = subprocess.run(
        ["git", "ls-files", "--modified", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in changed:
        source, target = ROOT / name, work / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    deleted = subprocess.run(
        ["git", "ls-files", "--deleted"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    for name in deleted:
        (work / name).unlink(missing_ok=True)
    return work


def pip_setup() -> list[str]:
    """The user's pip setup, as ``NAME=value``: the PIP_* variables, the
    user's pip.conf (under the real HOME, which the fresh shells do not
    have) and pip's cache. Where packages come from is the machine's
    business, not the README's; the README's commands are run unchanged."""
    setup = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    home = Path.home()
    for conf in (home / ".config" / "pip" / "pip.conf", home / ".pip" / "pip.conf"):
        if conf.exists() and "PIP_CONFIG_FILE" not in setup:
            setup["PIP_CONFIG_FILE"] = str(conf)
    setup.setdefault("PIP_CACHE_DIR", str(home / ".cache" / "pip"))
    # No PIP_RETRIES here: the walk's torch step (scripts/tools/cpu_torch.sh) asks
    # each source once, within seconds, where one cannot be reached.
    return [f"{name}={value}" for name, value in sorted(setup.items())]


def shell(command: str, home: Path, cwd: Path) -> list[str]:
    """argv of a fresh bash in ``cwd`` that runs ``command`` (a script of lines, stopping at the first failure)."""
    env = [
        "env",
        "-i",
        f"HOME={home}",
        f"PATH={PLAIN_PATH}",
        "LANG=C.UTF-8",
        "COLUMNS=200",
        *pip_setup(),
    ]
    return [*env, "bash", "--norc", "-e", "-c", f"cd {cwd}\n{command}"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_fresh_clone_serves_then_walks_the_no_gpu_path_in_a_new_venv(tmp_path):
    if shutil.which("python3", path=PLAIN_PATH) is None:
        pytest.skip(f"no python3 on {PLAIN_PATH}")
    work = clone(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    first = example("serve").commands()[0]
    first = first.replace(serve_command(8080), serve_command(port))
    assert not (work / ".venv").exists()
    log = tmp_path / "first-command.log"  # pip's output and the server's: a pipe could fill and stall them
    with log.open("w") as out:
        server = subprocess.Popen(shell(first, home, work), stdout=out, stderr=out, start_new_session=True)
    try:
        # The first command creates the venv and installs '.' before it serves.
        try:
            wait_for_server(f"http://127.0.0.1:{port}", server, healthy=True, timeout=600)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None
        assert (work / ".venv" / "bin" / "graphcache").exists()
        walk = subprocess.run(
            shell("\n".join(walk_commands(port)), home, work), capture_output=True, text=True, timeout=900
        )
        assert walk.returncode == 0, f"{walk.stdout[-3000:]}\n{walk.stderr[-3000:]}"
        assert_walk_output(walk.stdout, walk.stdout, walk.stdout, walk.stdout)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    # The Install section's lines, typed into a third shell: the extras go into the same venv.
    install = example("install")
    extras = subprocess.run(
        shell(
            install.text + "python -c 'import cudnn, transformers, matplotlib, torch; print(torch.__version__)'",
            home,
            work,
        ),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert extras.returncode == 0, f"{extras.stdout[-3000:]}\n{extras.stderr[-3000:]}"
    assert extras.stdout.strip().splitlines()[-1].startswith("2.13.0"), "the walk's CPU torch stays"
