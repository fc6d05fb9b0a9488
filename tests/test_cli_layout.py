"""The CLI's rooms keep the import rules docs/architecture.md gives them: a
verb module imports ``graphcache.cli.common`` and never another verb module,
nothing else in graphcache/ or service/ imports the CLI, and ``serve`` is the
only verb that imports service/. Read from the source (every import, at the
top or inside a function), so a verb that starts importing another shows up
here before it becomes a cycle or drags the server into ``graphcache ls``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
CLI = ROOT / "graphcache" / "cli"
VERB_MODULES = ["bench", "deploy", "doctor", "launch", "manifest", "serve", "store"]


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, as dotted names (``from a import b`` gives a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def cli_modules(names: set[str]) -> set[str]:
    """The CLI modules among ``names``: graphcache.cli.common.Context counts as graphcache.cli.common."""
    return {".".join(n.split(".")[:3]) for n in names if n == "graphcache.cli" or n.startswith("graphcache.cli.")}


def test_the_verb_modules_are_the_package():
    found = sorted(p.stem for p in CLI.glob("*.py") if p.stem not in {"__init__", "__main__", "common"})
    assert found == VERB_MODULES


@pytest.mark.parametrize("verb", VERB_MODULES)
def test_a_verb_module_imports_common_and_no_other_verb(verb):
    assert cli_modules(imported(CLI / f"{verb}.py")) == {"graphcache.cli.common"}


def test_common_imports_no_verb():
    assert cli_modules(imported(CLI / "common.py")) == set()


def test_nothing_outside_the_cli_imports_it():
    importers = [
        str(p.relative_to(ROOT))
        for top in ("graphcache", "service")
        for p in (ROOT / top).rglob("*.py")
        if CLI not in p.parents and cli_modules(imported(p))
    ]
    # python -m graphcache is the CLI's other door.
    assert importers == ["graphcache/__main__.py"]


@pytest.mark.parametrize("module", ["common", *VERB_MODULES])
def test_serve_is_the_only_verb_that_imports_the_service(module):
    service = {n for n in imported(CLI / f"{module}.py") if n == "service" or n.startswith("service.")}
    assert bool(service) == (module == "serve"), service


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.name)
def test_every_cli_module_stays_a_room(path):
    assert len(path.read_text().splitlines()) <= 400
