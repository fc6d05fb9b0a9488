"""The names a README gives a user: CLI verbs, options, HTTP routes and
environment variables, one per line as ``KIND NAME``.

    python scripts/tools/readme_names.py 674c519 > tests/data/readme-674c519-names.txt

reads README.md as it was at that commit (``git show``); with no commit, the
README of the work tree. tests/test_docs.py checks that every name the file
lists is still in the docs site's pages, so that moving the guides out of
the README (issue 34) lost none of them; the file is committed because a CI
clone has no history.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METHODS = "GET|HEAD|POST|PUT|DELETE"
ROUTE = re.compile(rf"`({METHODS}) (/[^`\s?]*)")
PATH = re.compile(r"`(/(?:v1/[a-z/{}]+|docs|openapi\.json|healthz|metrics))[`?]")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
ENV = re.compile(r"\b(GRAPHCACHE_[A-Z0-9_]*[A-Z0-9])\b")
# "graphcache warm", a CLI table's "`warm MANIFEST", "`get KEY", "`purge [".
VERB = re.compile(r"\bgraphcache ([a-z]+)\b|`([a-z]+)(?: [A-Z\[]|`)")


def readme(commit: str | None) -> str:
    """README.md at ``commit`` (git show), or the work tree's."""
    if commit is None:
        return (ROOT / "README.md").read_text()
    return subprocess.run(
        ["git", "show", f"{commit}:README.md"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def names(text: str) -> list[tuple[str, str]]:
    """(kind, name) of each verb, option, route and variable ``text`` names, sorted."""
    from graphcache.cli import main

    verbs = set(main.commands)  # a word after "graphcache " that is no verb (a module path) is not one
    found: set[tuple[str, str]] = set()
    found |= {("verb", v) for groups in VERB.findall(text) for v in groups if v in verbs}
    found |= {("option", o) for o in OPTION.findall(text)}
    found |= {("route", f"{m} {p}") for m, p in ROUTE.findall(text)}
    found |= {("path", p) for p in PATH.findall(text)}
    found |= {("env", e) for e in ENV.findall(text)}
    return sorted(found)


def main(argv: list[str]) -> int:
    commit = argv[0] if argv else None
    where = f"README.md at {commit}" if commit else "README.md"
    print(f"# The names {where} gave a user (scripts/tools/readme_names.py {commit or ''}).".replace(" )", ")"))
    print("# tests/test_docs.py checks that the docs site's pages still name each one.")
    for kind, name in names(readme(commit)):
        print(f"{kind} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
