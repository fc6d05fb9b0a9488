"""Every import the README and the docs show works (issue 34), and the
modules that moved into a wing keep their old paths, as the same module;
graphcache.torch's public names and old module paths, grouped by door."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import graphcache

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
STATEMENT = r"(from graphcache[\w.]* import [\w, ]+|import graphcache[\w.]*(?: as \w+)?)"
# In a code block (a line of its own) or inline (`from graphcache.spec import GraphSpec`).
IMPORT = re.compile(rf"^\s*{STATEMENT}\s*(?:#.*)?$|`{STATEMENT}`", re.M)
# What users' scripts are known to write, documented or not (issue 34).
KNOWN = [
    "from graphcache.spec import GraphSpec",
    "from graphcache import ops, manifest",
    "from graphcache import GraphCache",
]


def documented() -> list[str]:
    """The import statements written in the README and the docs."""
    found = {
        (m.group(1) or m.group(2)).strip().rstrip(",") for page in PAGES for m in IMPORT.finditer(page.read_text())
    }
    return sorted(found | set(KNOWN))


def test_the_docs_show_imports():
    assert len(documented()) >= 8, documented()


@pytest.mark.parametrize("statement", documented())
def test_each_documented_import_works(statement):
    pytest.importorskip("torch", reason="some documented imports are graphcache.torch's")
    exec(statement, {})  # noqa: S102 - the statement is the docs' own


@pytest.mark.parametrize(("old", "new"), sorted(graphcache.MOVED.items()))
def test_a_moved_module_keeps_its_old_path(old, new):
    if old.startswith("graphcache.torch."):
        pytest.importorskip("torch")
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_top_floor_holds_at_most_23_entries():
    entries = [
        p.name for p in (ROOT / "graphcache").iterdir() if p.name != "__pycache__" and not p.name.startswith(".")
    ]
    assert len(entries) <= 23, sorted(entries)


# graphcache.torch's public names, as users' code writes them: the package's exports and sdpa_backward.
TORCH_NAMES = [
    "ON_MISS",
    "ON_MISS_VAR",
    "Installation",
    "RUNTIME",
    "Recorder",
    "UnsupportedCall",
    "configure",
    "disable",
    "enable",
    "enabled",
    "install",
    "kernels",
    "patch",
    "record",
    "reset",
    "scaled_dot_product_attention",
    "spec_for",
    "stats",
    "summary",
    "uninstall",
    "varlen_attn",
]
# Names users and scripts import from the modules that became a door's package.
DOOR_NAMES = {
    "graphcache.torch.backward": ["sdpa_backward"],
    "graphcache.torch.varlen": ["varlen_attn", "TORCH_VARLEN", "fallback", "MEMO_LIMIT"],
    "graphcache.torch.aten": ["FORWARD", "BACKWARD", "forward", "backward", "aten_math"],
    "graphcache.torch.recording": ["Recorder", "record", "run_script"],
}
# graphcache.torch's modules before the doors had packages, each still importable as the same module.
TORCH_OLD_PATHS = [
    f"graphcache.torch.{name}"
    for name in (
        "aten_math aten_plan bias counts derive door doors guard onmiss patching plan recording_text runtime "
        "varlen_derive varlen_torch"
    ).split()
]


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_each_public_torch_name_is_exported(name):
    gt = pytest.importorskip("graphcache.torch")
    assert name in gt.__all__ or name == "RUNTIME"
    assert getattr(gt, name) is not None


@pytest.mark.parametrize(("module", "names"), sorted(DOOR_NAMES.items()))
def test_a_module_that_became_a_doors_package_keeps_its_names(module, names):
    pytest.importorskip("torch")
    found = importlib.import_module(module)
    assert [n for n in names if not hasattr(found, n)] == []


@pytest.mark.parametrize("old", TORCH_OLD_PATHS)
def test_an_old_torch_module_path_is_the_module_at_its_new_place(old):
    pytest.importorskip("torch")
    assert old in graphcache.MOVED, f"{old} is not in graphcache.MOVED"
    assert importlib.import_module(old) is importlib.import_module(graphcache.MOVED[old])


def test_an_old_torch_module_name_is_an_attribute_of_graphcache_torch_as_it_was():
    # In a fresh interpreter: importing an old path here would make the attribute whatever the package does.
    pytest.importorskip("torch")
    script = (
        "import sys, graphcache, graphcache.torch as gt\n"
        f"old = {TORCH_OLD_PATHS!r}\n"
        "print([n for n in old if getattr(gt, n.rpartition('.')[2], None) is not sys.modules[graphcache.MOVED[n]]])"
    )
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


def test_the_torch_edge_holds_at_most_10_entries_one_package_per_door():
    entries = sorted(
        p.name
        for p in (ROOT / "graphcache" / "torch").iterdir()
        if p.name != "__pycache__" and not p.name.startswith(".")
    )
    assert len(entries) <= 10, entries
    doors = {"sdpa", "aten", "varlen", "backward", "core", "recording"}
    assert [d for d in sorted(doors) if not (ROOT / "graphcache" / "torch" / d / "__init__.py").is_file()] == []
