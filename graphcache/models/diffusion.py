"""``graphcache manifest`` for a diffusers model: the denoiser (a UNet or a
diffusion transformer) built from its ``config.json`` (a ``_class_name``
config) on the meta device, no weights, and run as its pipeline runs it,
while the recorder of graphcache.models.trace notes every attention call.

Per resolution (``--resolution WxH``, pixels; default the config's
``sample_size`` latents) and batch (each class up to ``--max-batch`` images,
times 2 for classifier-free guidance's pair of a conditional and an
unconditional row, ``guidance``), one denoising step: the latents the VAE
makes of such an image, the prompt's embeddings at the length the pipeline
pads every prompt to (``--text-len``), and for a video model ``--frames``
frames. A step's attention does not depend on the timestep or the values,
so one step of each size is every call the pipeline makes at that size.

The inputs are derived from the model's forward signature and its config
(graphcache.models.feed's ``Feed``), for any class diffusers builds; what
the config cannot say is kept in tables by class (graphcache.models.pipelines:
``TEXT``, ``PREFIX``, ``FRAMES``, ``VAES``, ``UNMASKED``, ``INPUTS``, which
this module re-exports). What stops a class is named in one line: an input
the trace cannot make, a model that is not a denoiser, the model's own
refusal of every candidate.

May import: graphcache.errors, graphcache.models.feed, graphcache.models.pipelines,
graphcache.models.build, graphcache.models.trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphcache.errors import ManifestError
from graphcache.models.feed import Feed, Sizes, feed
from graphcache.models.pipelines import FRAMES, INPUTS, PREFIX, TEXT, UNMASKED, VAES, Vae, pipeline_text, vae_of

__all__ = [
    "EXTRA",
    "FRAMES",
    "INPUTS",
    "PREFIX",
    "TEXT",
    "UNMASKED",
    "VAES",
    "Feed",
    "Sizes",
    "Vae",
    "feed",
    "libraries",
    "pipeline_text",
    "trace",
    "vae_of",
]

EXTRA = "diffusers"


def libraries() -> tuple[Any, Any]:
    """torch and diffusers, or ManifestError naming the extra that has them."""
    try:
        import diffusers
        import torch
    except ImportError as exc:
        raise ManifestError(
            f"graphcache manifest traces a diffusers model with torch and diffusers ({exc.name or exc} is not "
            f"installed): pip install 'graphcache[{EXTRA}]'"
        ) from None
    return torch, diffusers


def trace(
    data: dict[str, Any],
    source: str,
    sizes: Sizes,
    route: str = "sdpa",
    dtype: str = "bfloat16",
    folder: Path | None = None,
    cut: bool = True,
) -> Any:
    """Trace the diffusers model of config mapping ``data`` (a ``_class_name``
    config read from ``source``; ``folder`` holds it, for the VAE's factors
    and the pipeline's prompt length).

    Returns graphcache.models.trace's ``Traced``. Raises ManifestError naming
    the extra where diffusers is missing, a route other than sdpa, a class
    that is not a denoiser, an input the trace cannot make, sizes the model
    cannot take, and the model's own refusal of every form of its inputs."""
    name = str(data.get("_class_name"))
    if route != "sdpa":
        raise ManifestError(
            f"{source}: diffusers' {name} calls torch's scaled_dot_product_attention itself: use --route sdpa "
            "(graphcache.torch.patch()); --route graphcache is transformers' attention backend"
        )
    torch, diffusers = libraries()
    cls = getattr(diffusers, name, None)
    if cls is None or not hasattr(cls, "from_config"):
        raise ManifestError(f"{source}: _class_name {name!r} is not a model diffusers {diffusers.__version__} has")
    vae = vae_of(folder, name)
    started = time.perf_counter()
    try:
        with torch.device("meta"):
            model = cls.from_config(data)
    except Exception as exc:  # noqa: BLE001 - diffusers' own refusal of the config, named
        from graphcache.models.build import one_line

        raise ManifestError(f"{source}: diffusers cannot build {name} from this config: {one_line(exc)}") from None
    quiet = diffusers.utils.logging.get_verbosity()
    diffusers.utils.logging.set_verbosity_error()  # its note on modules kept in float32 concerns weights: none here
    try:
        model = model.to(getattr(torch, dtype)).eval()
    finally:
        diffusers.utils.logging.set_verbosity(quiet)
    steps = feed(model, name, sizes, vae, folder, diffusers, source)
    resolutions = list(sizes.resolutions) or _own(data, vae, name, source)
    for size in resolutions:
        steps.latent(size)  # sizes the model cannot take, refused before it runs
    video = steps.frames is not None

    def start(phase: Callable[[str], None]) -> tuple[str, Callable[[bool], None], dict[str, str]]:
        phase(f"inputs of {name}")
        steps.settle(torch, model, resolutions[0], source)

        def scenario(probe: bool) -> None:
            for width, height in resolutions[:1] if probe else resolutions:
                for b in [2] if probe else _batches(sizes.rows):
                    what = f"{width}x{height}" + (f", {steps.frames} frames" if video else "")
                    pair = ", guidance pair" if sizes.guidance and b > 1 else ""
                    phase(f"denoise {what}{pair}")
                    kwargs = steps.kwargs(torch, (width, height), b, model.dtype, steps.layout, steps.width)
                    with torch.no_grad():
                        model(**kwargs)

        return ("video diffusion" if video else "diffusion"), scenario, {}

    from graphcache.models.trace import run

    traced = run(model, name, f"diffusers {name}", source, route, dtype, 1 << 16, cut, start)
    traced.seconds = time.perf_counter() - started
    return traced


def _own(data: dict[str, Any], vae: Vae, name: str, source: str) -> list[tuple[int, int]]:
    """The config's own size in pixels: ``sample_size`` latents (CogVideoX: ``sample_height`` x ``sample_width``)."""
    size = data.get("sample_size")
    if isinstance(size, int) and size > 0:
        return [(size * vae.spatial, size * vae.spatial)]
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return [(int(size[1]) * vae.spatial, int(size[0]) * vae.spatial)]
    height, width = data.get("sample_height"), data.get("sample_width")
    if isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0:
        return [(width * vae.spatial, height * vae.spatial)]
    raise ManifestError(f"{source}: {name}'s config fixes no sample_size: pass --resolution WxH (pixels)")


def _batches(largest: int) -> list[int]:
    out, size = [], 1
    while size < largest:
        out.append(size)
        size *= 2
    return out + [largest]
