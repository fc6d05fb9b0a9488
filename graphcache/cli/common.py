"""The ``graphcache`` command line.

Errors print one line (``error: ...``) and exit non-zero, never a traceback.
Verbs that need no GPU never import torch or cudnn.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from graphcache.artifact import Artifact, read_header
from graphcache.errors import CorruptArtifact, GraphCacheError, NotFound, SpecError, StoreError, StoreLocationError
from graphcache.key import is_key
from graphcache.settings import Settings
from graphcache.spec import GraphSpec
from graphcache.stores import Store, check_location, disk_folder, open_store, stored_header

# Markup off: what is printed holds paths, specs and error texts, and Rich
# would read '[gpu]' or '[/x]' in them as tags (dropping or crashing on them).
# Colour is given explicitly with Text(..., style=...).
console = Console(markup=False, highlight=False)
err_console = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


class Context:
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


def resolve_key(store: Store, text: str) -> str:
    """A full key, or a unique prefix (6+ hex characters) of a stored one."""
    text = text.strip().lower()
    if is_key(text):
        return text
    if not _looks_like_key(text):
        raise click.UsageError(f"{text!r} is not a key: give 64 hex characters or a unique prefix of 6+")
    matches = [k for k in store.keys() if k.startswith(text)]
    if not matches:
        raise NotFound(f"no stored key starts with {text}")
    if len(matches) > 1:
        raise click.UsageError(f"prefix {text} matches {len(matches)} keys; give more characters")
    return matches[0]


def _looks_like_key(text: str) -> bool:
    text = text.strip().lower()
    return len(text) >= 6 and all(c in "0123456789abcdef" for c in text)


def load_spec_file(path: str) -> GraphSpec:
    """One spec from a JSON or YAML file."""
    import yaml

    from graphcache.manifest import parse_error_text

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    try:
        data = yaml.safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise SpecError(parse_error_text(path, exc)) from exc
    try:
        return GraphSpec.from_dict(data)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}", exc.field) from exc


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def age(created_at: str) -> str:
    try:
        then = _dt.datetime.fromisoformat(created_at)
    except ValueError:
        return "?"
    seconds = (_dt.datetime.now(_dt.timezone.utc) - then).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(seconds, 0):.0f}s"


# -- verbs -----------------------------------------------------------------------


@main.command("ls")
@click.option("--target", default=None, help="Only entries for this target text.")
@click.option("--json", "as_json", is_flag=True, help="Headers as JSON lines.")
@store_options
@pass_ctx
def ls_cmd(ctx: Context, target: str | None, as_json: bool) -> None:
    """List stored artifacts: key prefix, spec, target, size, build seconds, age."""
    if target is not None:
        from graphcache.target import Target

        target = str(Target.parse(target))  # a typo is an error, not an empty listing
    store = ctx.store(read_only=True)
    table = Table("key", "spec", "target", "size", "build s", "age", "note")
    count = 0
    for key, header, problem in _listing(store, target):
        if problem is not None:
            if as_json:
                click.echo(json.dumps({"key": key, "corrupt": problem}, sort_keys=True))
            table.add_row(key[:12], "-", "-", "-", "-", "-", f"corrupt: {problem}")
            continue
        if header is None:
            continue
        text = header.get("target_text", "")
        if target and text != target:
            continue
        count += 1
        size = int(header["payload_size"])
        if as_json:
            click.echo(json.dumps({"key": key, "size": size, **header}, sort_keys=True))
            continue
        try:
            summary = GraphSpec.from_dict(header["spec"]).summary()
        except SpecError:
            summary = "?"
        note = f"unsupported: {header['unsupported']}" if header.get("unsupported") else ""
        build = f"{float(header.get('build_seconds') or 0):.2f}"
        table.add_row(key[:12], summary, text, human_size(size), build, age(header.get("created_at", "")), note)
    if not as_json:
        console.print(table)
        console.print(f"{count} artifact(s) in {store!r}")


def _listing(store: Store, target: str | None) -> Iterator[tuple[str, dict[str, Any] | None, str | None]]:
    """(key, header, problem) for every entry, by key. A service is asked for
    its listing route (headers only, filtered there), never every artifact."""
    items = getattr(store, "items", None)
    if items is not None:
        for item in items(target):
            yield item["key"], item.get("header"), item.get("corrupt")
        return
    for key in sorted(store.keys()):
        try:
            yield key, stored_header(store, key), None
        except CorruptArtifact as exc:
            yield key, None, str(exc)


@main.command("inspect")
@click.argument("what")
@store_options
@pass_ctx
def inspect_cmd(ctx: Context, what: str) -> None:
    """Print the header of a stored KEY (or prefix) or an artifact FILE as JSON."""
    path = Path(what)
    expected: str | None = None
    if path.is_file():
        data: bytes | None = path.read_bytes()
    elif not _looks_like_key(what):
        raise NotFound(f"no such file: {what} (and it is not a key or a key prefix of 6+ hex characters)")
    else:
        store = ctx.store(read_only=True)
        expected = resolve_key(store, what)
        data = store.get(expected)
    if data is None:
        raise NotFound(f"key {expected} is not stored")
    try:
        header = read_header(data)
    except CorruptArtifact as exc:  # not even a header: say so in the same shape
        header = {"key": expected, "verified": False, "problem": str(exc)}
    else:
        try:
            Artifact.decode(data, expected_key=expected)
            header["verified"] = True
        except CorruptArtifact as exc:
            header["verified"] = False
            header["problem"] = str(exc)
    header["size"] = len(data)
    click.echo(json.dumps(header, indent=2, sort_keys=True))
    if not header["verified"]:
        sys.exit(1)


@main.command("get")
@click.argument("key")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="File to write.")
@store_options
@pass_ctx
def get_cmd(ctx: Context, key: str, output: str) -> None:
    """Write the verified artifact KEY to a file."""
    store = ctx.store(read_only=True)
    key = resolve_key(store, key)
    data = store.get(key)
    if data is None:
        raise NotFound(f"key {key} is not stored")
    Artifact.decode(data, expected_key=key)
    Path(output).write_bytes(data)
    click.echo(f"wrote {human_size(len(data))} to {output}")


@main.command("rm")
@click.argument("key")
@store_options
@pass_ctx
def rm_cmd(ctx: Context, key: str) -> None:
    """Remove the artifact KEY (or unique prefix)."""
    store = ctx.store(read_only=True)
    key = resolve_key(store, key)
    if not store.delete(key):
        raise NotFound(f"key {key} is not stored")
    click.echo(f"removed {key}")


@main.command("purge")
@click.option("--target", default=None, help="The retired target, e.g. h200-sm90-mp132-cudnn9.27.0-fe1.31.0.")
@click.option(
    "--unsupported",
    is_flag=True,
    help="Remove only negative entries (specs recorded as unsupported), of --target or of every target.",
)
@click.option("--server", default=None, help="Purge on this service (admin token in $GRAPHCACHE_TOKEN).")
@click.option("--dry-run", is_flag=True, help="List what would be removed.")
@store_options
@pass_ctx
def purge_cmd(ctx: Context, target: str | None, unsupported: bool, server: str | None, dry_run: bool) -> None:
    """Remove every entry built for TARGET (pinned ones too), or with
    --unsupported the negative entries, e.g. after a cuDNN fix or a host
    whose failures were wrongly recorded."""
    from graphcache import ops
    from graphcache.target import Target

    if target is None and not unsupported:
        raise click.UsageError("give --target TARGET, --unsupported, or both")
    tgt = None if target is None else Target.parse(target)
    store = _server_store(ctx, server, read_only=True)
    removed = ops.purge(store, tgt, unsupported=unsupported, dry_run=dry_run)
    for key in removed:
        click.echo(key)
    what = f"{'negative ' if unsupported else ''}entr{'y' if len(removed) == 1 else 'ies'}"
    scope = f"of {tgt} " if tgt is not None else ""
    click.echo(f"{'would remove' if dry_run else 'removed'} {len(removed)} {what} {scope}from {store!r}")


@main.command("pin")
@click.argument("key")
@click.option("--off", is_flag=True, help="Unpin instead.")
@store_options
@pass_ctx
def pin_cmd(ctx: Context, key: str, off: bool) -> None:
    """Exempt KEY from LRU eviction (or, with --off, make it evictable again)."""
    store = ctx.store(read_only=True)
    key = resolve_key(store, key)
    method = getattr(store, "unpin" if off else "pin", None)
    if method is None:
        raise click.UsageError(f"{store!r} cannot pin entries")
    if not method(key):
        raise NotFound(f"key {key} is not stored")
    click.echo(f"{'unpinned' if off else 'pinned'} {key}")


@main.command("key")
@click.argument("spec_file")
@click.option("--target", required=True, help="Target text, e.g. h200-sm90-mp132-cudnn9.28.0-fe1.32.0.")
def key_cmd(spec_file: str, target: str) -> None:
    """Print the cache key of the spec in SPEC_FILE for TARGET."""
    from graphcache.key import key_for
    from graphcache.target import Target

    click.echo(key_for(load_spec_file(spec_file), Target.parse(target)))


def _manifest_specs(manifest: str | None, spec_args: tuple[str, ...]) -> list[GraphSpec]:
    from graphcache import manifest as manifest_mod

    specs = manifest_mod.load(manifest) if manifest else []
    for text in spec_args:
        specs.append(parse_spec_arg(text))
    if not specs:
        raise click.UsageError("give a MANIFEST or at least one --spec")
    return specs


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


def _server_store(ctx: Context, server: str | None, *, read_only: bool = False) -> Store:
    from graphcache.stores import HttpStore

    url = server or ctx.settings.server
    if url:
        return HttpStore(url, token=ctx.settings.token, timeout=ctx.settings.timeout)
    return ctx.store(read_only=read_only)


def _load_compiler(path: str) -> Any:
    import importlib

    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)()
    except (ImportError, AttributeError) as exc:
        raise click.UsageError(f"--compiler {path}: cannot load it ({exc})") from exc


def _progress(label: str) -> Any:
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


@main.command("warm")
@click.argument("manifest")
@click.option(
    "--server",
    default=None,
    help="Service URL to check and upload to (default: $GRAPHCACHE_SERVER, else the local store).",
)
@click.option(
    "--jobs",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Specs handled at once (builds share one GPU and take turns).",
)
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Only report coverage for --target; needs no GPU. Exits 1 when anything is missing.",
)
@click.option("--target", default=None, help="Target text for --check, e.g. h200-sm90-mp132-cudnn9.28.0-fe1.32.0.")
@click.option("--no-pin", is_flag=True, help="Do not pin warmed entries against eviction.")
@click.option(
    "--compiler",
    "compiler_path",
    default="graphcache.compilers.cudnn:CudnnCompiler",
    show_default=True,
    help="Compiler class as module:Class.",
)
@click.option(
    "--json", "json_out", default=None, type=click.Path(dir_okay=False), help="Also write the report as JSON."
)
@store_options
@pass_ctx
def warm_cmd(
    ctx: Context,
    manifest: str,
    server: str | None,
    jobs: int,
    check_only: bool,
    target: str | None,
    no_pin: bool,
    compiler_path: str,
    json_out: str | None,
) -> None:
    """Build and upload what MANIFEST needs for this GPU, or (--check) gate a deploy on coverage."""
    from graphcache import manifest as manifest_mod
    from graphcache import ops
    from graphcache.target import Target

    specs = manifest_mod.load(manifest)
    store = _server_store(ctx, server)
    if check_only:
        if not target:
            raise click.UsageError("--check needs --target (the serving GPUs' target, e.g. from 'graphcache doctor')")
        tgt = Target.parse(target)
        with _progress(f"checking {tgt}") as bar:
            task = bar.add_task("check", total=len(specs))
            rows = ops.check(specs, tgt, store, jobs=max(jobs, 8), progress=lambda: bar.advance(task))
        table = Table("spec", "key", "status")
        for row in rows:
            table.add_row(
                row.spec.summary(), row.key[:12], Text("present", "green") if row.present else Text("missing", "red")
            )
        console.print(table)
        missing = sum(not r.present for r in rows)
        console.print(f"{len(rows) - missing}/{len(rows)} present for {tgt} in {store!r}")
        if json_out:
            Path(json_out).write_text(
                json.dumps(
                    {
                        "target": str(tgt),
                        "rows": [{"spec": r.spec.to_dict(), "key": r.key, "present": r.present} for r in rows],
                    },
                    indent=2,
                )
            )
        if missing:
            err_console.print(Text("coverage gate failed:", "red"), f"{missing} spec(s) missing")
            sys.exit(1)
        return
    from graphcache.cache import GraphCache

    compiler = _load_compiler(compiler_path)
    here = compiler.target()  # NoGpu here, before the progress bar, with a clear message
    if target and Target.parse(target) != here:
        raise click.UsageError(f"--target {target} is not this machine ({here}); warm builds for this machine only")
    cache = GraphCache(store, compiler, signing_key=ctx.settings.signing_key)
    with _progress(f"warming {compiler.target()}") as bar:
        task = bar.add_task("warm", total=len(specs))
        built_rows = ops.warm(specs, cache, jobs=jobs, pin=not no_pin, progress=lambda: bar.advance(task))
    table = Table("spec", "key", "status", "detail")
    colour = {"present": "green", "built": "cyan", "unsupported": "yellow", "failed": "red"}
    for built in built_rows:
        table.add_row(built.spec.summary(), built.key[:12], Text(built.status, colour[built.status]), built.detail)
    console.print(table)
    counts = {s: sum(r.status == s for r in built_rows) for s in colour}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    if json_out:
        Path(json_out).write_text(
            json.dumps(
                {
                    "target": str(compiler.target()),
                    "rows": [
                        {"spec": r.spec.to_dict(), "key": r.key, "status": r.status, "detail": r.detail}
                        for r in built_rows
                    ],
                },
                indent=2,
            )
        )
    if counts["failed"]:
        sys.exit(1)


@main.command("prefetch")
@click.argument("manifest")
@click.option(
    "--target",
    default=None,
    help="Target text, e.g. h200-sm90-mp132-cudnn9.28.0-fe1.32.0 (default: this machine's GPU, which imports torch).",
)
@click.option("--server", default=None, help="Service URL to fetch from (default: $GRAPHCACHE_SERVER).")
@click.option("--strict", is_flag=True, help="Exit 1 when any spec has no stored artifact.")
@store_options
@pass_ctx
def prefetch_cmd(ctx: Context, manifest: str, target: str | None, server: str | None, strict: bool) -> None:
    """Fill the local store with every artifact MANIFEST needs, in one request to the server."""
    from graphcache import manifest as manifest_mod
    from graphcache.cache import GraphCache
    from graphcache.stores import HttpStore, TieredStore
    from graphcache.target import Target

    specs = manifest_mod.load(manifest)
    url = server or ctx.settings.server
    if not url:
        raise click.UsageError("prefetch fetches from a server: give --server URL or set GRAPHCACHE_SERVER")
    local = ctx.store()
    if isinstance(local, HttpStore):
        raise click.UsageError("prefetch fills a local store: --store must be a folder or redis://, not http://")
    remote = HttpStore(url, token=ctx.settings.token, timeout=ctx.settings.timeout)
    if target:
        tgt = Target.parse(target)
    else:
        from graphcache.compilers.cudnn import CudnnCompiler

        tgt = CudnnCompiler().target()  # NoGpu with a clear message: then give --target
    tiered = TieredStore(local, remote)
    cache = GraphCache(tiered, signing_key=ctx.settings.signing_key, require_signed=ctx.settings.require_signed)
    with _progress(f"prefetching {tgt}") as bar:
        task = bar.add_task("prefetch", total=len(specs))  # manifest.load drops duplicate specs
        report = cache.prefetch(specs, tgt, progress=lambda key: bar.advance(task))
    if report.missing and tiered.remote_error is None:
        table = Table("missing spec", "key")
        for spec in report.missing[:50]:
            table.add_row(spec.summary(), cache.key(spec, tgt)[:12])
        if len(report.missing) > 50:
            table.add_row(f"... and {len(report.missing) - 50} more", "")
        console.print(table)
    summary = Table("target", "present", "missing", "corrupt", "bytes", "seconds", "local store")
    summary.add_row(
        str(tgt),
        str(report.present),
        str(len(report.missing)),
        str(report.corrupt),
        human_size(report.bytes),
        f"{report.seconds:.2f}",
        repr(local),
    )
    if tiered.remote_error is not None:
        # Down, refused (401/403, with what the server said) or cut short:
        # one line and a failure, not a table of specs "missing".
        raise StoreError(f"prefetch from {url} failed: {tiered.remote_error}")
    console.print(summary)
    if strict and report.missing:
        fail(f"prefetch incomplete: {len(report.missing)} spec(s) missing on {url}")


@main.command("explain")
@click.argument("spec_file")
@click.option("--target", required=True, help="Target text the key was asked for.")
@click.option("--server", default=None, help="Service URL (default: $GRAPHCACHE_SERVER, else the local store).")
@store_options
@pass_ctx
def explain_cmd(ctx: Context, spec_file: str, target: str, server: str | None) -> None:
    """Why SPEC_FILE misses on TARGET: the nearest stored entries and the fields that differ."""
    from graphcache import ops
    from graphcache.target import Target

    spec = load_spec_file(spec_file)
    tgt = Target.parse(target)
    result = ops.explain(spec, tgt, _server_store(ctx, server, read_only=True))
    if result.present:
        console.print(f"present: {spec.summary()} on {tgt} is stored as {result.key}")
        return
    console.print(
        f"missing: {spec.summary()} on {tgt} (key {result.key[:12]}); {result.scanned} stored entries compared"
    )
    if not result.nearest:
        console.print("the store holds no entries to compare with")
    for cand in result.nearest:
        console.print()
        console.print(
            Text(cand.key[:12], "bold"),
            f"{cand.spec.summary() if cand.spec else '?'} on {cand.target}: {len(cand.differences)} difference(s)",
        )
        for diff in cand.differences:
            console.print(f"  - {diff}")
    sys.exit(1)


@main.command("bench")
@click.argument("manifest", required=False)
@click.option("--spec", "spec_args", multiple=True, help="A spec: file, inline JSON, or name=value,... (repeatable).")
@click.option(
    "--server",
    default=None,
    help="Fetch warm artifacts from this service (default: $GRAPHCACHE_SERVER, else the local store).",
)
@click.option("--target", default=None, help="Target whose artifacts to fetch where this machine has no GPU.")
@click.option(
    "--repeat", default=5, show_default=True, type=click.IntRange(1, 1000), help="Samples per spec (medians)."
)
@click.option("--json", "json_out", default=None, type=click.Path(dir_okay=False), help="Write the report as JSON.")
@click.option("--plot", "plot_out", default=None, type=click.Path(dir_okay=False), help="Write a PNG bar chart.")
@click.option("--no-memory", is_flag=True, help="Skip the peak GPU memory comparison.")
@store_options
@pass_ctx
def bench_cmd(
    ctx: Context,
    manifest: str | None,
    spec_args: tuple[str, ...],
    server: str | None,
    target: str | None,
    repeat: int,
    json_out: str | None,
    plot_out: str | None,
    no_memory: bool,
) -> None:
    """Cold build vs warm start per spec, phase by phase, with the speedup."""
    from graphcache import bench
    from graphcache.target import Target

    if plot_out:
        # Before any work: a bench run is minutes on a GPU, and its plot the last step.
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError(
                "--plot needs matplotlib, which is not installed: pip install 'graphcache[plot]' (or drop --plot)"
            ) from None
    specs = _manifest_specs(manifest, spec_args)
    store = _server_store(ctx, server)
    url = server or ctx.settings.server
    location = url or ctx.location or ctx.settings.store or str(ctx.settings.cache_dir)
    gpu = bench.has_gpu()
    with _progress("bench") as bar:
        task = bar.add_task("bench", total=None)

        def progress(text: str) -> None:
            bar.update(task, description=text)

        if gpu:
            report = bench.bench_gpu(specs, store, location, repeat, memory=not no_memory, progress=progress)
        else:
            if not target:
                raise click.UsageError(
                    "this machine has no GPU: give --target to measure fetch + verify of that target's artifacts"
                )
            report = bench.bench_fetch(specs, store, Target.parse(target), repeat, progress=progress)
        bar.update(task, description="bench done", total=len(specs), completed=len(specs))
    _print_bench(report)
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2))
        console.print(f"wrote {json_out}")
    if plot_out:
        bench.plot(report, plot_out)
        console.print(f"wrote {plot_out}")
    if any("error" in r for r in report["specs"]):
        sys.exit(1)


def _print_bench(report: dict[str, Any]) -> None:
    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.2f}"

    if report["gpu"]:
        table = Table(
            "spec", "cold ms", "warm ms", "speedup", "cold phases (ms)", "warm phases (ms)", "peak MiB cuDNN/math"
        )
        for r in report["specs"]:
            if "error" in r:
                table.add_row(r["summary"], "-", "-", "-", Text(r["error"], "red"), "", "")
                continue
            mem = r.get("memory")
            mem_text = (
                f"{mem['cudnn_peak_bytes'] / 2**20:.0f} / {mem['torch_math_peak_bytes'] / 2**20:.0f}" if mem else "-"
            )
            table.add_row(
                r["summary"],
                ms(r["cold"]["total"]),
                ms(r["warm"]["total"]),
                f"{r['speedup']:.1f}x",
                ", ".join(f"{k} {ms(v)}" for k, v in r["cold"]["phases"].items()),
                ", ".join(f"{k} {ms(v)}" for k, v in r["warm"]["phases"].items()),
                mem_text,
            )
        console.print(table)
        console.print(
            f"target {report['target']}; medians of {report['repeat']} fresh processes each; "
            "process init (torch, CUDA context, cuDNN handle) excluded from both sides"
        )
        return
    table = Table("spec", "key", "size", "fetch ms", "verify ms", "total ms")
    for r in report["specs"]:
        if "error" in r:
            table.add_row(r["summary"], r["key"][:12], "-", "-", "-", Text(r["error"], "red"))
            continue
        p = r["warm"]["phases"]
        table.add_row(
            r["summary"], r["key"][:12], human_size(r["bytes"]), ms(p["fetch"]), ms(p["verify"]), ms(r["warm"]["total"])
        )
    console.print(table)
    console.print(Text(report["note"], "yellow"))


@main.command("doctor")
@click.option(
    "--spec",
    "spec_file",
    default=None,
    help="JSON/YAML spec to check (default: float16 causal, 32 heads, seq 1024, dim 128).",
)
def doctor_cmd(spec_file: str | None) -> None:
    """What this machine has, and what graphcache can do on it."""
    from graphcache.doctor import diagnose

    spec = load_spec_file(spec_file) if spec_file else None
    report = diagnose(spec)
    table = Table("check", "found")
    for name, value in report["rows"]:
        table.add_row(name, value)
    console.print(table)
    for line in report["verdict"]:
        console.print(line)


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="TCP port, 1-65535.")
@click.option(
    "--workers",
    default=None,
    type=click.IntRange(1, 64),
    help="uvicorn worker processes (default: one per CPU this process may use, at most 8).",
)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--limit-concurrency",
    default=1024,
    show_default=True,
    type=int,
    help="Connections served at once per worker; more get 503.",
)
@click.option(
    "--timeout-keep-alive",
    default=5,
    show_default=True,
    type=int,
    help="Seconds an idle keep-alive connection stays open.",
)
@store_options
@pass_ctx
def serve_cmd(
    ctx: Context,
    host: str,
    port: int,
    workers: int | None,
    log_level: str,
    limit_concurrency: int,
    timeout_keep_alive: int,
) -> None:
    """Run the HTTP service on the configured store (default: DiskStore in --cache-dir)."""
    import uvicorn

    from service.server import uvicorn_options

    if workers is None:
        # One event loop is one core: a single worker left the second core
        # idle and served 256 KiB GETs at 0.64x nginx, two at 0.99x
        # (docs/benchmarks.md). Capped: each worker holds its own hot cache.
        workers = min(len(os.sched_getaffinity(0)), 8)

    # Workers are separate processes: hand them the settings through the
    # environment, which create_app_from_env reads once at start.
    check_location(ctx.location if ctx.location is not None else ctx.settings.store)
    os.environ["GRAPHCACHE_DIR"] = str(ctx.settings.cache_dir)
    if ctx.location is not None:
        os.environ["GRAPHCACHE_STORE"] = ctx.location
    if not ctx.location and not ctx.settings.store:
        ctx.settings.cache_dir.mkdir(parents=True, exist_ok=True)
    where = ctx.location or ctx.settings.store or str(ctx.settings.cache_dir)
    err_console.print(f"graphcache serving {where} on http://{host}:{port} ({workers} worker(s)); docs at /docs")
    uvicorn.run(
        "service.app:create_app_from_env",
        factory=True,
        **uvicorn_options(
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            limit_concurrency=limit_concurrency,
            timeout_keep_alive=timeout_keep_alive,
        ),
    )


@main.command(
    "record",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Manifest file to write.")
@click.option(
    "--dtype",
    type=click.Choice(["float16", "bfloat16"]),
    default=None,
    help="Record every spec in this dtype (a float32 CPU run records what the GPU will run).",
)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def record_cmd(output: str, dtype: str | None, script: str, args: tuple[str, ...]) -> None:
    """Run SCRIPT [ARGS...] as python would, and write the manifest of its SDPA calls.

    Every torch scaled_dot_product_attention call the script makes (directly,
    through nn.MultiheadAttention, or a model library's "sdpa" attention) is
    noted; the manifest is what 'graphcache warm' reads. Runs on a CPU host.
    """
    try:
        from graphcache.torch.recording import run_script
    except ImportError as exc:
        raise click.UsageError(
            f"graphcache record needs torch ({exc}): pip install torch (a CPU build is enough)"
        ) from exc
    try:
        recorder = run_script(script, args, output, dtype)
    except SystemExit as exc:
        status = exc.code
        if not isinstance(status, int):
            # sys.exit("message"): python prints the message and exits 1.
            err_console.print(str(status))
            status = 1
        err_console.print(
            Text.assemble(("error:", "red"), f" {script} exited with status {status}; no manifest written")
        )
        sys.exit(status)
    console.print(
        f"wrote {output}: {len(recorder.specs)} spec(s) from {recorder.calls()} SDPA call(s)", highlight=False
    )
    for (code, message), count in sorted(recorder.ineligible.items()):
        console.print(f"  not a cuDNN graph ({code}, {count} call(s)): {message}", highlight=False)


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


if __name__ == "__main__":
    run()
