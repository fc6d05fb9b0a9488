"""Every import the README and the docs show works (issue 34), and the
modules that moved into a wing keep their old paths, as the same module."""

from __future__ import annotations

import importlib
import re
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
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_top_floor_holds_at_most_23_entries():
    entries = [
        p.name for p in (ROOT / "graphcache").iterdir() if p.name != "__pycache__" and not p.name.startswith(".")
    ]
    assert len(entries) <= 23, sorted(entries)
