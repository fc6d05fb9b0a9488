"""The ``manifest`` verb: every graph a model can call, from its config.json
(graphcache.modelconfig reads it, graphcache.modelspecs lists the specs)."""

from __future__ import annotations

from pathlib import Path

import click

from graphcache.cli.common import console, main
from graphcache.modelconfig import describe, read
from graphcache.modelspecs import DEFAULT_ROUTE, ROUTES, SECONDS_PER_BUILD, render, specs_for


@main.command("manifest")
@click.argument("config", type=click.Path(exists=True))
@click.option("--max-batch", required=True, type=click.IntRange(1, 65536), help="Largest batch the model serves.")
@click.option("--max-seq", required=True, type=click.IntRange(1, 1 << 24), help="Longest sequence (prompt + output).")
@click.option(
    "--route",
    type=click.Choice(ROUTES),
    default=DEFAULT_ROUTE,
    show_default=True,
    help="sdpa: graphcache.torch.patch() on transformers' sdpa (padding as mask tensors: bias graphs); "
    "graphcache: the graphcache attention backend (graphcache.hf; padding as ragged offsets).",
)
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--decode/--no-decode", default=True, show_default=True, help="Include decode steps (one query).")
@click.option("--chunk", default=None, type=click.IntRange(1, 1 << 24), help="Chunked prefill with chunks up to C.")
@click.option(
    "--seconds-per-build",
    default=SECONDS_PER_BUILD,
    show_default=True,
    type=click.FloatRange(0, None),
    help="For the cold-build estimate (0.4 s: a cuDNN SDPA build, sglang#4650; see docs/benchmarks.md).",
)
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False), help="Write here (default: stdout).")
def manifest_cmd(
    config: str,
    max_batch: int,
    max_seq: int,
    route: str,
    dtype: str,
    decode: bool,
    chunk: int | None,
    seconds_per_build: float,
    output: str | None,
) -> None:
    """Write every graph the model of CONFIG can call, as a manifest 'warm' reads.

    CONFIG is a transformers config.json or a model folder holding one (read
    offline). Lists prefill and decode graphs for batches up to --max-batch
    and sequences up to --max-seq, per layer type (full and sliding-window
    layers), for the encoder, decoder and cross-attention of
    encoder-decoders, under length classes; each entry's comment names the
    layers that call it. A model graphcache cannot describe is refused,
    naming what is missing. Needs no GPU.
    """
    data = read(config)
    model = describe(data, str(config))
    specs = specs_for(model, max_batch=max_batch, max_seq=max_seq, route=route, dtype=dtype, decode=decode, chunk=chunk)
    count = len(specs.users)
    estimate = count * seconds_per_build
    header = [
        f"graphcache manifest {config} --max-batch {max_batch} --max-seq {max_seq} --route {route} --dtype {dtype}"
        + ("" if decode else " --no-decode")
        + (f" --chunk {chunk}" if chunk else ""),
        f"model_type {model.model_type}: {count} graph(s), cold build ~{_duration(estimate)} "
        f"at {seconds_per_build:g} s per graph",
        *(f"not covered: {what}" for what in specs.missing),
    ]
    text = render(specs, header)
    if output:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=False)
    where = f"wrote {output}: " if output else ""
    summary = f"{where}{count} graph(s) for {model.model_type} on route {route}, cold build ~{_duration(estimate)}"
    (console.print if output else _stderr)(f"{summary} at {seconds_per_build:g} s per graph")
    for what in specs.missing:
        _stderr(f"not covered: {what}")


def _stderr(text: str) -> None:
    click.echo(text, err=True)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
