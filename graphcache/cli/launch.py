"""Verbs that run a program: record (a script's SDPA calls as a manifest) and
run (an unchanged program with graphcache at both doors, as
``opentelemetry-instrument`` or ``ddtrace-run`` wrap one)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from graphcache.cli.common import Context, chosen_compiler, console, err_console, fail, main, pass_ctx
from graphcache.errors import GraphCacheError


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
@click.option(
    "--shape-classes",
    type=click.Choice(["pow2", "exact"]),
    default=None,
    help="Write the calls' length classes (pow2) or their exact specs (default: $GRAPHCACHE_SHAPE_CLASSES, else pow2).",
)
@click.option(
    "--max-batch",
    default=None,
    type=click.IntRange(1, 65536),
    help="Also write every call's graphs for each batch class up to N (beams included: batch x beams), "
    "unpadded and padded, so a batch-1 recording serves padded batches; N counts inputs: a call of several "
    "rows per input (an image's windows) is written at that many rows for each number of inputs.",
)
@click.option(
    "--max-seq",
    default=None,
    type=click.IntRange(1, 1 << 24),
    help="Also write every call's graphs for each length class up to N, so a run at one resolution or prompt "
    "length serves longer ones (queries and keys grow together where the call had as many of each, else each "
    "side to every class).",
)
@click.option(
    "--backward",
    is_flag=True,
    help="Record a training step: every call's backward graph too (kind: backward), and a call that needs "
    "gradients as the forward that writes the stats its backward reads.",
)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def record_cmd(output: str, script: str, args: tuple[str, ...], **options: Any) -> None:
    """Run SCRIPT [ARGS...] as python would, and write the manifest of its SDPA calls.

    Every torch scaled_dot_product_attention call the script makes (directly,
    through nn.MultiheadAttention, or a model library's "sdpa" attention) is
    noted; the manifest is what 'graphcache warm' reads. Runs on a CPU host.
    Under length classes (the default) it names one graph per class, with
    the exact shapes each serves in comments.
    """
    try:
        from graphcache.torch.recording import run_script
    except ImportError as exc:
        raise click.UsageError(
            f"graphcache record needs torch ({exc}): pip install torch (a CPU build is enough)"
        ) from exc
    try:
        recorder = run_script(script, args, output, **options)  # dtype, shape_classes, max_batch, max_seq, backward
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
    graphs = len(recorder.graphs())
    console.print(
        f"wrote {output}: {len(recorder.specs)} spec(s) from {recorder.calls()} SDPA call(s)"
        + (
            f", {graphs} graph(s) under shape classes {recorder.shape_classes}"
            if recorder.shape_classes != "exact"
            else ""
        )
        + (f"; {len(recorder.backwards)} backward spec(s)" if recorder.training else ""),
        highlight=False,
    )
    for what, reasons in (("not a cuDNN graph", recorder.ineligible), ("no backward graph", recorder.no_backward)):
        for (code, message), count in sorted(reasons.items()):
            console.print(f"  {what} ({code}, {count} call(s)): {message}", highlight=False)


@main.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--compiler",
    "compiler_name",
    default=None,
    help="Compiler whose graphs serve the program: cudnn (the default: this GPU's cache, GRAPHCACHE_SERVER / "
    "STORE / DIR), reference (its graphs on the tensors' device, a CPU included) or module:Class.",
)
@click.option(
    "--record",
    "record_to",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the manifest of every SDPA call the program's processes made, at both doors, when it exits 0.",
)
@click.option(
    "--dtype",
    type=click.Choice(["float16", "bfloat16"]),
    default=None,
    help="With --record: write every spec in this dtype (a float32 CPU run records what the GPU will run).",
)
@click.option(
    "--shape-classes",
    type=click.Choice(["pow2", "exact"]),
    default=None,
    help="With --record: the calls' length classes (pow2) or their exact specs (default: $GRAPHCACHE_SHAPE_CLASSES).",
)
@click.option(
    "--backward",
    is_flag=True,
    help="With --record: a training step's calls, each with its backward graph (as graphcache record --backward).",
)
@click.option(
    "--stats",
    "stats_to",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the run's counters (per process and summed: calls, served, fallbacks by reason and door) "
    "as JSON, readable by you alone (mode 0600), and print a summary line on stderr.",
)
@click.option(
    "--stats-argv",
    is_flag=True,
    help="With --stats: also write each process's command line (argv), which may hold secrets; left out by default.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_ctx
def run_cmd(
    ctx: Context,
    compiler_name: str | None,
    record_to: str | None,
    dtype: str | None,
    shape_classes: str | None,
    backward: bool,
    stats_to: str | None,
    stats_argv: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND (graphcache run [OPTIONS] -- COMMAND ...) with graphcache at both doors.

    Every Python process COMMAND starts serves, once it imports torch, torch's
    SDPA through graphcache.torch.patch() and PyTorch's own cuDNN attention op
    through graphcache.torch.install(), from this host's cache (a miss does
    what GRAPHCACHE_SDPA_ON_MISS says). The program is not changed. Exits
    with COMMAND's status, also when --stats or --record cannot be written
    (each says why in an error line).
    """
    from graphcache.ops import launch

    if compiler_name:
        chosen_compiler(ctx, compiler_name)  # a name that names no compiler fails here, before the program runs
    if record_to and not Path(record_to).resolve().parent.is_dir():
        fail(f"--record {record_to}: the folder {Path(record_to).resolve().parent} does not exist")
    folder = tempfile.mkdtemp(prefix="graphcache-run-")
    try:
        env = launch.child_env(folder, compiler_name, bool(record_to), dtype, backward)
        status = _run_child(list(command), env)
        found = launch.parts(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    # What the run writes for itself never changes the program's status: a
    # failure to write it is said in one error line, and the status stays.
    if stats_to:
        try:
            _report(launch.totals(found), found, stats_to, stats_argv)
        except OSError as exc:
            _not_written("--stats", stats_to, exc, command[0], status)
    if record_to and status == 0:
        try:
            recorder = launch.write_manifest(found, record_to, dtype, shape_classes)
        except (GraphCacheError, OSError) as exc:
            _not_written("--record", record_to, exc, command[0], status)
        else:
            err_console.print(
                f"graphcache run: wrote {record_to}: {len(recorder.specs)} spec(s) from {recorder.calls()} SDPA call(s)",
                highlight=False,
            )
    elif record_to:
        err_console.print(
            Text.assemble(("error:", "red"), f" {command[0]} exited with status {status}; no manifest written")
        )
    sys.exit(status)


def _run_child(command: list[str], env: dict[str, str]) -> int:
    """Run ``command``; SIGTERM and SIGHUP are passed on to it (Ctrl-C reaches
    it from the terminal, as to this process). Its status, 128 + N for signal N."""
    try:
        child = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        fail(f"{command[0]}: command not found", 127)
        raise  # unreachable: fail exits
    except PermissionError:
        fail(f"{command[0]}: permission denied", 126)
        raise

    def forward(signum: int, frame: Any) -> None:
        child.send_signal(signum)

    handlers = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status = child.wait()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        signal.signal(signal.SIGINT, interrupt)
    return 128 - status if status < 0 else status


def _not_written(option: str, path: str, exc: Exception, program: str, status: int) -> None:
    why = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror else str(exc)
    err_console.print(
        Text.assemble(
            ("error:", "red"), f" {option} {path}: not written ({why}); {program} exited with status {status}"
        )
    )


def _report(summed: dict[str, Any], found: list[dict[str, Any]], path: str, argv: bool = False) -> None:
    """The run's counters as JSON at ``path``, mode 0600 whether it is new
    or replaced (the counters say what ran; ``argv``: each process's command
    line too, which may hold a secret a program was given)."""
    processes = found if argv else [{k: v for k, v in part.items() if k != "argv"} for part in found]
    data = json.dumps({"total": summed, "processes": processes}, indent=2, default=str).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file that was there keeps its mode otherwise
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    share = f"{100 * summed['served']:.1f} %" if summed["calls"] else "-"
    err_console.print(
        f"graphcache run: {summed['processes']} process(es), {summed['calls']} SDPA call(s), "
        f"{summed['hits']} served from the store, {summed['built_here']} by graphs built here ({share} served); "
        f"fallbacks {summed['fallbacks'] or 'none'}",
        highlight=False,
    )
