"""Store verbs: ls, inspect, get, rm, purge, pin and key (what is stored, by key)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from graphcache.artifact import Artifact, read_header
from graphcache.cli.common import (
    Context,
    age,
    console,
    human_size,
    load_specs,
    looks_like_key,
    main,
    pass_ctx,
    resolve_key,
    server_store,
    store_options,
)
from graphcache.errors import CorruptArtifact, NotFound, SpecError
from graphcache.spec import GraphSpec
from graphcache.stores import Store, stored_header


@main.command("ls")
@click.option("--target", default=None, help="Only entries for this target text.")
@click.option("--json", "as_json", is_flag=True, help="Headers as JSON lines (size: payload bytes; pinned).")
@store_options
@pass_ctx
def ls_cmd(ctx: Context, target: str | None, as_json: bool) -> None:
    """List stored artifacts: key prefix, spec, target, size (the plan's
    payload bytes, as `inspect` says), build seconds, age, pinned."""
    if target is not None:
        from graphcache.target import Target

        target = str(Target.parse(target))  # a typo is an error, not an empty listing
    store = ctx.store(read_only=True)
    table = Table("key", "spec", "target", "size", "build s", "age", "pinned", "note")
    count = 0
    for key, header, problem, pinned in _listing(store, target):
        if problem is not None:
            if as_json:
                click.echo(json.dumps({"key": key, "corrupt": problem}, sort_keys=True))
            table.add_row(key[:12], "-", "-", "-", "-", "-", "-", f"corrupt: {problem}")
            continue
        if header is None:
            continue
        text = header.get("target_text", "")
        if target and text != target:
            continue
        count += 1
        size = int(header["payload_size"])
        if as_json:
            click.echo(json.dumps({"key": key, "size": size, "pinned": pinned, **header}, sort_keys=True))
            continue
        try:
            summary = GraphSpec.from_dict(header["spec"]).summary()
        except SpecError:
            summary = "?"
        note = f"unsupported: {header['unsupported']}" if header.get("unsupported") else ""
        build = f"{float(header.get('build_seconds') or 0):.2f}"
        shown = "?" if pinned is None else ("yes" if pinned else "")
        created = age(header.get("created_at", ""))
        table.add_row(key[:12], summary, text, human_size(size), build, created, shown, note)
    if not as_json:
        console.print(table)
        console.print(f"{count} artifact(s) in {store!r}")


def _listing(store: Store, target: str | None) -> Iterator[tuple[str, dict[str, Any] | None, str | None, bool | None]]:
    """(key, header, problem, pinned) for every entry, by key; pinned is None
    where the store cannot say. A service is asked for its listing route
    (headers only, filtered there), never every artifact."""
    items = getattr(store, "items", None)
    if items is not None:
        for item in items(target):
            yield item["key"], item.get("header"), item.get("corrupt"), item.get("pinned")
        return
    is_pinned = getattr(store, "pinned", None)
    for key in sorted(store.keys()):
        try:
            header = stored_header(store, key)
        except CorruptArtifact as exc:
            yield key, None, str(exc), None
            continue
        yield key, header, None, (None if is_pinned is None or header is None else bool(is_pinned(key)))


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
    elif not looks_like_key(what):
        raise NotFound(f"no such file: {what} (and it is not a key or a key prefix of 6+ hex characters)")
    else:
        store = ctx.store(read_only=True)
        expected = resolve_key(store, what)
        try:
            data = store.get(expected)
        except CorruptArtifact as exc:  # its value cannot be read (UnreadableEntry): said, in the same shape
            click.echo(json.dumps({"key": expected, "verified": False, "problem": str(exc)}, indent=2, sort_keys=True))
            sys.exit(1)
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
    # size is the payload's bytes, as in `ls`; the whole envelope is envelope_size.
    header["size"] = header.get("payload_size", len(data))
    header["envelope_size"] = len(data)
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
    store = server_store(ctx, server, read_only=True)
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
@click.option("--name", default=None, help="Only this family of a manifest.")
def key_cmd(spec_file: str, target: str, name: str | None) -> None:
    """Print the cache key of the spec in SPEC_FILE for TARGET: a flat spec
    file prints its key; a manifest prints a key and the spec per line, for
    every spec (or those of its family --name)."""
    from graphcache.key import key_for
    from graphcache.target import Target

    tgt = Target.parse(target)
    specs, from_manifest = load_specs(spec_file, name)
    for spec in specs:
        click.echo(f"{key_for(spec, tgt)}  {spec.summary()}" if from_manifest else key_for(spec, tgt))
