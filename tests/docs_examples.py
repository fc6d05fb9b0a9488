"""The code blocks of README.md and the docs site's pages, each with the
marker written before it (docs/contributing.md):

    <!-- example: run NAME -->   a test runs it: example("NAME") in tests/
    <!-- example: gpu -->        it needs a GPU host (cuDNN, CUDA tensors)
    <!-- example: fleet -->      it needs a deployment (a service other hosts reach, Redis, docker)
    <!-- example: bench -->      a measurement: minutes on a quiet machine, other trees, nginx
    <!-- example: ci -->         what CI itself runs (scripts/test.sh and the tests it names)
    <!-- example: network -->    it fetches from the internet (scripts/tools/lock.sh: PyPI, PyTorch's index)

tests/test_docs.py holds every shell and Python block to one of these;
the tests that run a block take its text from here, so what runs is what
the page says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Info strings of blocks a reader would run; every other fenced block says
# what it is (text for output and pictures, yaml, json).
RUNNABLE = {"sh", "bash", "shell", "console", "python", "py", "pycon"}
MARKER = re.compile(
    r"^<!--\s*example:\s*(?:(?P<run>run)\s+(?P<name>[a-z0-9][a-z0-9-]*)|(?P<needs>gpu|fleet|bench|ci|network))\s*-->$"
)
ANY_MARKER = re.compile(r"<!--\s*example:")


@dataclass(frozen=True)
class Block:
    """One code block of a page."""

    page: Path
    line: int  # 1-based line of its opening fence
    lang: str  # the info string's first word; "" for none, "indented" for an indented block
    text: str
    marker: str | None  # the marker line before it, as written
    name: str | None  # NAME of "run NAME"
    needs: str | None  # "gpu", "fleet", "bench", "ci" or "network"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE

    def commands(self) -> list[str]:
        """The block's shell commands: continuation lines joined, blank and comment-only lines left out."""
        commands, current = [], ""
        for line in self.text.splitlines():
            stripped = line.strip()
            if stripped.endswith("\\"):
                current += stripped[:-1].strip() + " "
                continue
            current += stripped
            if current and not current.startswith("#"):
                commands.append(current)
            current = ""
        return commands


def blocks(page: Path) -> list[Block]:
    """The code blocks of ``page``, fenced and indented, in order."""
    source = page.read_text()
    lines = source.splitlines()
    found = []
    for token in MarkdownIt("commonmark").parse(source):
        if token.type not in ("fence", "code_block") or token.map is None:
            continue
        start = token.map[0]
        before = next((lines[i].strip() for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        marker = before if ANY_MARKER.search(before) else None
        match = MARKER.match(marker or "")
        lang = token.info.split()[0] if token.type == "fence" and token.info.strip() else ""
        found.append(
            Block(
                page=page,
                line=start + 1,
                lang="indented" if token.type == "code_block" else lang,
                text=token.content,
                marker=marker,
                name=match["name"] if match else None,
                needs=match["needs"] if match else None,
            )
        )
    return found


def every_block() -> list[Block]:
    """The code blocks of every page."""
    return [block for page in PAGES for block in blocks(page)]


def example(name: str) -> Block:
    """The one block marked ``<!-- example: run NAME -->``."""
    marked = [block for block in every_block() if block.name == name]
    if len(marked) != 1:
        raise LookupError(f"{len(marked)} blocks are marked 'run {name}': {[b.where for b in marked]}")
    return marked[0]
