"""Deploy verbs: warm (build and upload, or --check coverage), prefetch (fill
a local store from a server) and explain (why a spec misses)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from graphcache.cli.common import (
    Context,
    check_uploads,
    chosen_compiler,
    compiler_option,
    console,
    err_console,
    fail,
    human_size,
    load_specs,
    main,
    named_target,
    pass_ctx,
    progress_bar,
    server_store,
    store_options,
)
from graphcache.errors import NoGpu, StoreError


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
@compiler_option
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
    compiler_name: str | None,
    json_out: str | None,
) -> None:
    """Build and upload what MANIFEST needs for this GPU, or (--check) gate a deploy on coverage."""
    from graphcache import ops
    from graphcache.ops import manifest as manifest_mod
    from graphcache.target import Target

    specs = manifest_mod.load(manifest, max_specs=ctx.settings.max_specs)
    store = server_store(ctx, server)
    policy = ctx.settings.shape_classes
    if check_only:
        tgt = named_target(ctx, target, compiler_name, "--check")
        with progress_bar(f"checking {tgt}") as bar:
            task = bar.add_task("check", total=len(specs))
            rows = ops.check(
                specs, tgt, store, jobs=max(jobs, 8), progress=lambda: bar.advance(task), shape_classes=policy
            )
        table = Table("spec", "key", "status", "served by")
        for row in rows:
            status = Text("present", "green") if row.present else Text("missing", "red")
            table.add_row(
                row.spec.summary(),
                row.key[:12],
                Text("refused", "yellow") if row.refused else status,
                f"class {row.served_by.summary()} ({row.mechanism})" if row.served_by else "",
            )
        console.print(table)
        _mechanisms(tgt, [r.served_by for r in rows if r.served_by is not None])
        for row in rows:
            if row.refused:  # served by torch at every door, never a graph: not missing
                console.print(f"refused: {row.refused}", highlight=False)
        missing = sum(not r.present and not r.refused for r in rows)
        refusals = sum(bool(r.refused) for r in rows)
        console.print(
            f"{len(rows) - missing - refusals}/{len(rows)} present for {tgt} in {store!r}"
            + (f", {refusals} refused (a known-bad window)" if refusals else "")
        )
        if json_out:
            Path(json_out).write_text(
                json.dumps(
                    {
                        "target": str(tgt),
                        "rows": [
                            {
                                "spec": r.spec.to_dict(),
                                "key": r.key,
                                "present": r.present,
                                "served_by": r.served_by.to_dict() if r.served_by else None,
                                "mechanism": r.mechanism or None,
                                "refused": r.refused or None,
                            }
                            for r in rows
                        ],
                    },
                    indent=2,
                )
            )
        if missing:
            err_console.print(Text("coverage gate failed:", "red"), f"{missing} spec(s) missing")
            sys.exit(1)
        return
    from graphcache.cache import GraphCache

    compiler = chosen_compiler(ctx, compiler_name)
    here = compiler.target()  # NoGpu here, before the progress bar, with a clear message
    check_uploads(store)  # a service that is down or refuses this token: said before anything is built
    if target and Target.parse(target) != here:
        raise click.UsageError(f"--target {target} is not this machine ({here}); warm builds for this machine only")
    cache = GraphCache(store, compiler, signing_key=ctx.settings.signing_key, shape_classes=policy)
    from graphcache.spec.classes import class_of

    with progress_bar(f"warming {compiler.target()}") as bar:
        task = bar.add_task("warm", total=len({class_of(s, policy) for s in specs}))  # one row per class
        built_rows = ops.warm(specs, cache, jobs=jobs, pin=not no_pin, progress=lambda: bar.advance(task))
    table = Table("spec", "key", "status", "detail")
    colour = {"present": "green", "built": "cyan", "unsupported": "yellow", "refused": "yellow", "failed": "red"}
    for built in built_rows:
        table.add_row(built.spec.summary(), built.key[:12], Text(built.status, colour[built.status]), built.detail)
    console.print(table)
    _mechanisms(compiler.target(), [r.spec for r in built_rows if r.mechanism])
    counts = {s: sum(r.status == s for r in built_rows) for s in colour}
    console.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    if json_out:
        Path(json_out).write_text(
            json.dumps(
                {
                    "target": str(compiler.target()),
                    "rows": [
                        {
                            "spec": r.spec.to_dict(),
                            "key": r.key,
                            "status": r.status,
                            "detail": r.detail,
                            "mechanism": r.mechanism or None,
                        }
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
    help="Target text, e.g. h200-sm90-mp132-cudnn9.28.0-fe1.32.0 (default: the --compiler's: this GPU for cudnn).",
)
@click.option("--server", default=None, help="Service URL to fetch from (default: $GRAPHCACHE_SERVER).")
@click.option("--strict", is_flag=True, help="Exit 1 when any spec has no stored artifact.")
@compiler_option
@store_options
@pass_ctx
def prefetch_cmd(
    ctx: Context, manifest: str, target: str | None, server: str | None, strict: bool, compiler_name: str | None
) -> None:
    """Fill the local store with every artifact MANIFEST needs, in one request to the server."""
    from graphcache.cache import GraphCache
    from graphcache.ops import manifest as manifest_mod
    from graphcache.stores import HttpStore, TieredStore, service_store
    from graphcache.target import Target

    specs = manifest_mod.load(manifest, max_specs=ctx.settings.max_specs)
    url = server or ctx.settings.server
    if not url:
        raise click.UsageError("prefetch fetches from a server: give --server URL or set GRAPHCACHE_SERVER")
    local = ctx.store()
    if isinstance(local, HttpStore):
        raise click.UsageError("prefetch fills a local store: --store must be a folder or redis://, not http://")
    remote = service_store(ctx.settings, url)
    if target:
        tgt = Target.parse(target)
    else:
        try:
            tgt = chosen_compiler(ctx, compiler_name).target()
        except NoGpu as exc:
            # Here --target helps: a machine without the GPU fetches for one that has it.
            raise NoGpu(f"{exc}; give --target TARGET (the serving GPU's, from 'graphcache doctor' there)") from exc
    tiered = TieredStore(local, remote)
    cache = GraphCache(
        tiered,
        signing_key=ctx.settings.signing_key,
        require_signed=ctx.settings.require_signed,
        verify_keys=ctx.settings.verify_keys,  # every key of GRAPHCACHE_SIGNING_KEY during a rotation
        shape_classes=ctx.settings.shape_classes,
    )
    with progress_bar(f"prefetching {tgt}") as bar:
        task = bar.add_task("prefetch", total=len(specs))  # manifest.load drops duplicate specs
        try:
            report = cache.prefetch(specs, tgt, progress=lambda key: bar.advance(task))
        except StoreError as exc:
            # Down, refused (401/403, with what the server said), its store
            # unavailable (503) or cut short: one line and a failure, not a
            # table of specs "missing".
            raise StoreError(f"prefetch from {url} failed: {tiered.remote_error or exc}") from exc
    if report.missing:
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
    console.print(summary)
    if report.served_by:
        classes: dict[Any, int] = {}
        for klass in report.served_by.values():
            classes[klass] = classes.get(klass, 0) + 1
        console.print(f"{len(report.served_by)} spec(s) present through their length class:", highlight=False)
        for klass, n in classes.items():
            console.print(f"  class {klass.summary()} serves {n}", highlight=False)
    if strict and report.missing:
        fail(f"prefetch incomplete: {len(report.missing)} spec(s) missing on {url}")


@main.command("explain")
@click.argument("spec_file")
@click.option(
    "--target",
    default=None,
    help="Target text the key was asked for (default: the --compiler's where it is not cudnn).",
)
@compiler_option
@click.option("--server", default=None, help="Service URL (default: $GRAPHCACHE_SERVER, else the local store).")
@click.option("--name", default=None, help="Only this family of a manifest.")
@store_options
@pass_ctx
def explain_cmd(
    ctx: Context, spec_file: str, target: str | None, compiler_name: str | None, server: str | None, name: str | None
) -> None:
    """Why SPEC_FILE misses on TARGET: the class that would serve it, or the nearest stored entries.

    Each stored class is compared as the class that would serve the spec;
    other entries field by field. SPEC_FILE is a flat spec file or a manifest (every spec, or those of its
    family --name). Exits 1 when any spec is missing."""
    specs, _ = load_specs(spec_file, name)
    tgt = named_target(ctx, target, compiler_name, "explain")
    store = server_store(ctx, server, read_only=True)
    missing = 0
    for index, spec in enumerate(specs):
        if index:
            console.print()
        missing += not _explain(ctx, spec, tgt, store)
    if len(specs) > 1:
        console.print()
        console.print(f"{len(specs) - missing}/{len(specs)} present on {tgt}", highlight=False)
    if missing:
        sys.exit(1)


def _explain(ctx: Context, spec: Any, tgt: Any, store: Any) -> bool:
    """Print why ``spec`` is present or missing on ``tgt``; True when present."""
    from graphcache import ops

    result = ops.explain(
        spec, tgt, store, shape_classes=ctx.settings.shape_classes, class_slack=ctx.settings.class_slack
    )
    if result.refused:  # a known-bad window: torch serves it at every door, whatever is stored
        console.print(f"refused: {result.refused}", highlight=False)
        return True
    if result.klass is not None:
        state = "stored" if result.class_present else "not stored (or refused on this target)"
        console.print(
            f"class: {spec.summary()} falls in {result.klass.summary()} (key {result.class_key[:12]}), {state}",
            highlight=False,
        )
    if result.mechanism is not None:
        how = "serves" if result.mechanism.serves else "cannot serve"
        console.print(
            f"mechanism: {result.mechanism.name} {how} length classes on {tgt}: {result.mechanism.why}",
            highlight=False,
        )
    if result.class_present:
        console.print(f"present: {spec.summary()} on {tgt} is served by its class's graph {result.class_key}")
        return True
    if result.serving is not None:
        console.print(
            f"present: {spec.summary()} on {tgt} is served by the smallest larger stored class "
            f"{result.serving.summary()} (key {result.serving_key[:12]})",
            highlight=False,
        )
    for why in result.not_serving:
        console.print(f"  - {why}", highlight=False)
    if result.serving is not None:
        return True
    if result.present:
        console.print(f"present: {spec.summary()} on {tgt} is stored as {result.key}")
        return True
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
    return False


def _mechanisms(tgt: Any, classes: list[Any]) -> None:
    """One line per mechanism that serves ``classes`` on ``tgt``: which, and why."""
    from graphcache.compilers.cudnn.releases import class_mechanism

    seen: dict[str, str] = {}
    for klass in classes:
        chosen = class_mechanism(klass, tgt)
        if chosen is not None and chosen.name not in seen:
            seen[chosen.name] = chosen.why
    for name, why in seen.items():
        console.print(f"length classes on {tgt}: {name}: {why}", highlight=False)
