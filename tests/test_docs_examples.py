"""The docs' examples that run on a CPU, run as the pages write them
(tests/docs_examples.py reads each block by the name its marker gives it).
The README's two commands and its no-GPU walk are tests/test_readme_commands.py's;
the CLI examples other tests run say so beside their marker's name below."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.docs_examples import ROOT, Block, blocks, example


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A plain environment: the suite's venv first on PATH (``python``,
    ``graphcache``), this checkout importable, HOME and the cache in tmp_path."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(ROOT),
        "GRAPHCACHE_DIR": str(tmp_path / "cache"),
    }
    return {**env, **extra}


def workdir(tmp_path: Path) -> Path:
    """A folder that looks like the repository's root to the examples (its docs/), writes going to tmp_path."""
    work = tmp_path / "work"
    if not work.exists():
        work.mkdir()
        (work / "docs").symlink_to(ROOT / "docs")
    return work


def run(block: Block, tmp_path: Path, timeout: int = 300, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``block`` as it is written: Python with ``python -c``, shell with ``bash -e -c``."""
    argv = [sys.executable, "-c", block.text] if block.lang == "python" else ["bash", "-e", "-c", block.text]
    out = subprocess.run(
        argv,
        cwd=workdir(tmp_path),
        env=environment(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, f"{block.where}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def last_dict(stdout: str) -> dict:
    """The dict the example printed last (``print(gt.stats())``)."""
    line = [line for line in stdout.splitlines() if line.startswith("{")][-1]
    return ast.literal_eval(line)


def test_the_readmes_worker_builds_on_a_miss_then_hits(tmp_path):
    pytest.importorskip("torch")
    worker = example("worker")
    assert len([line for line in worker.text.splitlines() if line.strip()]) <= 12  # "in ten lines", the imports apart
    first = last_dict(run(worker, tmp_path, GRAPHCACHE_COMPILER="reference").stdout)
    assert (first["misses"], first["builds"], first["hits"], first["fallbacks"]) == (1, 1, 0, 0)
    assert (first["served_from_store"], first["built_here"]) == (0, 1), "built on the spot: no hit"
    again = last_dict(run(worker, tmp_path, GRAPHCACHE_COMPILER="reference").stdout)
    assert (again["hits"], again["builds"]) == (1, 0), "the second worker loads what the first built"
    assert (again["served_from_store"], again["built_here"]) == (1, 0)


def text_after(block: Block) -> str:
    """The ``text`` block (the output a page shows) that follows ``block`` on its page."""
    later = [b for b in blocks(block.page) if b.line > block.line]
    return next(b for b in later if b.lang == "text").text.strip()


SUMMARY = re.compile(
    r"(\d+) calls: (\d+) served from the store, (\d+) by graphs built here(?: \((\d+) built: (.*)\))?, (\d+) fell back to torch"
)


def summary_line(stdout: str) -> re.Match[str]:
    """What ``print(gt.summary())`` printed last."""
    found = [m for line in stdout.splitlines() if (m := SUMMARY.fullmatch(line.strip()))]
    assert found, stdout[-2000:]
    return found[-1]


def test_the_drop_in_example_builds_on_an_empty_store_and_the_next_run_is_served_from_it(tmp_path):
    pytest.importorskip("torch")
    first = summary_line(run(example("drop-in"), tmp_path).stdout)
    assert first.group(0) == text_after(example("drop-in")), "the page shows what it prints"
    assert first.group(1, 2, 3, 6) == ("2", "0", "2", "0"), first.group(0)  # built on the spot: no hit
    again = summary_line(run(example("drop-in"), tmp_path).stdout)  # the same store, a new process
    assert again.group(0) == "2 calls: 2 served from the store, 0 by graphs built here, 0 fell back to torch"


@pytest.mark.slow
def test_the_hugging_face_guide_is_built_here_on_an_empty_store_and_served_from_the_store_after_warm(tmp_path):
    pytest.importorskip("transformers")
    page = example("hf-backend")
    assert page.text == (ROOT / "docs" / "examples" / "hf_worker.py").read_text(), "the page shows the file it runs"
    (tmp_path / "cold").mkdir()
    (tmp_path / "warm").mkdir()
    # On an empty store: no call served from the store, and the graphs built here named.
    cold = summary_line(run(example("hf-cold"), tmp_path / "cold").stdout)
    calls, served, built, graphs, named, fell = cold.group(1, 2, 3, 4, 5, 6)
    assert (served, built, fell) == ("0", calls, "0") and int(calls) > 0, cold.group(0)
    assert int(graphs) == len(named.split(", ")) and all(g.endswith(" class") for g in named.split(", ")), named
    assert cold.group(0) == text_after(example("hf-cold")), "the page shows what it prints"
    # manifest -> warm -> worker, in a fresh store: every call served from the store.
    walk = run(example("hf-warm"), tmp_path / "warm")
    # The default cache's prefill and decode at 2 length classes (4), a static cache's and compiled code's (14).
    assert re.search(r"wrote tiny-llama\.yaml: 18 graph\(s\) for llama on route graphcache", walk.stdout), walk.stdout
    assert "0 present, 18 built, 0 unsupported, 0 refused, 0 failed" in walk.stdout
    warm = summary_line(walk.stdout)
    assert (
        warm.group(0) == f"{calls} calls: {calls} served from the store, 0 by graphs built here, 0 fell back to torch"
    )
    assert warm.group(0) == text_after(example("hf-warm"))


def recorded(path: Path) -> dict:
    from graphcache import manifest

    text = path.read_text()
    assert manifest.load(path), text
    return yaml.safe_load(text)


def test_the_record_examples_write_manifests_that_warm_reads(tmp_path):
    pytest.importorskip("transformers")
    python = tmp_path / "python"
    python.mkdir()
    run(example("record-python"), python)
    assert len(recorded(python / "work" / "manifest.yaml")["graphs"]) == 2  # prefill's class and decode's
    cli = tmp_path / "cli"
    cli.mkdir()
    out = run(example("record-cli"), cli)
    assert "served a prompt of 512 tokens, 8 new" in out.stdout
    written = recorded(cli / "work" / "manifest.yaml")
    assert {g.get("seq_q") for g in written["graphs"]} == {512, 1}


@pytest.mark.slow
def test_the_manifest_from_a_config_example_traces_llama(tmp_path):
    pytest.importorskip("transformers")
    out = run(example("manifest-from-config"), tmp_path)
    assert re.search(r"wrote llama\.yaml: \d+ graph\(s\) for llama on route sdpa", out.stdout), out.stdout
    from graphcache import manifest

    assert len(manifest.load(tmp_path / "work" / "llama.yaml")) > 100  # every batch and length class


@pytest.mark.slow
def test_the_vision_and_diffusers_manifest_examples_trace_their_tiny_configs(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("diffusers")
    out = run(example("manifest-media"), tmp_path)
    assert "wrote vit.yaml: 6 graph(s) for vit on route sdpa" in out.stdout, out.stdout
    assert re.search(r"wrote sd3\.yaml: \d+ graph\(s\) for SD3Transformer2DModel on route sdpa", out.stdout), out.stdout
    from graphcache import manifest

    # 512 px: 64 x 64 latents in patches of 2, 1024 tokens after 333 prompt tokens (class 2048); 768 px: 2304 + 333.
    assert {s.seq_q for s in manifest.load(tmp_path / "work" / "sd3.yaml")} == {2048, 4096}


def test_the_bias_cast_script_prints_the_table_above_it(tmp_path):
    pytest.importorskip("torch")
    block = example("bias-cast")
    page = block.page.read_text()
    table = page[: page.index("<!-- example: run bias-cast -->")]
    rows = re.findall(r"^\+-(\d+) +([\d.]+) / ([\d.]+) +([\d.]+) / ([\d.]+)$", table, re.M)
    assert len(rows) == 5, table[-800:]
    printed = {}
    for line in run(block, tmp_path).stdout.splitlines():
        dtype, bound, error, difference = re.fullmatch(r"torch\.(\w+) (\d+) \(([\d.e-]+), ([\d.e-]+)\)", line).groups()
        printed[dtype, bound] = (float(error), float(difference))
    for bound, bf16_error, bf16_diff, fp16_error, fp16_diff in rows:
        for dtype, error, difference in (("bfloat16", bf16_error, bf16_diff), ("float16", fp16_error, fp16_diff)):
            got = printed[dtype, bound]
            assert f"{got[0]:.4f}" == error and f"{got[1]:.3f}" == difference, (dtype, bound, got)


def test_the_install_page_shows_the_readmes_install_and_its_torch_step_and_doctor_run(tmp_path):
    # The same lines as the README's, which tests/test_first_hour.py runs in a fresh clone.
    assert example("install-page").text == example("install").text
    torch_step = example("cpu-torch")
    assert torch_step.commands() == [example("no-gpu-walk").commands()[1]], "the walk's torch step"
    torch = pytest.importorskip("torch")
    pin = re.search(r"^torch==(\S+)", (ROOT / "requirements" / "test.in").read_text(), re.M).group(1)
    if torch.__version__ == pin:  # the lock's venv: the step as written, which finds it installed
        step = torch_step.text
    else:  # scripts/test.sh --torch: as written, it would put the lock's torch over the one under test
        step = torch_step.text.replace("scripts/tools/cpu_torch.sh ", "scripts/tools/cpu_torch.sh --which ")
        assert step != torch_step.text
    out = subprocess.run(
        ["bash", "-e", "-c", step], cwd=ROOT, env=environment(tmp_path), capture_output=True, text=True
    )
    if step == torch_step.text:
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"torch {pin} (CPU build): already installed\n", out.stdout
    else:  # where it would come from, or why from nowhere: one line either way, decided before any download
        said = (out.stdout + out.stderr).splitlines()
        assert len(said) == 1 and f"torch {pin}" in said[0], said
        assert (out.returncode, said[0].startswith(f"torch {pin} (CPU build): from ")) in ((0, True), (1, False))
    doctor = run(example("doctor-install"), tmp_path, COLUMNS="200")
    assert "reference-sm00-cudnn0.0.0-fe0.0.0" in doctor.stdout and "python" in doctor.stdout
