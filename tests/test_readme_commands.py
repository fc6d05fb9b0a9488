"""The README's commands, run as a newcomer runs them: in a fresh shell
(a clean environment, the venv activated as the README says), against a
server on 127.0.0.1. The same from a fresh clone in a new venv, installs
included, is tests/test_first_hour.py."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_examples import example
from tests.servers import free_port, wait_for_server

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DROP_IN = (ROOT / "docs" / "drop-in.md").read_text()


def section(title: str) -> str:
    """The README's text under ``## title``, up to the next ``## ``."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def venv_activate() -> Path:
    """The activate script of the venv running the tests (scripts/test.sh's)."""
    script = Path(sys.prefix) / "bin" / "activate"
    if sys.prefix == sys.base_prefix or not script.exists():
        pytest.skip(f"the tests run outside a venv ({sys.prefix}): the README's activation cannot be tried")
    return script


def fresh_shell(command: str, home: Path, cwd: Path, **popen: object) -> list[str]:
    """argv of a fresh bash (nothing of this process's environment but a
    plain PATH and a HOME) that activates the venv, then runs ``command``."""
    activate = venv_activate()
    env = f"env -i HOME={home} PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 COLUMNS=200"
    return ["bash", "-c", f"cd {cwd} && exec {env} bash --norc -c '. {activate} && {command}'"]


def test_the_two_commands_leave_graphcache_on_path_as_the_examples_type_it(tmp_path):
    serve = example("serve")
    assert serve.text in section("The two commands")
    (serve_line,) = serve.commands()
    steps = [step.strip() for step in serve_line.split("&&")]
    activation = next(i for i, step in enumerate(steps) if step.startswith(". "))
    venv = steps[activation].split()[1].removesuffix("/bin/activate")
    # The venv the first command activates is the one scripts/test.sh creates.
    assert re.search(rf"VENV=\$\{{GRAPHCACHE_VENV:-{re.escape(venv)}\}}", (ROOT / "scripts/test.sh").read_text())
    assert steps[0].startswith(f"python3 -m venv {venv}")
    assert activation < next(i for i, step in enumerate(steps) if step.startswith("graphcache serve"))
    assert "graphcache warm" in README and "`. .venv/bin/activate` again" in README
    # What activation gives a fresh shell: graphcache, from the venv.
    out = subprocess.run(
        fresh_shell("command -v graphcache && graphcache --version", tmp_path, ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == str(Path(sys.prefix) / "bin" / "graphcache")
    without = subprocess.run(
        ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "bash", "--norc", "-c", "command -v graphcache"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert without.returncode != 0  # a fresh shell without the activation has none


def walk_commands(port: int) -> list[str]:
    """The no-GPU walk's lines, against the service on ``port``."""
    commands = example("no-gpu-walk").commands()
    assert commands[0] == ". .venv/bin/activate", "the walk's second shell activates the first command's venv"
    assert commands[1] == "scripts/tools/cpu_torch.sh python", (
        "torch's CPU build, from a source decided before downloading"
    )
    assert [c.split()[:2] for c in commands[2:5]] == [["graphcache", "warm"]] * 2 + [["graphcache", "prefetch"]]
    commands = [c.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for c in commands]
    assert all("8080" not in c for c in commands)
    return commands


def serve_command(port: int) -> str:
    """The first command's last step: the service, on ``port``."""
    serve = example("serve").commands()[0].split("&&")[-1].strip()
    assert serve.startswith("graphcache serve ") and "--port 8080" in serve
    return serve.replace("--port 8080", f"--port {port}")


def assert_walk_output(warm: str, check: str, prefetch: str, dropin: str) -> None:
    """What the README says each step of the walk prints."""
    assert "2 built" in warm
    assert "6/6 present for reference-sm00-cudnn0.0.0-fe0.0.0" in check
    assert re.search(r"reference-sm00-cudnn0\.0\.0-fe0\.0\.0 │ 6 +│ 0 ", prefetch), prefetch  # present, missing
    assert "drop-in: 6 calls: 6 served from the store, 0 by graphs built here, 0 fell back to torch" in dropin


def test_try_it_without_a_gpu_runs_as_written(tmp_path):
    torch = pytest.importorskip("torch")
    pin = re.search(r"^torch==(\S+)", (ROOT / "requirements" / "test.in").read_text(), re.M).group(1)
    port = free_port()
    commands = walk_commands(port)
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "clone"
    work.mkdir()
    for part in ("docs", "scripts", "requirements"):  # "from the repository's root", its ./cache in tmp_path
        (work / part).symlink_to(ROOT / part)
    (work / ".venv").symlink_to(sys.prefix)  # the venv the first command made: here the suite's
    server = subprocess.Popen(
        fresh_shell(serve_command(port), home, work),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_server(f"http://127.0.0.1:{port}", server, healthy=True)
        # The second shell: every line typed into it in turn, the first one activating the venv.
        outputs = []
        for i in range(1, len(commands)):
            # Under scripts/test.sh --torch, the torch step as written would put the lock's torch over the
            # one under test: it says where it would take it from instead (or why from nowhere), one line.
            which = commands[i] == "scripts/tools/cpu_torch.sh python" and torch.__version__ != pin
            command = "scripts/tools/cpu_torch.sh --which python" if which else commands[i]
            line = " && ".join([commands[0], command])
            run = subprocess.run(fresh_shell(line, home, work), capture_output=True, text=True, timeout=300)
            if which:
                said = (run.stdout + run.stderr).splitlines()
                assert len(said) == 1 and f"torch {pin}" in said[0] and run.returncode in (0, 1), said
            else:
                assert run.returncode == 0, f"{commands[i]}\n{run.stdout}\n{run.stderr}"
            outputs.append(run.stdout)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    _install, warm, check, prefetch, dropin = outputs
    assert_walk_output(warm, check, prefetch, dropin)


def readme_reasons() -> set[str]:
    """The fallback reasons docs/drop-in.md lists."""
    bullet = DROP_IN[DROP_IN.index("- **Same result as torch.**") :]
    bullet = bullet[: bullet.index("`spec_for` raises")]
    return set(re.findall(r"`([a-z_0-9]+)`(?!\))", bullet))  # not `attn_mask` inside a parenthesis


def code_reasons() -> set[str]:
    """The reasons the SDPA drop-in's code counts calls under, read from it."""
    names = ("derive.py", "runtime.py", "guard.py")
    text = "".join((ROOT / "graphcache" / "torch" / "core" / name).read_text() for name in names)
    found = re.findall(r'reason="([a-z_0-9]+)"|Plan\([^()]*?, None, "([a-z_0-9]+)"|return None, "([a-z_0-9]+)"', text)
    return {name for groups in found for name in groups if name}


def test_the_readmes_fallback_reasons_are_the_codes():
    from graphcache.spec import GraphSpec

    listed, counted = readme_reasons(), code_reasons()
    assert {"device", "no_gpu", "miss", "mask"} <= counted  # the scan reads the code
    assert counted - listed == set(), "reasons the code counts that docs/drop-in.md does not list"
    # A spec field a call's shape breaks is counted under the field's name (derive: exc.field).
    assert listed - counted <= set(GraphSpec.field_names()), "reasons docs/drop-in.md lists that the code never counts"


def test_a_bf16_call_on_the_cpu_is_counted_under_the_reason_the_docs_give_for_it():
    torch = pytest.importorskip("torch")
    import graphcache.torch as gt

    gt.reset()
    q = torch.randn(1, 4, 16, 64, dtype=torch.bfloat16)
    gt.scaled_dot_product_attention(q, q, q, is_causal=True)
    (reason,) = gt.stats()["fallbacks"]
    assert reason in readme_reasons()
    described = DROP_IN[DROP_IN.index(f"`{reason}` (") :].split(")", 1)[0]
    assert "without a GPU every call, bf16 included" in described, described
    gt.reset()


def test_the_readme_says_what_the_test_command_costs_and_how_to_run_a_subset():
    text = section("The two commands")
    # How long it takes, as a range on a named machine rather than one figure that goes stale
    # (issue 39: "16 minutes" had become 33), and that the first run's installs come on top.
    assert re.search(
        r"on a 2-core machine the tests take about \d+ to \d+ minutes,\s+and the first run's installs", text
    )
    assert re.search(r"a [\d.]+ GB\s+`\.venv`", text)
    frontends = re.search(r"(\d+) MB\s+in `\.cache/old-frontends`", text)
    assert frontends, text
    # The same figure as the script's own comment on that step.
    assert f"{frontends[1]} MB on a fresh clone" in (ROOT / "scripts/test.sh").read_text()
    subsets = example("test-subsets")
    assert subsets.text in text
    subset = [shlex.split(line, comments=True) for line in subsets.commands()]
    assert subset and any(cmd[0] == "scripts/test.sh" for cmd in subset)
    for cmd in subset:
        assert all((ROOT / arg).exists() for arg in cmd if arg.startswith("tests/")), cmd
        if cmd[0] == ".venv/bin/python":  # the subset selects tests
            out = subprocess.run(
                [sys.executable, *cmd[1:], "--collect-only"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0 and re.search(r"\d+(/\d+)? tests? collected", out.stdout), out.stdout[-500:]
