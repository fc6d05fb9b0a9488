"""The ``manifest`` verb: every graph a model can call, from its config.json:
traced from the model itself (graphcache.models.trace, the default), or read
from the config by the offline reader of the families it knows
(graphcache.models.config and graphcache.models.specs, ``--method config``)."""

from __future__ import annotations

from pathlib import Path

import click

from graphcache.cli.common import console, main
from graphcache.models.config import FAMILIES, describe, read
from graphcache.models.specs import DEFAULT_ROUTE, ROUTES, SECONDS_PER_BUILD, ModelSpecs, render, specs_for

METHODS = ("trace", "config")


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
    "--beams",
    default=1,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Beam search width: batches up to --max-batch x --beams rows (trace only).",
)
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="trace",
    show_default=True,
    help="trace: build the model from CONFIG with transformers (meta device: no weights, no GPU) and note "
    "every attention call (needs torch and transformers: the hf extra); config: read CONFIG offline "
    f"(no torch; the families {', '.join(FAMILIES)}).",
)
@click.option(
    "--seconds-per-build",
    default=SECONDS_PER_BUILD,
    show_default=True,
    type=click.FloatRange(0, None),
    help="For the cold-build estimate (0.4 s: a cuDNN SDPA build, sglang#4650; see docs/benchmarks.md).",
)
@click.option(
    "--backward",
    is_flag=True,
    help="Training graphs too: each spec's backward (kind: backward) and its forward writing the stats the "
    "backward reads (generate_stats: true).",
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
    beams: int,
    method: str,
    seconds_per_build: float,
    backward: bool,
    output: str | None,
) -> None:
    """Write every graph the model of CONFIG can call, as a manifest 'warm' reads.

    CONFIG is a transformers config.json or a model folder holding one (read
    offline, no hub). By default the model is traced: transformers builds it
    from CONFIG on the meta device (no weights, no GPU) and it runs prompts
    (unpadded, left- and right-padded), decode steps on a cache, --chunk
    prefill, its encoder and cross-attention, for batches up to --max-batch
    (x --beams) and sequences up to --max-seq, through --route; each call is
    noted as the graph graphcache would look up. Each entry's comment names
    the layers and phases that call it; calls no graph serves are named by
    feature. Needs no GPU.
    """
    data = read(config)
    command = (
        f"graphcache manifest {config} --max-batch {max_batch} --max-seq {max_seq} --route {route} --dtype {dtype}"
        + ("" if decode else " --no-decode")
        + (f" --chunk {chunk}" if chunk else "")
        + (f" --beams {beams}" if beams > 1 else "")
        + (" --method config" if method == "config" else "")
        + (" --backward" if backward else "")
    )
    if method == "config":
        model = describe(data, str(config))
        specs = specs_for(
            model, max_batch=max_batch, max_seq=max_seq, route=route, dtype=dtype, decode=decode, chunk=chunk
        )
        kind, how, missing = model.model_type, list[str](), list(specs.missing)
    else:
        specs, kind, how, missing = _traced(data, config, max_batch, max_seq, route, dtype, decode, chunk, beams)
    if backward:
        missing += _with_backward(specs)
    count = len(specs.users)
    estimate = count * seconds_per_build
    header = [
        command,
        f"model_type {kind}: {count} graph(s), cold build ~{_duration(estimate)} at {seconds_per_build:g} s per graph",
        *how,
        *(f"not covered: {what}" for what in missing),
    ]
    text = render(specs, header)
    if output:
        Path(output).write_text(text)
    else:
        click.echo(text, nl=False)
    where = f"wrote {output}: " if output else ""
    summary = f"{where}{count} graph(s) for {kind} on route {route}, cold build ~{_duration(estimate)}"
    (console.print if output else _stderr)(f"{summary} at {seconds_per_build:g} s per graph")
    for what in missing:
        _stderr(f"not covered: {what}")


def _traced(
    data: dict,
    config: str,
    max_batch: int,
    max_seq: int,
    route: str,
    dtype: str,
    decode: bool,
    chunk: int | None,
    beams: int,
) -> tuple[ModelSpecs, str, list[str], list[str]]:
    from graphcache.models.build import libraries

    libraries()  # torch and transformers, or the one-line error naming the extra
    from graphcache.models import scenarios
    from graphcache.models.trace import trace

    sizes = scenarios.Sizes(max_batch, max_seq, chunk, decode, beams)
    traced = trace(data, str(config), sizes, route, dtype)
    how = [
        f"traced: a {traced.kind} on the meta device through route {route}, {traced.calls} attention call(s) "
        f"in {traced.seconds:.1f} s; {traced.layers}",
    ]
    missing = [f"{code}: {message} ({'; '.join(users)})" for (code, message), users in sorted(traced.refused.items())]
    missing += [f"tower not traced: {why}" for why in traced.untraced]
    return traced.specs, traced.model_type, how, missing


def _with_backward(specs: ModelSpecs) -> list[str]:
    """Add each spec's training graphs (graphcache.spec.backward.training):
    the forward that writes the stats and its backward, each called by the
    spec's callers; returns, once per reason, the specs that have none."""
    from graphcache.errors import SpecError
    from graphcache.spec.backward import training

    lacking: dict[str, list[str]] = {}
    for spec, users in list(specs.users.items()):
        try:
            pair = training(spec)
        except SpecError as exc:
            lacking.setdefault(f"backward ({exc.field}): {exc}", []).append(spec.summary())
            continue
        for user in users:
            specs.add(pair[0], user)
            specs.add(pair[1], f"{user} (backward)")
    return [f"{why} ({len(which)} spec(s), e.g. {which[0]})" for why, which in lacking.items()]


def _stderr(text: str) -> None:
    click.echo(text, err=True)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
