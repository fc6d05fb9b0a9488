"""No two modules of graphcache/ or service/ import each other, directly or
round a longer loop (docs/architecture.md, "Import rules"). Read from the
source, not from a running interpreter: every ``import`` and ``from ... import``
in a file counts, at the top, inside a function, or under
``if TYPE_CHECKING:`` (a type-only import is still one room reading another,
and hiding an import in a function only postpones the circle to run time).
A circle shows up here with its modules named, so it is broken by moving what
both sides need to the lower module, not by moving an import about."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
TOPS = ("graphcache", "service")


def module_name(path: Path) -> str:
    """``graphcache/compilers/cudnn/__init__.py`` -> ``graphcache.compilers.cudnn``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for top in TOPS for p in sorted((ROOT / top).rglob("*.py"))}


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that ``path`` imports, anywhere in it.

    Relative imports are resolved against the module's package; ``from pkg
    import name`` is the submodule ``pkg.name`` where that is a module, else
    ``pkg`` itself; ``import a.b.c`` is ``a.b.c`` (the packages above it run
    too, but a package's ``__init__`` is its own node and counts where it is
    named)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(groups)


def loop_through(group: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One loop inside ``group``, from its first module back to it, to name in the failure."""
    start = group[0]
    members = set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(edges[node] & members):
            if nxt == start:
                return paths[node] + [start]
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return group  # unreachable for a strongly connected group


def test_the_graph_sees_our_imports():
    # The reader itself: a relative import, a submodule imported by name from its package.
    edges = graph()
    assert "graphcache.compilers.cudnn.releases" in edges["graphcache.compilers.cudnn.dialects"]
    assert "graphcache.spec" in edges["graphcache.key"]


def test_circles_are_found_and_named():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert loop_through(["a", "b", "c"], edges) == ["a", "b", "c", "a"]


def test_no_module_imports_itself_round_a_circle():
    edges = graph()
    found = [f"{', '.join(group)} (one loop: {' -> '.join(loop_through(group, edges))})" for group in circles(edges)]
    assert not found, "import circles (move what both sides need to the lower module):\n" + "\n".join(found)


def test_the_reference_imports_no_compiler():
    # The yardstick never depends on what it measures (docs/architecture.md,
    # "The reference"): nothing graphcache.reference reaches, directly or
    # through another module, is a compiler.
    edges = graph()
    reached = {m for m in edges if m == "graphcache.reference" or m.startswith("graphcache.reference.")}
    todo = list(reached)
    while todo:
        for nxt in edges[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    assert sorted(m for m in reached if m.startswith("graphcache.compilers")) == []
