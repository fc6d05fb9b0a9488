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

from tests.docs_examples import ROOT, Block, example


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
    again = last_dict(run(worker, tmp_path, GRAPHCACHE_COMPILER="reference").stdout)
    assert (again["hits"], again["builds"]) == (1, 0), "the second worker loads what the first built"


def test_the_drop_in_example_serves_its_calls_from_graphs(tmp_path):
    pytest.importorskip("torch")
    stats = last_dict(run(example("drop-in"), tmp_path).stdout)
    assert stats["calls"] == stats["hits"] == 2 and stats["fallbacks"] == {}, stats


def test_the_hugging_face_example_serves_every_attention_call(tmp_path):
    pytest.importorskip("transformers")
    stats = last_dict(run(example("hf-backend"), tmp_path).stdout)
    assert stats["calls"] == stats["hits"] > 0 and stats["fallbacks"] == {}, stats


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
