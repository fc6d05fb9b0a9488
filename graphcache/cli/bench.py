"""The bench verb: cold build vs warm start per spec (or, with no GPU, fetch
and verify of a target's artifacts), as a table, JSON and a plot."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from graphcache.cli.common import (
    Context,
    compiler_choice,
    compiler_option,
    console,
    err_console,
    human_size,
    main,
    parse_spec_arg,
    pass_ctx,
    server_store,
    store_options,
)
from graphcache.spec import GraphSpec


def _bench_classes(
    ctx: Context, specs: list[GraphSpec], repeat: int, compiler_name: str | None, json_out: str | None
) -> None:
    """``bench --classes``: graphcache.ops.classbench's table, with a line per call as it is timed."""
    from graphcache.cli.common import chosen_compiler
    from graphcache.ops.classbench import WAYS, compare, table

    compiler = chosen_compiler(ctx, compiler_name)
    calls = [s for s in specs if not s.is_class]
    if not calls:
        raise click.UsageError("bench --classes times exact specs (real call shapes): the manifest names classes only")
    times = max(repeat, 20)
    err_console.print(f"bench --classes: {len(calls)} call(s) on {compiler.target()}, {times} calls a way")
    rows = compare(calls, compiler, repeat=times, progress=lambda s: err_console.print(f"bench timing {s}"))
    out = Table("call", "class", *WAYS)
    for cells in table(rows):
        out.add_row(*cells)
    console.print(out)
    if json_out:
        report = [
            {"call": r.spec.to_dict(), "class": r.klass.to_dict()}
            | {name: {"us": t.us, "copied_bytes": t.copied_bytes, "note": t.note} for name, t in r.timings.items()}
            for r in rows
        ]
        Path(json_out).write_text(json.dumps(report, indent=2))
        console.print(f"wrote {json_out}")


def _manifest_specs(manifest: str | None, spec_args: tuple[str, ...]) -> list[GraphSpec]:
    from graphcache.ops import manifest as manifest_mod
    from graphcache.settings import Settings

    specs = manifest_mod.load(manifest, max_specs=Settings.from_env().max_specs) if manifest else []
    for text in spec_args:
        specs.append(parse_spec_arg(text))
    if not specs:
        raise click.UsageError("give a MANIFEST or at least one --spec")
    return specs


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
@click.option(
    "--classes",
    is_flag=True,
    help="Instead: time each exact spec's call through its exact graph, its class in the padded form "
    "(copies included) and, where the target has execute-time override, through override.",
)
@compiler_option
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
    classes: bool,
    compiler_name: str | None,
) -> None:
    """Cold build vs warm start per spec, phase by phase, with the speedup.

    With --classes: each spec's call per mechanism (exact, padded, override), microseconds a call."""
    from graphcache.ops import bench
    from graphcache.target import Target

    if classes:
        _bench_classes(ctx, _manifest_specs(manifest, spec_args), repeat, compiler_name, json_out)
        return

    if plot_out:
        # Before any work: a bench run is minutes on a GPU, and its plot the last step.
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.UsageError(
                "--plot needs matplotlib, which is not installed: pip install 'graphcache[plot]' (or drop --plot)"
            ) from None
    specs = _manifest_specs(manifest, spec_args)
    store = server_store(ctx, server)
    url = server or ctx.settings.server
    location = url or ctx.location or ctx.settings.store or str(ctx.settings.cache_dir)
    choice = compiler_choice(ctx, compiler_name)
    if choice not in ("cudnn", "reference"):
        raise click.UsageError(f"bench measures --compiler cudnn or reference, not {choice}")
    gpu = choice == "cudnn" and bench.has_gpu()
    started = time.monotonic()
    if choice == "reference" or gpu:
        err_console.print(
            f"bench: {len(specs)} spec(s), {repeat} cold and {repeat} warm sample(s) each, every sample a fresh process"
        )

    def progress(text: str) -> None:
        # A line per step, on a terminal or piped alike: minutes of fresh
        # processes are never silent.
        err_console.print(f"bench {text} ({time.monotonic() - started:.0f} s)", markup=False, highlight=False)

    if choice == "reference":
        report = bench.bench_reference(specs, store, location, repeat, progress=progress)
    elif gpu:
        report = bench.bench_gpu(specs, store, location, repeat, memory=not no_memory, progress=progress)
    else:
        if not target:
            raise click.UsageError(
                "this machine has no GPU: give --target to measure fetch + verify of that target's artifacts, "
                "or --compiler reference to measure the reference compiler"
            )
        report = bench.bench_fetch(specs, store, Target.parse(target), repeat, progress=progress)
    err_console.print(f"bench done in {time.monotonic() - started:.0f} s")
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

    if report["gpu"] or report.get("compiler") == "reference":
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
        init = "torch" if report.get("compiler") == "reference" else "torch, CUDA context, cuDNN handle"
        console.print(
            f"target {report['target']}; medians of {report['repeat']} fresh processes each; "
            f"process init ({init}) excluded from both sides"
        )
        if report.get("compiler") == "reference":
            console.print(Text(report["note"], "yellow"))
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
    console.print(f"target {report['target']}; medians of {report['repeat']} fetches each, in this process")
    console.print(Text(report["note"], "yellow"))
