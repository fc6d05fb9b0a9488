"""``graphcache manifest`` for a diffusers model: the denoiser (a UNet or a
diffusion transformer) built from its ``config.json`` (a ``_class_name``
config) on the meta device, no weights, and run as its pipeline runs it,
while the recorder of graphcache.models.trace notes every attention call.

Per resolution (``--resolution WxH``, pixels; default the config's
``sample_size`` latents) and batch (each class up to ``--max-batch`` images,
times 2 for classifier-free guidance's pair of a conditional and an
unconditional row, ``guidance``), one denoising step: the latents the VAE
makes of such an image (``W / 8`` by ``H / 8``, the VAE's own factors where
the pipeline folder holds ``vae/config.json``), the prompt's embeddings at
the length the pipeline pads every prompt to (``--text-len``; the defaults
are ``TEXT``'s), and for a video model ``--frames`` frames (the VAE's
temporal factor, 4 by default, gives the latent frames). A step's
attention does not depend on the timestep or the values, so one step of
each size is every call the pipeline makes at that size.

Denoisers the trace knows how to feed are ``INPUTS``'s; every other
diffusers class is refused naming them (record a run instead).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphcache.errors import ManifestError

EXTRA = "diffusers"
# The prompt length each denoiser's pipeline pads to: StableDiffusionPipeline's
# CLIP tokenizer (77), Flux's and Wan's T5 max_sequence_length (512), SD3's T5
# part (256), after which SD3 appends CLIP's 77 (StableDiffusion3Pipeline).
TEXT = {
    "UNet2DConditionModel": 77,
    "SD3Transformer2DModel": 256,
    "FluxTransformer2DModel": 512,
    "WanTransformer3DModel": 512,
}
SD3_CLIP_TOKENS = 77
VIDEO = frozenset({"WanTransformer3DModel"})


@dataclass(frozen=True)
class Sizes:
    """What a diffusion trace covers."""

    max_batch: int
    resolutions: tuple[tuple[int, int], ...] = ()  # (W, H) in pixels; none: the config's sample_size
    frames: int | None = None  # video models: frames per clip
    text_len: int | None = None  # none: the pipeline's default (TEXT)
    guidance: bool = True  # classifier-free guidance: each image is a pair of rows

    @property
    def rows(self) -> int:
        return self.max_batch * (2 if self.guidance else 1)


@dataclass(frozen=True)
class Vae:
    """How the pipeline's VAE shrinks an image: pixels per latent, frames per latent frame."""

    spatial: int = 8
    temporal: int = 4


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


def vae_of(folder: Path | None) -> Vae:
    """The VAE's factors from a pipeline folder's ``vae/config.json`` (the
    denoiser's folder or the pipeline's), else Stable Diffusion's 8 and Wan's 4."""
    for where in [folder, folder.parent] if folder is not None else []:
        path = where / "vae" / "config.json"
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return Vae()
            blocks = data.get("block_out_channels")
            spatial = data.get("scale_factor_spatial") or (2 ** (len(blocks) - 1) if isinstance(blocks, list) else 8)
            return Vae(
                int(spatial), int(data.get("scale_factor_temporal") or data.get("temporal_compression_ratio") or 4)
            )
    return Vae()


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
    config read from ``source``; ``folder`` holds it, for the VAE's factors).

    Returns graphcache.models.trace's ``Traced``. Raises ManifestError naming
    the extra where diffusers is missing, a route other than sdpa, a class the
    trace cannot feed, sizes the model cannot take, and the model's own failure."""
    name = str(data.get("_class_name"))
    if route != "sdpa":
        raise ManifestError(
            f"{source}: diffusers' {name} calls torch's scaled_dot_product_attention itself: use --route sdpa "
            "(graphcache.torch.patch()); --route graphcache is transformers' attention backend"
        )
    video = name in VIDEO
    if sizes.frames is not None and not video and name in INPUTS:
        raise ManifestError(f"{source}: {name} makes images: --frames is for video models ({', '.join(sorted(VIDEO))})")
    vae = vae_of(folder)
    if name in INPUTS:  # what the config alone refuses, before torch and diffusers are imported
        resolutions = list(sizes.resolutions) or _own(data, vae, name, source)
        for size in resolutions:
            _latent(size, vae, _patch(name, data), name)
    torch, diffusers = libraries()
    cls = getattr(diffusers, name, None)
    if cls is None or not hasattr(cls, "from_config"):
        raise ManifestError(f"{source}: _class_name {name!r} is not a model diffusers {diffusers.__version__} has")
    if name not in INPUTS:
        raise ManifestError(
            f"{source}: graphcache manifest does not know the inputs of diffusers' {name} (it traces "
            f"{', '.join(INPUTS)}): record a run with graphcache record (--max-seq widens it to larger sizes)"
        )
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
    config = model.config
    frames = (sizes.frames or 81) if video else None  # Wan's pipeline: num_frames=81
    text = sizes.text_len or TEXT[name]
    feed = INPUTS[name]

    def start(phase: Callable[[str], None]) -> tuple[str, Callable[[bool], None], dict[str, str]]:
        def scenario(probe: bool) -> None:
            for width, height in resolutions[:1] if probe else resolutions:
                for b in [2] if probe else _batches(sizes.rows):
                    what = f"{width}x{height}" + (f", {frames} frames" if frames else "")
                    pair = ", guidance pair" if sizes.guidance and b > 1 else ""
                    phase(f"denoise {what}{pair}")
                    kwargs = feed(torch, config, (width, height), frames, b, text, model.dtype, vae)
                    with torch.no_grad():
                        model(**kwargs)

        return ("video diffusion" if video else "diffusion"), scenario, {}

    from graphcache.models.trace import run

    traced = run(model, name, f"diffusers {name}", source, route, dtype, 1 << 16, cut, start)
    traced.seconds = time.perf_counter() - started
    return traced


def _own(data: dict[str, Any], vae: Vae, name: str, source: str) -> list[tuple[int, int]]:
    size = data.get("sample_size")
    if isinstance(size, int) and size > 0:
        return [(size * vae.spatial, size * vae.spatial)]
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return [(int(size[1]) * vae.spatial, int(size[0]) * vae.spatial)]
    raise ManifestError(f"{source}: {name}'s config fixes no sample_size: pass --resolution WxH (pixels)")


def _patch(name: str, data: dict[str, Any]) -> int:
    """Latents per token side: SD3's patch, Flux's 2 x 2 packing, Wan's spatial patch; a UNet's 1."""
    if name == "FluxTransformer2DModel":
        return 2
    patch = data.get("patch_size", 2 if name == "SD3Transformer2DModel" else 1)
    return int(patch[-1] if isinstance(patch, (list, tuple)) else patch)


def _batches(largest: int) -> list[int]:
    out, size = [], 1
    while size < largest:
        out.append(size)
        size *= 2
    return out + [largest]


def _latent(size: tuple[int, int], vae: Vae, multiple: int, name: str) -> tuple[int, int]:
    """(h, w) latents of an image of ``size`` (W, H), refused unless they divide by ``multiple``."""
    width, height = size
    if width % (vae.spatial * multiple) or height % (vae.spatial * multiple):
        raise ManifestError(
            f"--resolution {width}x{height}: {name} takes images whose sides are multiples of "
            f"{vae.spatial * multiple} (the VAE's {vae.spatial} x the model's patch of {multiple})"
        )
    return height // vae.spatial, width // vae.spatial


def _zeros(torch: Any, dtype: Any, *shape: int) -> Any:
    return torch.zeros(shape, dtype=dtype, device="meta")


def _unet(torch: Any, c: Any, size: tuple[int, int], frames: Any, b: int, text: int, dtype: Any, vae: Vae) -> dict:
    h, w = _latent(size, vae, 1, "UNet2DConditionModel")
    cross = c.encoder_hid_dim or c.cross_attention_dim
    cross = cross[0] if isinstance(cross, (list, tuple)) else cross
    kwargs: dict[str, Any] = {
        "sample": _zeros(torch, dtype, b, c.in_channels, h, w),
        "timestep": torch.full((b,), 999, dtype=torch.long, device="meta"),
        "encoder_hidden_states": _zeros(torch, dtype, b, text, int(cross)),
    }
    if c.addition_embed_type == "text_time":  # SDXL: the pooled text embedding and six size/crop ids
        pooled = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
        kwargs["added_cond_kwargs"] = {
            "text_embeds": _zeros(torch, dtype, b, pooled),
            "time_ids": _zeros(torch, dtype, b, 6),
        }
    elif c.addition_embed_type is not None:
        raise ManifestError(f"UNet2DConditionModel with addition_embed_type={c.addition_embed_type!r}: not traced yet")
    if c.class_embed_type is not None:
        raise ManifestError(f"UNet2DConditionModel with class_embed_type={c.class_embed_type!r}: not traced yet")
    if c.time_cond_proj_dim:  # LCM: the guidance scale's embedding
        kwargs["timestep_cond"] = _zeros(torch, dtype, b, c.time_cond_proj_dim)
    return kwargs


def _sd3(torch: Any, c: Any, size: tuple[int, int], frames: Any, b: int, text: int, dtype: Any, vae: Vae) -> dict:
    h, w = _latent(size, vae, int(c.patch_size), "SD3Transformer2DModel")
    return {
        "hidden_states": _zeros(torch, dtype, b, c.in_channels, h, w),
        "encoder_hidden_states": _zeros(torch, dtype, b, SD3_CLIP_TOKENS + text, c.joint_attention_dim),
        "pooled_projections": _zeros(torch, dtype, b, c.pooled_projection_dim),
        "timestep": _zeros(torch, dtype, b),
    }


def _flux(torch: Any, c: Any, size: tuple[int, int], frames: Any, b: int, text: int, dtype: Any, vae: Vae) -> dict:
    h, w = _latent(size, vae, 2, "FluxTransformer2DModel")  # FluxPipeline packs 2x2 latents into one token
    tokens = (h // 2) * (w // 2)
    kwargs: dict[str, Any] = {
        "hidden_states": _zeros(torch, dtype, b, tokens, c.in_channels),
        "encoder_hidden_states": _zeros(torch, dtype, b, text, c.joint_attention_dim),
        "pooled_projections": _zeros(torch, dtype, b, c.pooled_projection_dim),
        "timestep": _zeros(torch, dtype, b),
        "img_ids": _zeros(torch, dtype, tokens, 3),
        "txt_ids": _zeros(torch, dtype, text, 3),
    }
    if c.guidance_embeds:
        kwargs["guidance"] = _zeros(torch, dtype, b)
    return kwargs


def _wan(torch: Any, c: Any, size: tuple[int, int], frames: Any, b: int, text: int, dtype: Any, vae: Vae) -> dict:
    h, w = _latent(size, vae, int(c.patch_size[1]), "WanTransformer3DModel")
    latent_frames = (int(frames) - 1) // vae.temporal + 1
    kwargs: dict[str, Any] = {
        "hidden_states": _zeros(torch, dtype, b, c.in_channels, latent_frames, h, w),
        "timestep": torch.full((b,), 999, dtype=torch.long, device="meta"),
        "encoder_hidden_states": _zeros(torch, dtype, b, text, c.text_dim),
    }
    if c.image_dim:  # image-to-video: CLIP's 257 image tokens (two images where pos_embed_seq_len says so)
        pairs = c.pos_embed_seq_len // 257 if c.pos_embed_seq_len else 1
        kwargs["encoder_hidden_states_image"] = _zeros(torch, dtype, b * pairs, 257, c.image_dim)
    return kwargs


INPUTS: dict[str, Callable[..., dict]] = {
    "UNet2DConditionModel": _unet,
    "SD3Transformer2DModel": _sd3,
    "FluxTransformer2DModel": _flux,
    "WanTransformer3DModel": _wan,
}
