"""What a diffusers pipeline gives its denoiser that the denoiser's
``config.json`` does not say, kept in tables by class for
graphcache.models.feed: the prompt length a pipeline pads to (``TEXT``, and
the tokens it puts before the prompt, ``PREFIX``; from a pipeline folder,
its pipeline's own ``max_sequence_length``, ``pipeline_text``), the frames a
video pipeline makes by default (``FRAMES``), the VAE's factors where a
pipeline's VAE is not Stable Diffusion's (``VAES``; from a pipeline folder,
its ``vae/config.json``, ``vae_of``), the pipelines that pass no prompt mask
(``UNMASKED``), and the inputs of a class whose form its config does not
tell (``INPUTS``: SDXL's and PixArt-Alpha's size conditions).

May import: graphcache.errors.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphcache.errors import ManifestError

# The prompt length each denoiser's pipeline pads to, where no pipeline folder says it
# (the pipelines' max_sequence_length): StableDiffusionPipeline's CLIP tokenizer (77),
# Flux's and Wan's T5 (512), SD3's T5 part (256, after CLIP's 77: PREFIX),
# PixArt-Sigma's and Sana's 300 (PixArt-Alpha: 120), AuraFlow's and Lumina 2's 256, LTX's 128.
TEXT = {
    "UNet2DConditionModel": 77,
    "SD3Transformer2DModel": 256,
    "FluxTransformer2DModel": 512,
    "WanTransformer3DModel": 512,
    "PixArtTransformer2DModel": 300,
    "SanaTransformer2DModel": 300,
    "AuraFlowTransformer2DModel": 256,
    "Lumina2Transformer2DModel": 256,
    "LTXVideoTransformer3DModel": 128,
}
# Tokens a pipeline puts before the padded prompt: StableDiffusion3Pipeline's CLIP part.
PREFIX = {"SD3Transformer2DModel": 77}
# A video pipeline's frames by default (its num_frames), where no --frames is given.
FRAMES = {"WanTransformer3DModel": 81, "CogVideoXTransformer3DModel": 49, "LTXVideoTransformer3DModel": 161}
# Pipelines whose prompt embeddings come without a mask, though the denoiser's forward takes one.
UNMASKED = frozenset({"UNet2DConditionModel"})
# CLIP ViT-H/14's tokens of one 224 px image (an image-to-video model's image embeddings).
CLIP_IMAGE_TOKENS = 257


@dataclass(frozen=True)
class Vae:
    """How the pipeline's VAE shrinks an image: pixels per latent, frames per latent frame."""

    spatial: int = 8
    temporal: int = 4


# The VAE a pipeline pairs with the denoiser where no vae/config.json says it (the factors
# its pipeline assumes without one): Sana's DC-AE (32), LTX's video VAE (32 and 8), Mochi's (8 and 6).
VAES = {
    "SanaTransformer2DModel": Vae(32, 1),
    "LTXVideoTransformer3DModel": Vae(32, 8),
    "MochiTransformer3DModel": Vae(8, 6),
}


def vae_of(folder: Path | None, name: str = "") -> Vae:
    """The VAE's factors from a pipeline folder's ``vae/config.json`` (the
    denoiser's folder or the pipeline's), else those the pipeline of class
    ``name`` assumes (``VAES``), else Stable Diffusion's 8 and Wan's 4."""
    own = VAES.get(name, Vae())
    for where in [folder, folder.parent] if folder is not None else []:
        path = where / "vae" / "config.json"
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return own
            blocks = data.get("encoder_block_out_channels") or data.get("block_out_channels")
            spatial = (
                data.get("scale_factor_spatial")
                or data.get("spatial_compression_ratio")
                or (2 ** (len(blocks) - 1) if isinstance(blocks, list) else own.spatial)
            )
            expansions = data.get("temporal_expansions")
            temporal = (
                data.get("scale_factor_temporal")
                or data.get("temporal_compression_ratio")
                or (math.prod(expansions) if isinstance(expansions, list) else own.temporal)
            )
            return Vae(int(spatial), int(temporal))
    return own


def pipeline_text(folder: Path | None, diffusers: Any) -> int | None:
    """The prompt length of the pipeline a folder's ``model_index.json``
    names (its ``__call__``'s ``max_sequence_length`` default), if any."""
    for where in [folder, folder.parent] if folder is not None else []:
        path = where / "model_index.json"
        if not path.is_file():
            continue
        try:
            name = json.loads(path.read_text(encoding="utf-8")).get("_class_name")
        except (OSError, ValueError, AttributeError):
            return None
        pipeline: Any = getattr(diffusers, str(name), None)
        try:
            default = inspect.signature(pipeline.__call__).parameters["max_sequence_length"].default
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return default if isinstance(default, int) and default > 0 else None
    return None


def _unet(torch: Any, c: Any, b: int, dtype: Any) -> dict[str, Any]:
    """UNet2DConditionModel's conditions besides the prompt: SDXL's pooled text
    embedding and six size and crop ids (``text_time``); others refused."""
    if c.class_embed_type is not None:
        raise ManifestError(f"UNet2DConditionModel with class_embed_type={c.class_embed_type!r}: not traced yet")
    if c.addition_embed_type is None:
        return {}
    if c.addition_embed_type != "text_time":
        raise ManifestError(f"UNet2DConditionModel with addition_embed_type={c.addition_embed_type!r}: not traced yet")
    pooled = c.projection_class_embeddings_input_dim - 6 * c.addition_time_embed_dim
    zeros = lambda *shape: torch.zeros(shape, dtype=dtype, device="meta")  # noqa: E731
    return {"added_cond_kwargs": {"text_embeds": zeros(b, pooled), "time_ids": zeros(b, 6)}}


def _pixart(torch: Any, c: Any, b: int, dtype: Any) -> dict[str, Any]:
    """PixArt-Alpha at 1024 px (``sample_size`` 128) conditions on the image's size and aspect ratio."""
    if c.use_additional_conditions is False or (c.use_additional_conditions is None and c.sample_size != 128):
        return {}
    zeros = lambda *shape: torch.zeros(shape, dtype=dtype, device="meta")  # noqa: E731
    return {"added_cond_kwargs": {"resolution": zeros(b, 2), "aspect_ratio": zeros(b, 1)}}


# The inputs of a class its config does not tell the form of, by class: a feeder of
# (torch, config, rows, dtype) -> keyword arguments (OWN: the parameters it makes).
INPUTS: dict[str, Callable[..., dict[str, Any]]] = {
    "UNet2DConditionModel": _unet,
    "PixArtTransformer2DModel": _pixart,
}
OWN: dict[str, tuple[str, ...]] = {"UNet2DConditionModel": ("added_cond_kwargs",), "PixArtTransformer2DModel": ()}
