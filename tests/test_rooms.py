"""Every module of graphcache/ and service/ stays a room one can read whole:
at most 400 lines (docs/architecture.md). The CLI and cuDNN layout tests hold
their own packages to it; this holds the rest, so a module that grows past it
is split when it grows, not found later."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
LIMIT = 400
MODULES = sorted(p for top in ("graphcache", "service") for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_stays_a_room(path):
    lines = len(path.read_text().splitlines())
    assert lines <= LIMIT, f"{path.relative_to(ROOT)} has {lines} lines (at most {LIMIT}): split it by concern"
