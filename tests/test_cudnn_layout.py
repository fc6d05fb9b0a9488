"""The cuDNN compiler's rooms keep the import rules docs/architecture.md
gives them ("The cuDNN compiler"): read from the source, every import at the
top or inside a function, so a room that starts reaching into another shows
up here before it becomes a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "graphcache" / "compilers" / "cudnn"
PREFIX = "graphcache.compilers.cudnn."
# The rooms of the package each module may import (docs/architecture.md).
MAY_IMPORT = {
    "release_rows": set(),
    "releases": {"release_rows"},
    "dialects": {"releases"},
    "graph": {"releases", "ragged"},
    "ragged": {"releases"},
    "failures": set(),
    "build": {"dialects", "failures", "graph", "releases"},
    "serialize": {"failures", "releases"},
    "planapi": set(),  # what the loaded plan and its compiler offer, as Protocols (loaded imports the rest)
    "override": {"planapi", "releases"},
    "padded": {"override", "planapi"},  # classes without override
    "loaded": {"override", "padded", "planapi", "ragged"},  # the compiler's type: planapi.Loader
    "backward": {"loaded", "override", "planapi", "releases"},  # SDPA backward graphs: gate, execute, check
    "compiler": {"backward", "build", "failures", "loaded", "override", "padded", "ragged", "releases", "serialize"},
}


def rooms(path: Path) -> set[str]:
    """The package's modules that ``path`` imports (``import`` or ``from``, anywhere in it)."""
    nodes = list(ast.walk(ast.parse(path.read_text(), str(path))))
    names = [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module]
    return {name[len(PREFIX) :].split(".")[0] for name in names if name.startswith(PREFIX)}


def test_the_rooms_are_the_package():
    found = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    # A new room says what it may import: here and in docs/architecture.md's table.
    assert found == sorted(MAY_IMPORT), "add the new room to MAY_IMPORT and to docs/architecture.md"


@pytest.mark.parametrize("module", sorted(MAY_IMPORT))
def test_a_room_imports_only_what_it_may(module):
    assert rooms(PACKAGE / f"{module}.py") <= MAY_IMPORT[module]


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_every_room_stays_small(path):
    assert len(path.read_text().splitlines()) <= 400
