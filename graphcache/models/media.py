"""What a trace feeds a model besides tokens: images at the sizes a user
serves, and audio of the lengths the model takes (graphcache.models.scenarios
runs them; nothing here knows a model family).

Images come in two forms transformers' vision models take:

- ``pixels``: ``pixel_values`` of (batch, channels, H, W), what ViT, DINOv2,
  SigLIP, CLIP and the towers of LLaVA, Gemma 3 and PaliGemma read; a size
  other than the config's ``image_size`` is passed with
  ``interpolate_pos_encoding=True`` where the model takes it;
- ``patches``: the Qwen2-VL family's (a vision config with
  ``temporal_patch_size`` and ``spatial_merge_size``): every image's patches
  flattened into one (patches, channels x temporal x patch x patch) tensor
  with its ``image_grid_thw`` row (1, H / patch, W / patch); its processor
  resizes an image to multiples of patch x merge, so other sizes are refused.

Audio: raw samples (``input_values``: wav2vec2, HuBERT, WavLM, ...) whose
encoder length is what the model's feature extractor makes of them
(``_get_feat_extract_output_lengths``), or feature frames
(``input_features``) of the width the config names.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from graphcache.spec.classes import MIN_LENGTH


def own_size(sub: Any) -> tuple[int, int] | None:
    """A vision config's image size as (H, W), or None where it fixes none."""
    size = getattr(sub, "image_size", None)
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size, size
    return None


def patched(sub: Any) -> bool:
    """Whether the vision config takes flattened patches with a grid (Qwen2-VL's form)."""
    return hasattr(sub, "temporal_patch_size") and hasattr(sub, "spatial_merge_size")


def images(sub: Any, size: tuple[int, int], batch: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``batch`` images of ``size`` (H, W) as a model of vision config ``sub``
    takes them (see the module's text), on the meta device. Raises ValueError
    for a size the model's processor never makes."""
    h, w = size
    if patched(sub):
        patch = _int(sub.patch_size)
        unit = patch * int(sub.spatial_merge_size)
        if h % unit or w % unit:
            raise ValueError(
                f"{h}x{w} is not a multiple of {unit} (patch_size {patch} x spatial_merge_size "
                f"{sub.spatial_merge_size}), which its processor resizes every image to"
            )
        grid_h, grid_w = h // patch, w // patch
        width = _channels(sub) * _int(sub.temporal_patch_size) * patch * patch
        pixels = torch.zeros((batch * grid_h * grid_w, width), dtype=dtype, device="meta")
        grid = torch.tensor([[1, grid_h, grid_w]] * batch, dtype=torch.long, device="meta")
        return {"pixel_values": pixels, "image_grid_thw": grid}
    return {"pixel_values": torch.zeros((batch, _channels(sub), h, w), dtype=dtype, device="meta")}


def image_call(fn: Any, sub: Any, size: tuple[int, int], batch: int, dtype: torch.dtype) -> dict[str, Any]:
    """The keyword arguments ``fn`` (a vision model's forward, or a
    multimodal model's ``get_image_features``) takes for ``batch`` images of
    ``size``. Raises ValueError naming a parameter it needs that a trace
    does not make."""
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = images(sub, size, batch, dtype)
    if "image_sizes" in params:  # LLaVA-NeXT: each image's size before its processor tiled it
        kwargs["image_sizes"] = torch.tensor([list(size)] * batch, dtype=torch.long, device="meta")
    if "interpolate_pos_encoding" in params and size != own_size(sub) and not patched(sub):
        kwargs["interpolate_pos_encoding"] = True
    for name, param in params.items():
        required = param.default is inspect.Parameter.empty and param.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
        if required and name not in kwargs:
            raise ValueError(f"{getattr(fn, '__name__', 'forward')}() needs {name!r}, which the trace does not make")
    return {k: v for k, v in kwargs.items() if k in params or _takes_kwargs(params)}


def tokens_per_image(out: Any, batch: int) -> int:
    """How many tokens each image became, from ``get_image_features``' result
    (a tensor, or an output whose ``pooler_output`` is a tensor or one per image)."""
    feats = out if isinstance(out, (torch.Tensor, tuple, list)) else getattr(out, "pooler_output", None)
    if feats is None:
        feats = out.last_hidden_state
    if isinstance(feats, (tuple, list)):
        first = feats[0]
        return int(first.shape[0] if first.dim() == 2 else first.shape[-2])
    return int(feats.shape[-2] if feats.dim() == 3 else feats.shape[0] // batch)


def image_token(config: Any) -> int | None:
    """The token id that stands for an image's tokens in a prompt."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def audio_lengths(model: Any, longest: int) -> list[int]:
    """The input lengths (samples of raw audio, else feature frames) a trace
    runs up to ``longest``: for each length class up to the encoder length
    ``longest`` makes, the longest input whose encoder length is at most
    that class's longest, then ``longest`` itself."""
    frames = encoder_length(model)
    top = frames(longest)
    out = {longest}
    size = MIN_LENGTH
    while size < top:
        lo, hi = 1, longest  # the most samples whose encoder length is <= size
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if frames(mid) <= size else (lo, mid - 1)
        if frames(lo) >= 1:
            out.add(lo)
        size *= 2
    return sorted(out)


def encoder_length(model: Any) -> Any:
    """``n -> the encoder's length`` for an input of ``n`` samples or frames."""
    convert = getattr(model, "_get_feat_extract_output_lengths", None)
    if convert is None or model.main_input_name != "input_values":
        return lambda n: n
    return lambda n: int(convert(torch.tensor(n)))


def audio(model: Any, batch: int, n: int) -> torch.Tensor:
    """``batch`` inputs of ``n`` samples (``input_values``) or frames (``input_features``)."""
    if model.main_input_name == "input_values":
        return torch.zeros((batch, n), dtype=model.dtype, device="meta")
    return torch.zeros((batch, n, feature_width(model.config)), dtype=model.dtype, device="meta")


def feature_width(config: Any) -> int:
    """The width of one frame of ``input_features``, by the config's own name for it."""
    for name in ("feature_projection_input_dim", "input_feat_per_channel", "num_mel_bins", "feature_size"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value * int(getattr(config, "input_channels", 1) if name == "input_feat_per_channel" else 1)
    raise ValueError("the config names no width for its input_features (num_mel_bins, feature_size, ...)")


def audio_masked(config: Any) -> bool:
    """Whether the model's processor hands it a padding mask: wav2vec2-style
    models normalised per group take padded audio without one
    (``feat_extract_norm == "group"``: their processors return no attention_mask)."""
    return getattr(config, "feat_extract_norm", "layer") != "group"


def _int(value: Any) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _channels(sub: Any) -> int:
    for name in ("num_channels", "in_channels", "in_chans"):
        value = getattr(sub, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 3


def _takes_kwargs(params: Any) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
