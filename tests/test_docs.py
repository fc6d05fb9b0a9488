"""The docs as a newcomer meets them (issue 34): the README is a front door,
every shell and Python example either runs in a test or says what it needs
(docs/contributing.md), the README's links reach their pages, and every name
the README gave a user before the guides moved out is still in the site."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tests.docs_examples import ANY_MARKER, MARKER, PAGES, ROOT, Block, every_block

README = ROOT / "README.md"
SITE = sorted((ROOT / "docs").rglob("*.md"))
OLD_NAMES = Path(__file__).parent / "data" / "readme-674c519-names.txt"


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move a guide to docs/"
    headings = [line[3:] for line in lines if line.startswith("## ")]
    for section in ("Install", "The two commands", "Try it without a GPU", "A worker in ten lines"):
        assert section in headings, headings
    assert any(h.startswith("The CLI") for h in headings) and any(h.startswith("Where each guide") for h in headings)


def test_no_page_of_the_site_is_over_500_lines():
    """A page a reader can hold: a longer one is split by subject (generated pages too)."""
    long = {str(p.relative_to(ROOT)): n for p in SITE if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"split these by subject (docs/contributing.md): {long}"


# Our own issue numbers ("issue 18", "(issues 17-20)", "#33"); an upstream one
# names its repository (cudnn-frontend#1087, pytorch#155958) and stays.
OWN_ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w.-])#\d+\b", re.IGNORECASE)


def test_no_page_names_one_of_our_issues():
    """Pages say what is true now: an issue number means nothing to a reader, and history is git's."""
    found = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)}"
        for page in [README, *SITE]
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in OWN_ISSUE.finditer(line)
    ]
    assert not found, f"say what is true now instead: {found}"


def test_every_code_block_is_fenced_and_names_its_language():
    unnamed = [b.where for b in every_block() if b.lang in ("", "indented")]
    assert not unnamed, f"fence these with a language (sh, python; text for output and pictures): {unnamed}"


def test_every_shell_and_python_example_runs_in_a_test_or_says_what_it_needs():
    unmarked = [b.where for b in every_block() if b.runnable and b.name is None and b.needs is None]
    assert not unmarked, (
        "mark each with <!-- example: run NAME --> and run it in a test (example('NAME')), "
        f"or with gpu, fleet, bench, ci or network (docs/contributing.md): {unmarked}"
    )


def test_every_marker_is_well_formed_and_stands_before_an_example():
    attached = {(b.page, b.marker) for b in every_block() if b.runnable and b.marker}
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if not ANY_MARKER.search(line) or "`" in line:  # a marker quoted in prose is no marker
                continue
            assert MARKER.match(line.strip()), f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
            assert (page, line.strip()) in attached, f"{page.relative_to(ROOT)}:{number}: no example follows"


def source_of_tests() -> str:
    return "".join(path.read_text() for path in sorted(Path(__file__).parent.glob("*.py")))


def test_each_example_marked_run_is_one_block_that_a_test_runs():
    named = [b for b in every_block() if b.name]
    names = [b.name for b in named]
    assert len(names) >= 10, names
    assert len(set(names)) == len(names), f"names used twice: {sorted({n for n in names if names.count(n) > 1})}"
    text = source_of_tests()
    unrun = [f"{b.where} ({b.name})" for b in named if f'example("{b.name}")' not in text]
    assert not unrun, f"no test calls example(NAME) for: {unrun}"


def words(block: Block) -> list[str]:
    return [word for command in block.commands() for word in shlex.split(command, comments=True)]


def test_bench_and_ci_examples_name_scripts_and_tests_that_exist():
    checked = 0
    for block in every_block():
        if block.needs not in ("bench", "ci", "network"):
            continue
        for word in words(block):
            path = word.split("::")[0]
            if re.fullmatch(r"(scripts|tests)/[\w/.-]+\.(py|sh)", path):
                assert (ROOT / path).exists(), f"{block.where}: {path} does not exist"
                checked += 1
    assert checked >= 20


def slug(text: str) -> str:
    """A heading's anchor as mkdocs makes it (Python-Markdown's toc.slugify)."""
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    tokens = MarkdownIt("commonmark").parse(page.read_text())
    return {slug(tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"}


def links(page: Path) -> list[str]:
    found = []
    for token in MarkdownIt("commonmark").parse(page.read_text()):
        for child in token.children or ():
            if child.type == "link_open":
                found.append(str(child.attrs["href"]))
    return found


def test_the_readmes_links_reach_files_and_headings():
    relative = [href for href in links(README) if not re.match(r"[a-z]+:", href)]
    assert len(relative) >= 15, relative
    for href in relative:
        path, _, anchor = href.partition("#")
        target = (README.parent / path) if path else README
        assert target.exists(), f"README links to {href}: no such file"
        if anchor:
            assert anchor in anchors(target), f"README links to {href}: no such heading"


def old_names() -> list[tuple[str, str]]:
    rows = [line.split(" ", 1) for line in OLD_NAMES.read_text().splitlines() if line and not line.startswith("#")]
    return [(kind, name) for kind, name in rows]


def site_text() -> str:
    return "\n".join(page.read_text() for page in SITE)


def test_the_old_readmes_names_were_read():
    kinds = {kind for kind, _ in old_names()}
    assert kinds == {"verb", "option", "route", "path", "env"}
    assert len(old_names()) >= 100


@pytest.mark.parametrize(("kind", "name"), old_names())
def test_every_name_the_old_readme_gave_a_user_is_in_the_docs(kind, name):
    text = site_text()
    if kind == "verb":
        assert f"graphcache {name}" in text, f"the docs never show `graphcache {name}`"
    elif kind == "route":
        assert name in text, f"the docs never name the route {name}"
    else:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"the docs never name {name}"


def strict_build(root: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs", reason="mkdocs is a dev tool (pip install -e '.[dev]')")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(root / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strict(tmp_path):
    out = strict_build(ROOT, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").exists() and (
        tmp_path / "site" / "examples" / "index.html"
    ).exists()


def test_the_strict_build_fails_on_a_broken_anchor(tmp_path):
    """mkdocs checks anchors only where mkdocs.yml's validation says warn: this holds it to that."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy)
    (copy / "scripts" / "tools").mkdir(parents=True)
    # mkdocs.yml's hook: the README page
    shutil.copy(ROOT / "scripts" / "tools" / "mkdocs_readme.py", copy / "scripts" / "tools")
    shutil.copy(ROOT / "README.md", copy)
    with (copy / "docs" / "fleet.md").open("a") as page:
        page.write("\nSee [workers](workers.md#no-such-heading).\n")
    out = strict_build(copy, tmp_path)
    assert out.returncode == 1 and "does not contain an anchor '#no-such-heading'" in out.stderr, out.stderr[-3000:]
