"""The ``manifest`` verb: every graph a model can call, from its config.json:
traced from the model itself (graphcache.models.trace, the default; a
diffusers ``_class_name`` config by graphcache.models.diffusion), or read
from the config by the offline reader of the families it knows
(graphcache.models.config and graphcache.models.specs, ``--method config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from graphcache.cli.common import console, main
from graphcache.errors import ManifestError
from graphcache.models.config import FAMILIES, describe, locate, read
from graphcache.models.specs import (
    DEFAULT_ROUTE,
    ROUTES,
    SECONDS_PER_BUILD,
    ModelSpecs,
    lengthened,
    render,
    specs_for,
)

METHODS = ("trace", "config")
CACHES = ("both", "dynamic", "static")
# Kinds of model whose input size is the user's choice, not a length: --max-seq widens their calls.
_SIZED = ("vision encoder", "diffusion", "video diffusion")


def _sizes(order: str) -> Any:
    """A click callback: repeated ``AxB`` values as (A, B) pairs of positive ints."""

    def parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
        out = []
        for text in values:
            first, sep, second = text.lower().partition("x")
            if not (sep and first.isdigit() and second.isdigit() and int(first) > 0 and int(second) > 0):
                raise click.BadParameter(f"{text!r} is not {order} (two positive integers, e.g. 224x224)")
            out.append((int(first), int(second)))
        return tuple(out)

    return parse


@main.command("manifest")
@click.argument("config", type=click.Path(exists=True))
@click.option("--max-batch", required=True, type=click.IntRange(1, 65536), help="Largest batch the model serves.")
@click.option(
    "--max-seq",
    default=None,
    type=click.IntRange(1, 1 << 24),
    help="Longest sequence (prompt + output); audio: samples of raw audio, or frames of features. Vision "
    "encoders and diffusers models need none (their sizes are --image-size / --resolution): given, it widens "
    "their calls to every length class up to N.",
)
@click.option(
    "--image-size",
    "image_sizes",
    multiple=True,
    callback=_sizes("HxW"),
    metavar="HxW",
    help="Images of this size (pixels; repeatable) for a vision model or a multimodal model's vision towers "
    "(default: the config's image_size).",
)
@click.option(
    "--resolution",
    "resolutions",
    multiple=True,
    callback=_sizes("WxH"),
    metavar="WxH",
    help="diffusers models: images (or video frames) of this size in pixels (repeatable; default: the config's "
    "sample_size).",
)
@click.option(
    "--frames",
    default=None,
    type=click.IntRange(1, 1 << 16),
    help="diffusers video models: frames a clip (default the pipeline's: Wan 81, CogVideoX 49, LTX 161).",
)
@click.option(
    "--text-len",
    default=None,
    type=click.IntRange(1, 1 << 20),
    help="diffusers models: the prompt length the pipeline pads to (default: a pipeline folder's pipeline's, else "
    "its own: 77 CLIP tokens for Stable Diffusion's UNet, 512 T5 tokens for Flux and Wan, 256 T5 tokens after "
    "CLIP's 77 for SD3, 300 for PixArt-Sigma and Sana, ...; a class in no table needs it).",
)
@click.option(
    "--guidance/--no-guidance",
    default=True,
    show_default=True,
    help="diffusers models: each image is classifier-free guidance's pair of rows (batches up to 2 x --max-batch).",
)
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
    "--cache",
    "cache_kind",
    type=click.Choice(CACHES),
    default="both",
    show_default=True,
    help="A decoder's KV cache as generate() makes it: dynamic (transformers' default, DynamicCache), static "
    "(cache_implementation='static', StaticCache and its sliding-window layers), or both (trace only).",
)
@click.option(
    "--max-cache-len",
    default=None,
    type=click.IntRange(2, 1 << 24),
    help="Static caches of N slots, as generate's max_cache_len (or a StaticCache you make) fixes them "
    "(default: a cache of each length class up to --max-seq, as generate sizes one per call). With --cache "
    "static and no --max-seq, it is the longest sequence too.",
)
@click.option(
    "--compiled/--no-compiled",
    default=True,
    show_default=True,
    help="Also what the model hands attention under torch.compile (its masks and layouts differ from eager "
    "code's; trace only): a manifest that serves the model compiled and not.",
)
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
    max_seq: int | None,
    image_sizes: tuple[tuple[int, int], ...],
    resolutions: tuple[tuple[int, int], ...],
    frames: int | None,
    text_len: int | None,
    guidance: bool,
    route: str,
    dtype: str,
    decode: bool,
    chunk: int | None,
    cache_kind: str,
    max_cache_len: int | None,
    compiled: bool,
    beams: int,
    method: str,
    seconds_per_build: float,
    backward: bool,
    output: str | None,
) -> None:
    """Write every graph the model of CONFIG can call, as a manifest 'warm' reads.

    CONFIG is a transformers config.json, a diffusers model's config.json (a
    _class_name config), or a folder holding one (a model folder, or a
    diffusers pipeline folder: its transformer/ or unet/), read offline, no
    hub. By default the model is traced: transformers (diffusers) builds it
    from CONFIG on the meta device (no weights, no GPU) and it runs prompts
    (unpadded, left- and right-padded), decode steps on a cache (--cache:
    transformers' dynamic cache and a static one, as generate() makes them),
    --chunk prefill, its encoder and cross-attention, images (--image-size)
    and audio, for batches up to --max-batch (x --beams) and sequences up to
    --max-seq, through --route, each forward as eager code runs it and as
    torch.compile'd code does (--no-compiled: eager only); a diffusers
    denoiser runs a step at each --resolution (and --frames) for batches up
    to --max-batch images, each a guidance pair. Each call is noted as the
    graph graphcache would look up. Each entry's comment names the layers
    and phases that call it; calls no graph serves are named by feature.
    Needs no GPU.
    """
    data = read(config)  # a folder without a config.json is named here
    file = locate(config)
    diffusers = "_class_name" in data
    _check_options(diffusers, method, max_seq, image_sizes, resolutions, frames, text_len, guidance)
    _check_caches(diffusers, method, cache_kind, max_cache_len, compiled)
    if cache_kind == "static" and max_seq is None:
        max_seq = max_cache_len  # a static cache's slots bound the sequence
    command = (
        f"graphcache manifest {config} --max-batch {max_batch}"
        + (f" --max-seq {max_seq}" if max_seq else "")
        + "".join(f" --image-size {h}x{w}" for h, w in image_sizes)
        + "".join(f" --resolution {w}x{h}" for w, h in resolutions)
        + (f" --frames {frames}" if frames else "")
        + (f" --text-len {text_len}" if text_len else "")
        + ("" if guidance or not diffusers else " --no-guidance")
        + f" --route {route} --dtype {dtype}"
        + ("" if decode else " --no-decode")
        + (f" --chunk {chunk}" if chunk else "")
        + (f" --cache {cache_kind}" if cache_kind != "both" else "")
        + (f" --max-cache-len {max_cache_len}" if max_cache_len else "")
        + ("" if compiled or diffusers or method == "config" else " --no-compiled")
        + (f" --beams {beams}" if beams > 1 else "")
        + (" --method config" if method == "config" else "")
        + (" --backward" if backward else "")
    )
    if method == "config":
        assert max_seq is not None  # _check_options
        model = describe(data, str(config))
        specs = specs_for(
            model, max_batch=max_batch, max_seq=max_seq, route=route, dtype=dtype, decode=decode, chunk=chunk
        )
        kind, how, missing = model.model_type, list[str](), list(specs.missing)
    else:
        sizes = (max_batch, max_seq, image_sizes, resolutions, frames, text_len, guidance, beams)
        caches = (cache_kind,) if cache_kind != "both" else ("dynamic", "static")
        specs, kind, how, missing = _traced(
            data, config, file.parent, sizes, route, dtype, decode, chunk, (caches, max_cache_len, compiled)
        )
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


def _check_options(
    diffusers: bool,
    method: str,
    max_seq: int | None,
    image_sizes: tuple[tuple[int, int], ...],
    resolutions: tuple[tuple[int, int], ...],
    frames: int | None,
    text_len: int | None,
    guidance: bool,
) -> None:
    """Options that do not apply to CONFIG's kind of model, refused naming the one that does."""
    if diffusers:
        if method == "config":
            raise ManifestError("--method config reads transformers configs; a diffusers config is traced")
        if image_sizes:
            raise ManifestError(
                "--image-size is for transformers' vision models: a diffusers model takes --resolution WxH"
            )
        return
    given = [
        name for name, value in (("--resolution", resolutions), ("--frames", frames), ("--text-len", text_len)) if value
    ]
    given += [] if guidance else ["--no-guidance"]
    if given:
        raise ManifestError(
            f"{', '.join(given)}: for diffusers models (a _class_name config); a transformers vision model takes "
            "--image-size HxW"
        )
    if method == "config" and not max_seq:
        raise ManifestError("--method config needs --max-seq N, the longest sequence (prompt + output)")


def _traced(
    data: dict,
    config: str,
    folder: Path,
    sizes: tuple,
    route: str,
    dtype: str,
    decode: bool,
    chunk: int | None,
    speed: tuple = (("dynamic", "static"), None, True),
) -> tuple[ModelSpecs, str, list[str], list[str]]:
    """The trace of CONFIG (``folder`` holds its config.json: a pipeline's VAE is looked for beside it);
    ``speed``: the cache kinds, a static cache's slots (None: every length class) and whether compiled code
    is traced too."""
    max_batch, max_seq, image_sizes, resolutions, frames, text_len, guidance, beams = sizes
    caches, max_cache_len, compiled = speed
    if "_class_name" in data:
        from graphcache.models import diffusion  # imports diffusers when it traces: its error names the extra

        pictures = diffusion.Sizes(max_batch, resolutions, frames, text_len, guidance)
        traced = diffusion.trace(data, config, pictures, route, dtype, folder)
    else:
        from graphcache.models.build import libraries

        libraries()  # torch and transformers, or the one-line error naming the extra
        from graphcache.models import scenarios
        from graphcache.models.trace import trace

        wanted = scenarios.Sizes(
            max_batch, max_seq or 0, chunk, decode, beams, image_sizes, caches, max_cache_len, compiled
        )
        traced = trace(data, config, wanted, route, dtype)
    how = [
        f"traced: {'an' if traced.kind[0] in 'aeiou' else 'a'} {traced.kind} on the meta device through route {route}, {traced.calls} attention call(s) "
        f"in {traced.seconds:.1f} s; {traced.layers}",
    ]
    specs = traced.specs
    if max_seq and traced.kind in _SIZED:
        specs = ModelSpecs()
        for spec, users in traced.specs.users.items():
            # Each exact call its class serves: a call's own lengths say whether it is cross-attention.
            for call in traced.calls_of.get(spec, [spec]):
                for long in lengthened(call, max_seq):
                    for user in users:
                        specs.add(long, user if long == spec else f"{user} (widened to --max-seq {max_seq})")
        how.append(f"widened to every length class up to --max-seq {max_seq}")
    missing = [f"{code}: {message} ({'; '.join(users)})" for (code, message), users in sorted(traced.refused.items())]
    missing += [why if why.startswith("static cache") else f"tower not traced: {why}" for why in traced.untraced]
    return specs, traced.model_type, how, missing


def _check_caches(diffusers: bool, method: str, cache_kind: str, max_cache_len: int | None, compiled: bool) -> None:
    """The cache and compile options where they cannot apply, refused naming what does."""
    given = [name for name, on in (("--cache", cache_kind != "both"), ("--max-cache-len", max_cache_len)) if on]
    given += [] if compiled else ["--no-compiled"]
    if given and (diffusers or method == "config"):
        what = "a diffusers config" if diffusers else "--method config"
        raise ManifestError(f"{', '.join(given)}: for traced transformers models, not {what}; leave them out")
    if max_cache_len and cache_kind == "dynamic":
        raise ManifestError("--max-cache-len sizes static caches: pass --cache static or both, or leave it out")


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
