"""The generated parts of docs/api.md, docs/cli.md and the CLI's pages by
verb group (docs/cli/) are what the code generates today
(scripts/tools/docs_pages.py): the app's OpenAPI schema and the CLI's help."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from scripts.tools import docs_pages
from tests.docs_examples import ROOT, example


@pytest.mark.parametrize("name", sorted(docs_pages.PAGES))
def test_the_committed_page_is_what_the_code_generates(name):
    path, committed, generated = docs_pages.generated(name)
    assert committed == generated, f"{path.relative_to(ROOT)} is out of date: run python scripts/tools/docs_pages.py"


def test_the_api_reference_names_every_route_the_app_serves():
    schema = docs_pages.openapi()
    page = (ROOT / "docs" / "api.md").read_text()
    routes = [f"`{method.upper()} {path}`" for path, ops in schema["paths"].items() for method in ops]
    assert len(routes) >= 15
    assert [r for r in routes if r not in page] == []


def test_the_cli_reference_holds_every_verb_once_on_the_page_its_index_names():
    from graphcache.cli import main

    index = (ROOT / "docs" / "cli.md").read_text()
    pages = {p.stem: p.read_text() for p in (ROOT / "docs" / "cli").glob("*.md")}
    assert sorted(pages) == sorted(docs_pages.CLI_GROUPS)
    for verb in main.commands:
        holding = [name for name, text in pages.items() if f"## `graphcache {verb}`" in text]
        assert len(holding) == 1, (verb, holding)
        assert re.search(rf"\(cli/{holding[0]}\.md\) \|[^\n]*`{verb}`", index), (
            f"docs/cli.md does not send {verb} to cli/{holding[0]}.md"
        )


def test_a_verb_in_a_room_no_cli_page_holds_stops_the_generator(monkeypatch):
    monkeypatch.setitem(docs_pages.CLI_GROUPS, "host", ("this host", {"doctor"}))  # bench's room left out
    with pytest.raises(docs_pages.PageError, match="graphcache bench is in graphcache/cli/bench.py"):
        docs_pages.cli_reference()


def test_a_page_without_its_markers_is_refused():
    with pytest.raises(docs_pages.PageError, match="generated: api"):
        docs_pages.with_part("# A page\n", "api", "text")


def test_the_check_command_the_docs_show_passes():
    (command,) = example("docs-pages-check").commands()
    argv = command.split()
    assert argv[:2] == ["python", "scripts/tools/docs_pages.py"]
    out = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
