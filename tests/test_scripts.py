"""The benchmark scripts docs/benchmarks.md quotes still run (briefly), so a
change of a library interface cannot leave them broken unnoticed; every path
to a script that the repository gives a reader or a program leads to it, and
docs/contributing.md lists each script in the table of its folder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_examples import blocks

ROOT = Path(__file__).resolve().parents[1]


def run_script(path: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """scripts/PATH (bench/bench_store.py) with ``args`` from the checkout's root; fails the test unless it exits 0."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / path), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.mark.torch
def test_bench_torch_dropin_runs_and_reports_every_case():
    pytest.importorskip("torch", reason="the drop-in benchmark needs torch")
    out = run_script("bench/bench_torch_dropin.py", "--calls", "50", "--rounds", "1", timeout=300)
    for case in ("hit bhsd", "hit bshd", "op (custom op) bhsd", "fallback bhsd fp32", "class decode kv129-256"):
        assert case in out.stdout, out.stdout
    # A padded class's hit on a cuDNN without override, against exact hits, with what it copies.
    copied = re.search(r"padded decode kv129-256: (\d+) KiB copied a call", out.stdout)
    assert copied is not None, out.stdout
    # k and v of 8 heads x d64 bf16, 129..256 rows each: between the shortest's and the longest's 2 x 8 x n x 128 B.
    assert 2 * 8 * 129 * 128 / 1024 <= int(copied[1]) <= 2 * 8 * 256 * 128 / 1024
    assert "class run: graphs 2, call shapes served 384" in out.stdout, out.stdout
    for case in ("bias decode bool b1ss", "bias decode float 1hss", "bias q128 bool b1ss"):
        assert case in out.stdout, out.stdout
    assert "fallbacks {'dtype': " in out.stdout and "'mask'" not in out.stdout, "masked calls are bias-graph hits"
    for case in ("aten bhsd", "aten bshd"):  # the aten door's hit beside patch()'s (issue 42)
        assert case in out.stdout, out.stdout
    assert "by door: sdpa " in out.stdout and "aten " in out.stdout, out.stdout


@pytest.mark.torch
def test_bench_classes_dry_run_times_exact_padded_and_override_calls():
    pytest.importorskip("torch", reason="the class benchmark needs torch")
    out = run_script("gpu/bench_classes_gpu.py", "--compiler", "reference", "--repeat", "3", timeout=300)
    assert "target reference-sm00-cudnn0.0.0-fe0.0.0" in out.stdout
    header = next(line for line in out.stdout.splitlines() if line.startswith("call "))
    assert header.split() == ["call", "class", "exact", "padded", "padded", "in", "place", "override"]
    decode = next(line for line in out.stdout.splitlines() if line.startswith("b3 h8/2 s1/200"))
    assert "KiB copied" in decode and "n/a" not in decode, "every way ran; the padded one copied"


@pytest.mark.torch
def test_bench_varlen_runs_and_reports_every_case():
    pytest.importorskip("torch", reason="the varlen benchmark needs torch")
    out = run_script("bench/bench_varlen.py", "--calls", "20", "--rounds", "1", timeout=300)
    for kind in ("offsets", "hit", "memo"):
        for case in ("paged decode n20", "ragged prefill n5"):
            assert f"{kind} {case}" in out.stdout, out.stdout
    assert "fallbacks {}" in out.stdout, out.stdout


def test_the_hardening_probe_of_held_bodies_runs_and_reports_the_put():
    out = run_script("probes/hardening_probe.py", "--only", "held", "--held", "20", timeout=120)
    for framing in ("Content-Length: 1048576", "chunked"):
        assert f"20 held POST / bodies ({framing}), no token: authenticated PUT 201, GET 200, batch 200" in out.stdout


@pytest.mark.torch
def test_the_generate_benchmarks_cpu_dry_run_times_plain_torch_patch_and_install_over_a_warmed_store(tmp_path):
    """scripts/gpu/gpu_generate.py (issue 43, question 3) on the reference
    compiler: the warming process built the graphs, so the timed runs build
    none, and every attention call of patch()'s run is a hit."""
    pytest.importorskip("transformers", reason="the generate benchmark runs a tiny transformers Llama")
    import importlib.util
    import json

    import graphcache.torch as gt

    loaded = importlib.util.spec_from_file_location("gpu_generate", ROOT / "scripts" / "gpu" / "gpu_generate.py")
    script = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(script)
    report = tmp_path / "generate.json"
    try:  # in this process (its warming process is its own): one interpreter start fewer
        args = ["--cpu-dry-run", "--new-tokens", "3", "--json", str(report), "--cache-dir", str(tmp_path)]
        assert script.main(args) == 0
    finally:
        gt.reset()
    data = json.loads(report.read_text())
    assert data["warm"]["builds"] >= 1
    runs = {r["run"]: r for r in data["runs"]}
    assert list(runs) == ["plain torch", "patch()", "install()"]
    assert runs["patch()"]["graphs_built"] == 0 and runs["patch()"]["hits"] == 3 * 2  # 3 tokens x 2 layers
    assert runs["patch()"]["fallbacks"] == {} and runs["patch()"]["agree"] == 3
    assert sum(runs["plain torch"]["backends_by_shape"].values()) == 3, "prefill and 2 decode steps: 3 shapes"


def test_the_kinds_table_runs_the_rows_asked_for_and_names_an_unknown_one():
    out = run_script("gpu/gpu_kinds.py", "--only", "bias-fp32,bias-q>kv", timeout=120)
    rows = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("bias")]
    assert rows == ["bias-fp32:", "bias-q>kv:", "bias-fp32", "bias-q>kv"], out.stdout
    assert "bias(b1ss,fp32)" in out.stdout and "s512/128" in out.stdout
    wrong = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "gpu_kinds.py"), "--only", "biass"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert wrong.returncode == 2 and "no kind biass" in wrong.stderr


@pytest.mark.torch
def test_the_library_probes_of_trust_round_five_run_and_report():
    pytest.importorskip("torch", reason="the library's probes need torch")
    out = run_script("probes/hardening_probe.py", "--only", "race", "--seconds", "2", timeout=300)
    assert "install/uninstall cycles" in out.stdout and "errors {}" in out.stdout, out.stdout
    assert "race: exit 0" in out.stdout, out.stdout
    out = run_script("probes/hardening_probe.py", "--only", "strides", "--calls", "40", timeout=300)
    assert "40 calls differing only in size-1 strides: 1 graph(s) stored, 1 built" in out.stdout, out.stdout


# -- where the scripts are -------------------------------------------------------------------------

# Every place a path to a script is written for a reader to copy or a program to follow.
NAMING = (
    "README.md", "mkdocs.yml", "pyproject.toml", ".dockerignore", ".ci/run", "docker/*", "requirements/*",
    "docs/**/*.md", "scripts/**/*.py", "scripts/**/*.sh", "tests/**/*.py", "graphcache/**/*.py", "service/**/*.py",
)  # fmt: skip
# A path to a script as written from the repository's root; one under another tree (/tmp/base/...) is not.
SCRIPT_PATH = re.compile(r"(?<![\w/.$-])scripts/[\w/.-]*?\w\.(?:py|sh)\b")
# A block that checks out another commit runs that commit's scripts, where they were in it.
OTHER_TREE = re.compile(r"\bgit (?:archive|worktree add)\b")


def named_script_paths() -> list[tuple[str, str]]:
    """(file, path) for each script path the repository names."""
    named = []
    for pattern in NAMING:
        for file in sorted(ROOT.glob(pattern)):
            if not file.is_file() or ".venv" in file.parts:
                continue
            text = file.read_text(encoding="utf-8")
            if file.suffix == ".md":
                for block in blocks(file):
                    if OTHER_TREE.search(block.text):
                        text = text.replace(block.text, "", 1)
            named += [(str(file.relative_to(ROOT)), m.group()) for m in SCRIPT_PATH.finditer(text)]
    return named


def test_every_script_path_the_repository_names_leads_to_the_script():
    named = named_script_paths()
    assert len({path for _, path in named}) >= 25, "the scan finds the paths the docs and tests give"
    missing = sorted({f"{file}: {path}" for file, path in named if not (ROOT / path).is_file()})
    assert not missing, "no such script (moved? follow it):\n" + "\n".join(missing)


def test_contributing_lists_every_script_in_the_table_of_its_folder():
    page = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = page.split("\n## The scripts, by purpose\n", 1)[1].split("\n## ", 1)[0]
    # "**`scripts/bench/`: ...**" then its table's rows: "| `bench_store.py` | what it is for | run it |"
    listed = set()
    for folder, body in re.findall(r"^\*\*`scripts/(\w+)/`:(.*?)(?=^\*\*`scripts/|\Z)", section, re.M | re.S):
        for name in re.findall(r"^\| `([\w.]+)` \|[^|\n]+\| `[^`]+`", body, re.M):
            listed.add(f"{folder}/{name}")
    on_disk = {
        str(p.relative_to(ROOT / "scripts")) for p in (ROOT / "scripts").glob("*/*") if p.suffix in (".py", ".sh")
    }
    assert listed == on_disk, f"not listed: {sorted(on_disk - listed)}; listed, not there: {sorted(listed - on_disk)}"
    # At the top: the suite's own entry point (the README and .ci/run call it there), and the paths
    # instructions outside the repository name, each only running the script of its name in a folder.
    top = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file())
    kept = sorted(FORWARDS)
    assert top == sorted(["test.sh", *kept]), (
        f"put {sorted(set(top) - {'test.sh', *kept})} in the folder of its purpose"
    )
    for name in ("test.sh", *kept):
        assert f"`scripts/{name}`" in section, f"{name} is explained in contributing's scripts section"


# The old paths kept at scripts/'s top level, and the script each one runs.
FORWARDS = {
    "gpu_check.sh": "gpu/gpu_check.sh",
    "hardening_probe.py": "probes/hardening_probe.py",
    "bench_classes_gpu.py": "gpu/bench_classes_gpu.py",
}


@pytest.mark.parametrize("name", sorted(FORWARDS))
def test_an_old_top_level_script_path_runs_the_moved_script_with_the_same_arguments(name, tmp_path):
    # A script that records what it was called with stands in for the moved one, in a copy of scripts/.
    scripts = tmp_path / "scripts"
    (scripts / FORWARDS[name]).parent.mkdir(parents=True)
    (scripts / name).write_bytes((ROOT / "scripts" / name).read_bytes())
    record = tmp_path / "called"
    if name.endswith(".sh"):
        (scripts / FORWARDS[name]).write_text(f'echo "$0 $*" > {record}\n')
        cmd = ["bash", str(scripts / name), "out dir", "--x"]
    else:
        (scripts / FORWARDS[name]).write_text(f"import sys; open({str(record)!r}, 'w').write(' '.join(sys.argv))\n")
        cmd = [sys.executable, str(scripts / name), "out dir", "--x"]
    subprocess.run(cmd, check=True, timeout=60, cwd=tmp_path)
    called = record.read_text().strip()
    assert called.endswith(f"{FORWARDS[name]} out dir --x"), called
