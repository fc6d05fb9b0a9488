"""Write the generated parts of the docs: docs/api.md's reference from the
app's own OpenAPI schema, the CLI's from its own help: docs/cli.md (the
top-level help and where each verb is) and one page per verb group under
docs/cli/ (each verb's help), so that no page outgrows a reader.

    python scripts/tools/docs_pages.py            # rewrite every generated part in place
    python scripts/tools/docs_pages.py --check    # exit 1 naming the pages that differ

Each page keeps its hand-written text; only what lies between
``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` is written
here. tests/test_docs_pages.py holds the committed pages to what this
generates.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout: this tree's graphcache and service

# FastAPI's own request-validation bodies: every 422 of ours is an ErrorBody.
FRAMEWORK_SCHEMAS = {"HTTPValidationError", "ValidationError"}
HELP_WIDTH = 88


class PageError(Exception):
    """A page lacks the markers of its generated part."""


# -- the HTTP API ----------------------------------------------------------------------


def openapi() -> dict[str, Any]:
    """The schema the service serves at /openapi.json (on an empty store)."""
    from graphcache.settings import Settings
    from graphcache.stores import DiskStore
    from service.app import create_app

    with tempfile.TemporaryDirectory() as folder:
        store = DiskStore(Path(folder) / "store")
        schema = create_app(Settings(cache_dir=Path(folder)), store=store).openapi()
        store.close()
    return schema


def type_of(schema: dict[str, Any]) -> str:
    """A schema's type as the reference writes it: `string`, `integer (1-1000)`, [`ErrorBody`](#errorbody)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"`{name}` (FastAPI's)" if name in FRAMEWORK_SCHEMAS else f"[`{name}`](#{name.lower()})"
    if "anyOf" in schema:
        kinds = [type_of(s) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(kinds) + (" or null" if nullable else "")
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        kind = f"array of {type_of(schema.get('items', {}))}"
    bounds = [
        f"{label} {schema[key]:g}"
        for key, label in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
            ("multipleOf", "multiple of"),
            ("minItems", "items >="),
            ("maxItems", "items <="),
            ("maxLength", "length <="),
        )
        if key in schema
    ]
    if "pattern" in schema:
        bounds.append(f"pattern `{schema['pattern']}`")
    if "default" in schema:
        bounds.append(f"default `{json.dumps(schema['default'])}`")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def cell(text: str) -> str:
    """Text fit for one table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def fields(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str, bool, str]]:
    """(name, type, required, description) of each property, nested objects' as ``outer.inner``."""
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        yield (
            prefix + name,
            type_of(prop) if "properties" not in prop else "object",
            name in required,
            prop.get("description", ""),
        )
        if "properties" in prop:
            yield from fields(prop, f"{prefix}{name}.")


def api_reference(schema: dict[str, Any]) -> str:
    """The routes and the body schemas of ``schema``, as Markdown."""
    out: list[str] = ["### Routes", ""]
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            out += [f"#### `{method.upper()} {path}`", "", op.get("summary", "").strip(), ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
                for p in params:
                    required = "yes" if p.get("required") else "no"
                    kind = type_of(p.get("schema", {}))
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {cell(kind)} | {required} | {cell(p.get('description', ''))} |"
                    )
                out.append("")
            body = op.get("requestBody")
            if body:
                kinds = ", ".join(
                    f"`{media}`" + (f": {type_of(c['schema'])}" if c.get("schema") else "")
                    for media, c in body.get("content", {}).items()
                )
                out += [f"Body ({'required' if body.get('required') else 'optional'}): {kinds}", ""]
            out += ["| status | answer |", "| --- | --- |"]
            for status, answer in op.get("responses", {}).items():
                shapes = [
                    f"`{media}`" + (f" {type_of(c['schema'])}" if c.get("schema") else "")
                    for media, c in answer.get("content", {}).items()
                ]
                text = cell(answer.get("description", ""))
                out.append(f"| {status} | {text}{': ' + ', '.join(shapes) if shapes else ''} |")
            out.append("")
    out += ["### Bodies", ""]
    for name, body in schema.get("components", {}).get("schemas", {}).items():
        if name in FRAMEWORK_SCHEMAS:
            continue
        out += [f"#### {name}", ""]
        if body.get("description"):
            out += [" ".join(body["description"].split()), ""]
        rows = list(fields(body))
        if rows:
            out += ["| field | type | required | description |", "| --- | --- | --- | --- |"]
            out += [f"| `{n}` | {cell(t)} | {'yes' if r else 'no'} | {cell(d)} |" for n, t, r, d in rows]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


# -- the CLI ---------------------------------------------------------------------------


# The CLI's reference pages under docs/cli/, by verb group: the page's name,
# what its verbs are about, and the rooms of graphcache/cli/ whose verbs it
# holds. A verb in a room no group names stops the generator (PageError).
CLI_GROUPS: dict[str, tuple[str, set[str]]] = {
    "store": ("what is stored", {"store"}),
    "deploy": ("deploys and the service", {"deploy", "serve"}),
    "models": ("what a model calls", {"manifest", "launch"}),
    "host": ("this host", {"doctor", "bench"}),
}


def cli_helps() -> tuple[str, dict[str, tuple[str, str]]]:
    """`graphcache --help`, and each verb's (room, help), at a fixed width."""
    import click

    from graphcache.cli import main

    def help_of(command: click.Command, parent: click.Context | None) -> tuple[str, click.Context]:
        name = "graphcache" if parent is None else command.name
        ctx = command.make_context(
            name, [], parent=parent, resilient_parsing=True, terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH
        )
        return ctx.get_help(), ctx

    top, root = help_of(main, None)
    assert isinstance(main, click.Group)
    verbs = {}
    for verb in sorted(main.list_commands(root)):
        command = main.get_command(root, verb)
        assert command is not None and command.callback is not None
        verbs[verb] = (command.callback.__module__.rsplit(".", 1)[-1], help_of(command, root)[0])
    return top, verbs


def cli_group_of(room: str, verb: str) -> str:
    """The docs/cli/ page that holds the verbs of ``room``."""
    for name, (_, rooms) in CLI_GROUPS.items():
        if room in rooms:
            return name
    raise PageError(
        f"graphcache {verb} is in graphcache/cli/{room}.py, which no page of CLI_GROUPS holds: add it there"
    )


def cli_reference() -> str:
    """docs/cli.md's part: `graphcache --help`, and the page of each verb group."""
    top, verbs = cli_helps()
    out = ["### `graphcache`", "", "```text", top, "```", "", "| page | verbs |", "| --- | --- |"]
    for name, (about, _) in CLI_GROUPS.items():
        held = [f"`{verb}`" for verb, (room, _) in verbs.items() if cli_group_of(room, verb) == name]
        out.append(f"| [{about}](cli/{name}.md) | {', '.join(held)} |")
    return "\n".join(out).rstrip() + "\n"


def cli_group(name: str) -> str:
    """docs/cli/NAME.md's part: the help of each verb of that group."""
    out: list[str] = []
    for verb, (room, text) in cli_helps()[1].items():
        if cli_group_of(room, verb) == name:
            out += [f"## `graphcache {verb}`", "", "```text", text, "```", ""]
    return "\n".join(out).rstrip() + "\n"


# -- pages -----------------------------------------------------------------------------

PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "api": ("docs/api.md", lambda: api_reference(openapi())),
    "cli": ("docs/cli.md", cli_reference),
    **{f"cli-{name}": (f"docs/cli/{name}.md", lambda name=name: cli_group(name)) for name in CLI_GROUPS},
}


def with_part(page: str, name: str, part: str) -> str:
    """``page`` with its generated part ``name`` replaced by ``part``."""
    begin, end = f"<!-- generated: {name} -->\n", f"<!-- end generated: {name} -->"
    found = re.search(re.escape(begin) + r".*?" + re.escape(end), page, re.S)
    if not found:
        raise PageError(f"the page has no {begin.strip()} ... {end} markers")
    return page[: found.start()] + begin + "\n" + part + "\n" + end + page[found.end() :]


def generated(name: str) -> tuple[Path, str, str]:
    """(path, text committed, text generated) of page ``name``."""
    relative, make = PAGES[name]
    path = ROOT / relative
    text = path.read_text()
    return path, text, with_part(text, name, make())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which pages differ (exit 1)")
    args = parser.parse_args(argv)
    stale = []
    for name in PAGES:
        path, now, want = generated(name)
        if now == want:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(want)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date (run python scripts/tools/docs_pages.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
