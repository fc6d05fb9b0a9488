"""One denoising step's inputs of a diffusers denoiser, derived from its
forward's signature and its config (``Feed``, made by ``feed``), for any
class diffusers builds: the latents (``hidden_states`` or ``sample``) with
the config's ``in_channels`` at the resolution's latent size, whose side
divides by the config's ``patch_size`` (a video's frames by its temporal
patch); the prompt's embeddings at the width the config names for its text
encoder (``caption_channels``, ``joint_attention_dim``, ``text_embed_dim``,
``text_dim``, ``cap_feat_dim``, ``cross_attention_dim`` ...); the timestep,
the guidance scale where ``guidance_embeds``, pooled projections, the
prompt's mask where the forward takes one, packed latents with their
position ids where it takes ``img_ids`` (the Flux family), the latent
frames and sides where it takes ``num_frames``, ``height`` and ``width``
(LTX), size conditions (``original_size``, ``target_size``,
``crop_coords``). Which form of latents (a video's channels before or after
its frames) and which text width the model takes is settled by running it
on the meta device, one candidate at a time (``Feed.settle``). What the
config cannot say comes from graphcache.models.pipelines' tables. An input
the trace cannot make, a model that is not a denoiser and the model's own
refusal of every candidate are ManifestErrors of one line.

May import: graphcache.errors, graphcache.models.pipelines, graphcache.models.build.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphcache.errors import ManifestError
from graphcache.models.pipelines import (
    CLIP_IMAGE_TOKENS,
    FRAMES,
    INPUTS,
    OWN,
    PREFIX,
    TEXT,
    UNMASKED,
    Vae,
    pipeline_text,
)

# Config fields naming the width of the prompt's embeddings, the encoder's side first (a
# projection's input) and the attention's own width last; the model settles which it takes.
WIDTHS = (
    "caption_channels",
    "joint_attention_dim",
    "text_embed_dim",
    "text_dim",
    "cap_feat_dim",
    "encoder_hid_dim",
    "cross_attention_input_dim",
    "context_in_dim",
    "text_hidden_dim",
    "cross_attention_dim",
)
MASKS = ("encoder_attention_mask", "encoder_hidden_states_mask", "text_embedding_mask", "encoder_mask")
SIZES = ("original_size", "target_size", "crop_coords")  # CogView's size conditions: (b, 2)


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


@dataclass
class Feed:
    """How a denoiser of class ``name`` takes one step's inputs, derived from
    its forward's parameters (``params``) and its config (see the module's
    text). ``layout`` and ``width`` are settled by running the model
    (``settle``) among the candidates the config leaves open."""

    name: str
    params: dict[str, inspect.Parameter]
    config: Any
    vae: Vae
    text: int  # the prompt's tokens, PREFIX's included
    frames: int | None  # pixel frames a clip (video models)
    sample: str  # the latents' parameter: hidden_states or sample
    packed: str  # "": latents as an image or video; "ids": 2 x 2 patches a token, with img_ids (Flux);
    # "grid": a token a latent, with num_frames, height and width (LTX)
    patch: int
    patch_t: int
    layouts: list[str]  # "image", or a video's "cf" (b, C, F, H, W) / "fc" (b, F, C, H, W); "tokens" when packed
    widths: list[int]  # the prompt embeddings' width: the config's candidates
    mask: str | None  # the parameter of the prompt's mask the pipeline passes
    extra: Callable[..., dict[str, Any]] | None = None  # INPUTS' feeder of this class
    layout: str = ""
    width: int = 0

    @property
    def multiple(self) -> int:
        """Latents a token's side takes: the patch, times Flux's 2 x 2 packing."""
        return self.patch * (2 if self.packed == "ids" else 1)

    def latent(self, size: tuple[int, int]) -> tuple[int, int]:
        return _latent(size, self.vae, self.multiple, self.name)

    @property
    def latent_frames(self) -> int:
        """The pipeline's latent frames of ``frames``, padded to a multiple of the temporal patch (CogVideoX 1.5)."""
        assert self.frames is not None
        frames = (self.frames - 1) // self.vae.temporal + 1
        return -(-frames // self.patch_t) * self.patch_t

    def kwargs(self, torch: Any, size: tuple[int, int], b: int, dtype: Any, layout: str, width: int) -> dict:
        """One step's keyword arguments for ``b`` rows at ``size`` (W, H)."""
        c, h_w = self.config, self.latent(size)
        h, w = h_w
        channels = int(_first(c, ("in_channels", "io_channels")) or 4)
        zeros = lambda *shape: torch.zeros(shape, dtype=dtype, device="meta")  # noqa: E731
        kwargs: dict[str, Any] = {}
        if self.packed == "ids":
            tokens = (h // 2) * (w // 2)
            kwargs[self.sample] = zeros(b, tokens, channels)
            kwargs["img_ids"] = zeros(tokens, 3)
            if "txt_ids" in self.params:
                kwargs["txt_ids"] = zeros(self.text, 3)
        elif self.packed == "grid":
            frames = self.latent_frames if self.frames else 1
            tokens = (frames // self.patch_t) * (h // self.patch) * (w // self.patch)
            kwargs[self.sample] = zeros(b, tokens, channels)
            kwargs.update(num_frames=frames, height=h, width=w)
        elif layout == "cf":
            kwargs[self.sample] = zeros(b, channels, self.latent_frames, h, w)
        elif layout == "fc":
            kwargs[self.sample] = zeros(b, self.latent_frames, channels, h, w)
        else:
            kwargs[self.sample] = zeros(b, channels, h, w)
        step = next(n for n in ("timestep", "timesteps") if n in self.params)
        kwargs[step] = torch.full((b,), 999.0, dtype=dtype, device="meta")
        if width and "encoder_hidden_states" in self.params:
            kwargs["encoder_hidden_states"] = zeros(b, self.text, width)
        if self.mask:
            kwargs[self.mask] = torch.ones((b, self.text), dtype=torch.long, device="meta")
        for name, fields in (("pooled_projections", "pooled_projection_dim"), ("timestep_cond", "time_cond_proj_dim")):
            dim = getattr(c, fields, None)
            if name in self.params and dim:
                kwargs[name] = zeros(b, int(dim))
        if "guidance" in self.params and getattr(c, "guidance_embeds", False):
            kwargs["guidance"] = zeros(b)
        if "ofs" in self.params and getattr(c, "ofs_embed_dim", None):
            kwargs["ofs"] = zeros(b)
        if "encoder_hidden_states_image" in self.params and getattr(c, "image_dim", None):
            # Image-to-video: CLIP's image tokens (two images where pos_embed_seq_len says so: Wan's FLF2V).
            seq = getattr(c, "pos_embed_seq_len", None)
            pairs = seq // CLIP_IMAGE_TOKENS if seq else 1
            kwargs["encoder_hidden_states_image"] = zeros(b * pairs, CLIP_IMAGE_TOKENS, int(c.image_dim))
        for name in SIZES:
            if name in self.params:
                kwargs[name] = zeros(b, 2)
        # Class-conditional denoisers (DiT: ada_norm_zero over num_embeds_ada_norm classes) take a label a row.
        conditional = getattr(c, "norm_type", None) == "ada_norm_zero" and getattr(c, "num_embeds_ada_norm", None)
        if "class_labels" in self.params and (conditional or _required(self.params["class_labels"])):
            kwargs["class_labels"] = torch.zeros((b,), dtype=torch.long, device="meta")
        if self.extra is not None:
            kwargs.update(self.extra(torch, c, b, dtype))
        return kwargs

    def settle(self, torch: Any, model: Any, size: tuple[int, int], source: str) -> None:
        """Run one step of each candidate form of the latents and text width,
        keeping the first the model takes; ManifestError naming them where it
        takes none."""
        failures: list[str] = []
        for layout in self.layouts:
            for width in self.widths or [0]:
                try:
                    kwargs = self.kwargs(torch, size, 1, model.dtype, layout, width)
                    with torch.no_grad():
                        model(**kwargs)
                except ManifestError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the model's refusal of this candidate, named below
                    from graphcache.models.build import one_line

                    failures.append(f"{_form(layout, width)}: {type(exc).__name__}: {one_line(exc)[:200]}")
                    continue
                self.layout, self.width = layout, width
                return
        raise ManifestError(
            f"{source}: the trace cannot feed diffusers' {self.name} a step (it tried {len(failures)} form(s) of "
            f"its inputs; the first: {failures[0]}): record a run with graphcache record"
        )


def _first(config: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def _required(param: inspect.Parameter) -> bool:
    return param.default is inspect.Parameter.empty and param.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _form(layout: str, width: int) -> str:
    shape = {"cf": "latents (b, C, F, H, W)", "fc": "latents (b, F, C, H, W)", "tokens": "packed latents"}
    what = shape.get(layout, "latents (b, C, H, W)")
    return f"{what}, prompt width {width}" if width else what


def _int(value: Any) -> int:
    return int(value[-1] if isinstance(value, (list, tuple)) else value)


def feed(model: Any, name: str, sizes: Sizes, vae: Vae, folder: Path | None, diffusers: Any, source: str) -> Feed:
    """The Feed of a built denoiser (see the module's text), or ManifestError
    naming the input or the option that stops it."""
    params = dict(inspect.signature(model.forward).parameters)
    params.pop("self", None)
    c = model.config
    sample = next((n for n in ("hidden_states", "sample") if n in params), None)
    if sample is None or not any(n in params for n in ("timestep", "timesteps")):
        raise ManifestError(
            f"{source}: diffusers' {name} is not a denoiser (its forward takes no latents and timestep): graphcache "
            "manifest traces a pipeline's transformer/ or unet/; record a run of this model with graphcache record"
        )
    made = {sample, "timestep", "timesteps", "encoder_hidden_states", *MASKS, "pooled_projections", "timestep_cond",
            "guidance", "ofs", "encoder_hidden_states_image", "img_ids", "txt_ids", "num_frames", "height", "width",
            "class_labels", *SIZES, *OWN.get(name, ())}  # fmt: skip
    for key, param in params.items():
        if _required(param) and key not in made:
            raise ManifestError(
                f"{source}: diffusers' {name} takes {key!r}, an input the trace cannot make from its config: "
                "record a run with graphcache record (--max-seq widens it to larger sizes)"
            )
    raw = getattr(c, "patch_size", None)
    patch = _int(raw) if raw else 1
    patch_t = int(
        getattr(c, "patch_size_t", None) or (raw[0] if isinstance(raw, (list, tuple)) and len(raw) == 3 else 1)
    )
    video = (
        "num_frames" in params
        or "3D" in name
        or "Video" in name
        or "Temporal" in name
        or getattr(c, "patch_size_t", None) is not None
        or (isinstance(raw, (list, tuple)) and len(raw) == 3)
        or getattr(c, "sample_frames", None) is not None
    )
    if sizes.frames is not None and not video:
        raise ManifestError(f"{source}: {name} makes images: --frames is for video models")
    frames = (sizes.frames or FRAMES.get(name)) if video else None
    if video and frames is None:
        raise ManifestError(f"{source}: {name} makes video: pass --frames N, the frames of a clip its pipeline makes")
    packed = "ids" if "img_ids" in params else "grid" if {"num_frames", "height", "width"} <= set(params) else ""
    layouts = ["tokens"] if packed else ["cf", "fc"] if video else ["image"]
    widths: list[int] = []
    for key in WIDTHS:
        value = getattr(c, key, None)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int) and not isinstance(value, bool) and value > 0 and value not in widths:
            widths.append(value)
    text = (
        sizes.text_len or pipeline_text(folder, diffusers) or TEXT.get(name) or getattr(c, "max_text_seq_length", None)
    )
    if "encoder_hidden_states" in params and (widths or _required(params["encoder_hidden_states"])):
        if not widths:
            raise ManifestError(
                f"{source}: {name}'s config names no width for its prompt's embeddings ({', '.join(WIDTHS)}): "
                "record a run with graphcache record"
            )
        if text is None:
            raise ManifestError(f"{source}: {name}: pass --text-len N, the prompt length its pipeline pads to")
    else:
        widths = []
    mask = next((n for n in MASKS if n in params), None) if name not in UNMASKED and widths else None
    return Feed(
        name, params, c, vae, int(text or 0) + PREFIX.get(name, 0), frames, sample, packed, patch, patch_t,
        layouts, widths, mask, INPUTS.get(name),
    )  # fmt: skip


def _latent(size: tuple[int, int], vae: Vae, multiple: int, name: str) -> tuple[int, int]:
    """(h, w) latents of an image of ``size`` (W, H), refused unless they divide by ``multiple``."""
    width, height = size
    if width % (vae.spatial * multiple) or height % (vae.spatial * multiple):
        raise ManifestError(
            f"--resolution {width}x{height}: {name} takes images whose sides are multiples of "
            f"{vae.spatial * multiple} (the VAE's {vae.spatial} x the model's patch of {multiple})"
        )
    return height // vae.spatial, width // vae.spatial
