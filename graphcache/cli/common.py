"""What every verb shares: the consoles, the context (settings and the store
--store / --cache-dir name), the root group ``main`` the verbs register on,
the parsing of keys and specs, the tables' units, the progress bar, and the
mapping of every error to one ``error: ...`` line (``run``).

Verb modules import this one and never each other; this module imports no
verb module.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from graphcache.compilers.base import Compiler
from graphcache.compilers.named import HELP as COMPILER_HELP
from graphcache.compilers.named import compiler_named
from graphcache.errors import GraphCacheError, NotFound, SpecError, StoreError, StoreLocationError, StoreUnavailable
from graphcache.key import is_key
from graphcache.settings import Settings
from graphcache.spec import GraphSpec
from graphcache.spec.bounds import shown
from graphcache.stores import Store, disk_folder, open_store
from graphcache.target import Target


def _pipe_width() -> int | None:
    """None on a terminal or with COLUMNS set (Rich then uses that width);
    otherwise wide enough that a table written to a file or a log keeps
    whole target texts and keys (Rich's default there is 80 columns)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    return 400


# Markup off: what is printed holds paths, specs and error texts, and Rich
# would read '[gpu]' or '[/x]' in them as tags (dropping or crashing on them).
# Colour is given explicitly with Text(..., style=...).
console = Console(markup=False, highlight=False, width=_pipe_width())
err_console = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


class Context:
    """The settings and store location one invocation runs with (``ctx.obj``)."""

    def __init__(self, cache_dir: str | None, store: str | None) -> None:
        self.settings = Settings.from_env(cache_dir=Path(cache_dir) if cache_dir else None)
        self.location = store
        self._store: Store | None = None

    def override(self, cache_dir: str | None = None, store: str | None = None) -> None:
        """Options given after the verb win over those before it."""
        if cache_dir is not None:
            self.settings = dataclasses.replace(self.settings, cache_dir=Path(cache_dir))
        if store is not None:
            self.location = store
        self._store = None

    def store(self, *, read_only: bool = False) -> Store:
        """The store --store / --cache-dir name. ``read_only`` verbs (ls, get,
        inspect, rm, pin, explain, purge) refuse a cache folder that does not
        exist, where opening it would create an empty one and answer
        'nothing stored' about a mistyped path."""
        if self._store is None:
            folder = disk_folder(self.settings, self.location)
            if read_only and folder is not None and not folder.is_dir():
                where = "--store" if self.location else "--cache-dir / GRAPHCACHE_DIR"
                raise StoreLocationError(
                    f"no cache folder at {folder} ({where}): nothing is stored there; "
                    "check the path (warm or serve create it)"
                )
            self._store = open_store(self.settings, self.location)
        return self._store


pass_ctx = click.make_pass_decorator(Context)


def _override(field: str) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            ctx.find_object(Context).override(**{field: value})  # type: ignore[union-attr]

    return callback


def store_options(f: Any) -> Any:
    """--cache-dir and --store, accepted after the verb too (graphcache serve --cache-dir DIR)."""
    f = click.option(
        "--store",
        expose_value=False,
        callback=_override("store"),
        is_eager=False,
        help="Store location: a folder, redis://..., or http://server.",
    )(f)
    return click.option(
        "--cache-dir",
        expose_value=False,
        callback=_override("cache_dir"),
        help="DiskStore folder (default: $GRAPHCACHE_DIR, else the user cache folder).",
    )(f)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--cache-dir", envvar=None, help="DiskStore folder (default: $GRAPHCACHE_DIR, else the user cache folder)."
)
@click.option(
    "--store",
    "store",
    default=None,
    help="Store location: a folder, redis://..., or http://server (default: $GRAPHCACHE_STORE).",
)
@click.version_option(package_name="graphcache")
@click.pass_context
def main(ctx: click.Context, cache_dir: str | None, store: str | None) -> None:
    """graphcache: build cuDNN attention graphs once, serve them to every worker."""
    ctx.obj = Context(cache_dir, store)
    if ctx.invoked_subcommand != "serve" and not os.environ.get("GRAPHCACHE_DEBUG"):
        # A verb reports what happened itself (its table, its one error line);
        # the library's warnings are for processes that carry on after them
        # (workers, the server), not a second line before the error.
        logging.getLogger("graphcache").setLevel(logging.ERROR)


# -- helpers ---------------------------------------------------------------------


def compiler_option(f: Any) -> Any:
    """--compiler NAME: the compiler a verb builds with or whose target it names."""
    return click.option(
        "--compiler",
        "compiler_name",
        default=None,
        help=f"Compiler: {COMPILER_HELP} (default: $GRAPHCACHE_COMPILER, else cudnn).",
    )(f)


def compiler_choice(ctx: Context, name: str | None) -> str:
    """The compiler name --compiler gives, else GRAPHCACHE_COMPILER's, else ``cudnn``."""
    return name or ctx.settings.compiler or "cudnn"


def chosen_compiler(ctx: Context, name: str | None) -> Compiler:
    """A new compiler of the ``compiler_choice`` (CompilerNameError for a name that names none)."""
    return compiler_named(compiler_choice(ctx, name), "--compiler" if name else "GRAPHCACHE_COMPILER")


def named_target(ctx: Context, target: str | None, compiler_name: str | None, verb: str) -> Target:
    """The target a verb that needs no GPU works on: --target, else the
    compiler's own where it is not cudnn (the reference compiler's, no GPU
    asked). Raises click.UsageError for cudnn without --target: the serving
    GPUs' target counts there, not whatever this machine has."""
    if target:
        return Target.parse(target)
    if compiler_choice(ctx, compiler_name) != "cudnn":
        return chosen_compiler(ctx, compiler_name).target()
    raise click.UsageError(
        f"{verb} needs --target (the serving GPUs' target, e.g. from 'graphcache doctor'), "
        "or --compiler reference for the reference compiler's"
    )


def resolve_key(store: Store, text: str) -> str:
    """A full key, or a unique prefix (6+ hex characters) of a stored one."""
    text = text.strip().lower()
    if is_key(text):
        return text
    if not looks_like_key(text):
        raise click.UsageError(f"{text!r} is not a key: give 64 hex characters or a unique prefix of 6+")
    matches = [k for k in store.keys() if k.startswith(text)]
    if not matches:
        raise NotFound(f"no stored key starts with {text}")
    if len(matches) > 1:
        raise click.UsageError(f"prefix {text} matches {len(matches)} keys; give more characters")
    return matches[0]


def looks_like_key(text: str) -> bool:
    text = text.strip().lower()
    return len(text) >= 6 and all(c in "0123456789abcdef" for c in text)


def _read_mapping(path: str) -> Any:
    """A JSON or YAML file's data (SpecError naming the file and line; YAML
    read as a manifest is, aliases bounded: ``graphcache.ops.manifest.parse``)."""
    from graphcache.ops.manifest import parse, parse_error_text

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    if path.endswith((".yaml", ".yml")):
        return parse(text, path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(parse_error_text(path, exc)) from exc
    except (RecursionError, ValueError) as exc:  # nested too deep; a number past 4,300 digits
        raise SpecError(
            f"{path}: not valid JSON: {'nested too deep' if isinstance(exc, RecursionError) else exc}"
        ) from None


def load_spec_file(path: str) -> GraphSpec:
    """One spec from a JSON or YAML file."""
    data = _read_mapping(path)
    try:
        return GraphSpec.from_dict(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}", exc.field) from exc


def is_manifest(data: Any) -> bool:
    """A manifest (``defaults:`` and ``graphs:``) rather than one flat spec."""
    return isinstance(data, dict) and ("graphs" in data or "defaults" in data)


def load_specs(path: str, name: str | None = None, *, max_specs: int | None = None) -> tuple[list[GraphSpec], bool]:
    """``(specs, from_manifest)``: every spec of the manifest at ``path``
    (only its family ``name`` when given), or the one flat spec the file
    holds (docs/examples/spec.yaml and llama3-8b.yaml show both formats).

    Raises SpecError / ManifestError naming the file and the field, and for
    a ``name`` no family has, the names there are; ManifestTooLarge past
    ``max_specs`` (default: GRAPHCACHE_MAX_SPECS).
    """
    from graphcache.ops.manifest import expand

    data = _read_mapping(path)
    if not is_manifest(data):
        if name is not None:
            raise SpecError(f"{path}: --name picks a family of a manifest (defaults: + graphs:); this file is one spec")
        return [load_spec_file(path)], False
    if name is not None:
        families = [g for g in data["graphs"] or [] if isinstance(g, dict)]
        chosen = [g for g in families if g.get("name") == name]
        if not chosen:
            names = ", ".join(str(g.get("name"))[:64] for g in families[:50])
            raise SpecError(f"{path}: no family named {shown(name)}; --name takes one of: {names}")
        data = {**data, "graphs": chosen}
    cap = Settings.from_env().max_specs if max_specs is None else max_specs
    return expand(data, source=path, max_specs=cap), True


def human_size(n: float) -> str:
    """``n`` bytes as the tables print them: ``512 B``, ``1.5 KiB`` ... ``2.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def age(created_at: str) -> str:
    """How long ago an ISO ``created_at`` was (``3d``, ``5h``, ``12m``, ``40s``); ``?`` when unreadable."""
    try:
        then = _dt.datetime.fromisoformat(created_at)
    except ValueError:
        return "?"
    seconds = (_dt.datetime.now(_dt.timezone.utc) - then).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def parse_spec_arg(text: str) -> GraphSpec:
    """--spec takes a JSON/YAML file, inline JSON, or key=value pairs
    (``batch=1,heads_q=32,seq_q=4096,head_dim=128,dtype=bfloat16,mask=causal``)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            return GraphSpec.from_dict(json.loads(stripped))
        except json.JSONDecodeError as exc:
            raise SpecError(f"--spec: not valid JSON: {exc}") from exc
    if "=" not in stripped:
        return load_spec_file(text)
    data: dict[str, Any] = {}
    for part in filter(None, stripped.split(",")):
        name, sep, value = part.partition("=")
        if not sep:
            raise SpecError(f"--spec: {part!r} is not name=value (or give a spec file or JSON)")
        data[name.strip()] = _scalar(value.strip())
    return GraphSpec.from_dict(data)


def _scalar(value: str) -> Any:
    import yaml

    return yaml.safe_load(value) if value else value


def server_store(ctx: Context, server: str | None, *, read_only: bool = False) -> Store:
    """The service at ``server`` (else $GRAPHCACHE_SERVER) as an HttpStore, else the
    store --store / --cache-dir name (see ``Context.store`` for ``read_only``)."""
    from graphcache.stores import service_store

    url = server or ctx.settings.server
    if url:
        return service_store(ctx.settings, url)
    return ctx.store(read_only=read_only)


UPLOAD_CHECK_RETRIES = 3  # a service that does not answer is asked again 1, 2 and 4 s later (one still starting)


def check_uploads(store: Store) -> None:
    """Before a verb builds for ``store``: that a service answers and takes
    this client's uploads (HttpStore.check_write), so nothing is built for
    an upload that would be refused. One that does not answer is asked again
    (UPLOAD_CHECK_RETRIES, a line on stderr each time); then a one-line error
    naming the fix."""
    check = getattr(store, "check_write", None)
    if check is None:
        return

    def retrying(exc: StoreUnavailable, wait: float) -> None:
        err_console.print(f"{exc}; asking again in {wait:.0f} s")

    try:
        check(UPLOAD_CHECK_RETRIES, retrying)
    except StoreUnavailable as exc:
        raise StoreUnavailable(
            f"{exc}: start the service there (graphcache serve), or point --server / GRAPHCACHE_SERVER at it; "
            "nothing was built"
        ) from None
    except StoreError as exc:
        raise StoreError(f"{exc}; nothing was built") from None


def progress_bar(label: str) -> Any:
    """A Rich progress bar on stderr, to use as ``with progress_bar(label) as bar``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(label, markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        # On a terminal the bar stays as a record; piped (CI, logs, scripts)
        # it leaves nothing behind, so a failure is still one line.
        transient=not err_console.is_terminal,
    )


def one_line(text: str) -> str:
    """A message on one line: YAML and HTTP errors come with newlines and indents."""
    return " ".join(text.split())


def fail(message: str, code: int = 1) -> None:
    """Print ``error: MESSAGE`` on one line of stderr, as text, and exit ``code``."""
    err_console.print(Text.assemble(("error:", "red"), " ", one_line(message)))
    sys.exit(code)


def run() -> None:
    """Entry point: one clear line on error, never a traceback."""
    try:
        main(standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        message = exc.format_message()
        ctx = getattr(exc, "ctx", None)
        if isinstance(exc, click.UsageError) and ctx is not None:
            message += f" (see '{ctx.command_path} --help')"
        fail(message, exc.exit_code)
    except (GraphCacheError, OSError) as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a bug still gets one line, not a traceback
        if os.environ.get("GRAPHCACHE_DEBUG"):
            raise
        fail(f"internal error ({type(exc).__name__}: {exc}); set GRAPHCACHE_DEBUG=1 to see the traceback")
