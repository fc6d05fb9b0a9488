"""Vision, audio, multimodal and diffusers models (issue 40) warmed ONLY from
``graphcache manifest`` for their tiny configs (docs/examples/configs/tiny/,
written by scripts/tools/tiny_configs.py: 2 layers, hidden 256, random weights, no
download), then served: the fraction of attention calls served by cached
graphs, and whether the outputs agree with unpatched torch's.

What runs the models is their own code: transformers' models' forward (an
image-text model's ``generate``), and for a diffusers denoiser its real
pipeline (StableDiffusionPipeline, FluxPipeline, StableDiffusion3Pipeline)
with prompt embeddings given (no text encoder, no VAE: ``output_type="latent"``),
so the latents' size, the guidance pair and the prompt length are the
pipeline's. Shared by tests/test_media_models.py and
scripts/bench/bench_media_models.py.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import graphcache.torch as gt
from graphcache import GraphCache, manifest, ops
from graphcache.errors import ManifestError
from graphcache.stores import DiskStore
from tests.hf_models import ENCODER_TOLERANCE, Case

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "docs" / "examples" / "configs" / "tiny"
STEPS = 2  # denoising steps a diffusion case runs
NEW_TOKENS = 4  # tokens an image-text case generates
# Diffusion latents after STEPS steps agree within this (relative to their largest value).
TOLERANCE = ENCODER_TOLERANCE


@dataclass(frozen=True)
class Bench:
    """A model of CONFIGS: its kind, the manifest's options, and its serving cases
    (case name -> runs; a run is (size, batch) or, for audio, the lengths of a batch)."""

    kind: str  # "vision", "segmentation", "audio", "multimodal" or "diffusion"
    options: tuple[str, ...]
    cases: dict[str, list[Any]] = field(default_factory=dict)
    text: int | None = None  # a derived denoiser's prompt tokens, where not its pipeline's default (PROMPT)


_IMAGES = ("--max-batch", "4", "--image-size", "224x224", "--image-size", "288x288")
_VISION = {"224x224, b=1": [((224, 224), 1)], "288x288, b=1": [((288, 288), 1)], "batch of 4": [((224, 224), 4), ((288, 288), 4)]}  # fmt: skip
_DIFFUSION = ("--max-batch", "2", "--resolution", "128x128", "--resolution", "192x192")
_PAIRS = {
    "128x128, guidance pair": [((128, 128), 1)],
    "192x192, guidance pair": [((192, 192), 1)],
    "2 images, guidance pairs": [((128, 128), 2), ((192, 192), 2)],
}
MODELS: dict[str, Bench] = {
    "vit": Bench("vision", _IMAGES, _VISION),
    "dinov2": Bench("vision", _IMAGES, _VISION),
    "siglip-vision": Bench("vision", _IMAGES, _VISION),
    "clip-vision": Bench("vision", _IMAGES, _VISION),
    "wav2vec2": Bench(
        "audio",
        ("--max-batch", "4", "--max-seq", "48000"),
        {"16000 samples": [(16000,)], "40000 samples": [(40000,)], "padded batch of 4": [(16000, 24000, 40000, 48000)]},
    ),
    "qwen2_5_vl": Bench(
        "multimodal",
        ("--max-batch", "4", "--max-seq", "512", "--image-size", "224x224", "--image-size", "448x448"),
        {
            "224x224 image, b=1": [((224, 224), (20,))],
            "448x448 image, b=1": [((448, 448), (20,))],
            "left-padded batch of 4": [((224, 224), (20, 50, 9, 33))],
        },
    ),
    # Windowed attention: each call's batch is images x windows (4 windows of 7 x 7 at 56 px, 16 at 112 px).
    "swin": Bench(
        "vision",
        ("--max-batch", "4", "--image-size", "56x56", "--image-size", "112x112"),
        {
            "56x56, b=1": [((56, 56), 1)],
            "112x112, b=1": [((112, 112), 1)],
            "batch of 4": [((56, 56), 4), ((112, 112), 4)],
        },
    ),
    # SamModel: its vision encoder (windows, a global layer) and mask decoder, prompted with two points an image.
    "sam": Bench(
        "segmentation", ("--max-batch", "2"), {"256x256, b=1": [((256, 256), 1)], "2 images": [((256, 256), 2)]}
    ),  # fmt: skip
    "sd-unet": Bench("diffusion", _DIFFUSION, _PAIRS),
    "flux": Bench("diffusion", _DIFFUSION, _PAIRS),
    "sd3": Bench("diffusion", _DIFFUSION, _PAIRS),
    # Denoisers whose inputs the trace derives from their config and forward signature.
    "pixart": Bench("diffusion", _DIFFUSION, _PAIRS),
    "sana": Bench("diffusion", _DIFFUSION, _PAIRS),
    "auraflow": Bench("diffusion", _DIFFUSION, _PAIRS),
    "lumina2": Bench("diffusion", _DIFFUSION, _PAIRS),
    "cogview4": Bench("diffusion", (*_DIFFUSION, "--text-len", "32"), _PAIRS),  # in no table: its prompt length given
    "cogvideox": Bench("diffusion", (*_DIFFUSION, "--frames", "9"), _PAIRS),
    "ltx": Bench("diffusion", (*_DIFFUSION, "--frames", "9"), _PAIRS),
    # A pipeline folder (Sana beside a VAE of 8 pixels a latent), prompts of 120 tokens: at 64 px its
    # cross-attention runs 64 queries over 120 keys, one length class; at 256 px 1024 queries.
    "sana-vae8": Bench(
        "diffusion",
        ("--max-batch", "2", "--resolution", "64x64", "--resolution", "256x256", "--text-len", "120"),
        {"64x64, guidance pair": [((64, 64), 1)], "256x256, guidance pair": [((256, 256), 1)]},
        text=120,
    ),
}


def config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / name / "config.json").read_text())


def build(name: str) -> Any:
    """The model (a diffusers one: its pipeline), bf16, eval, seeded weights."""
    import transformers

    torch.manual_seed(0)
    index = CONFIGS / name / "model_index.json"
    if index.is_file():  # a pipeline folder: its denoiser and VAE
        import diffusers

        diffusers.utils.logging.set_verbosity_error()
        parts = json.loads(index.read_text())
        models = {
            part: getattr(diffusers, cls).from_config(json.loads((CONFIGS / name / part / "config.json").read_text()))
            for part, (_, cls) in ((k, v) for k, v in parts.items() if not k.startswith("_"))
        }
        return _pipeline(models["transformer"].to(torch.bfloat16).eval(), models.get("vae"))
    data = config(name)
    if "_class_name" in data:
        import diffusers

        diffusers.utils.logging.set_verbosity_error()  # its note on float32 modules is about loading weights
        model = getattr(diffusers, data["_class_name"]).from_config(data).to(torch.bfloat16).eval()
        return _pipeline(model)
    cfg = transformers.AutoConfig.from_pretrained(CONFIGS / name)
    auto = transformers.AutoModelForImageTextToText if MODELS[name].kind == "multimodal" else transformers.AutoModel
    return auto.from_config(cfg, attn_implementation="sdpa").eval().to(torch.bfloat16)


def _pipeline(model: Any, vae: Any = None) -> Any:
    """The model's own pipeline with no VAE, text encoder or tokenizer (the
    prompt's embeddings are given, the latents returned): the latents' size,
    the guidance pair and the prompt's length and mask are the pipeline's."""
    import diffusers

    flow = diffusers.FlowMatchEulerDiscreteScheduler()
    empty: dict[str, Any] = {"vae": None, "text_encoder": None, "tokenizer": None}
    if isinstance(model, diffusers.UNet2DConditionModel):
        return diffusers.StableDiffusionPipeline(
            unet=model,
            scheduler=diffusers.DDIMScheduler(clip_sample=False, steps_offset=1),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
            **empty,
        )
    twos = {"text_encoder_2": None, "tokenizer_2": None}
    if isinstance(model, diffusers.FluxTransformer2DModel):
        return diffusers.FluxPipeline(transformer=model, scheduler=flow, **empty, **twos)
    if isinstance(model, diffusers.SD3Transformer2DModel):
        threes = {"text_encoder_3": None, "tokenizer_3": None}
        return diffusers.StableDiffusion3Pipeline(transformer=model, scheduler=flow, **empty, **twos, **threes)
    pipeline, scheduler = PIPELINES[type(model).__name__]
    empty["vae"] = vae  # a pipeline folder's VAE: only its factor is read (the latents are returned)
    return getattr(diffusers, pipeline)(transformer=model, scheduler=getattr(diffusers, scheduler)(), **empty)


# Denoisers whose inputs graphcache manifest derives: their pipeline and scheduler, the prompt
# length the pipeline pads to (the model's TEXT or config), and whether it passes the prompt's mask.
PIPELINES = {
    "PixArtTransformer2DModel": ("PixArtSigmaPipeline", "DPMSolverMultistepScheduler"),
    "SanaTransformer2DModel": ("SanaPipeline", "FlowMatchEulerDiscreteScheduler"),
    "AuraFlowTransformer2DModel": ("AuraFlowPipeline", "FlowMatchEulerDiscreteScheduler"),
    "Lumina2Transformer2DModel": ("Lumina2Pipeline", "FlowMatchEulerDiscreteScheduler"),
    "CogView4Transformer2DModel": ("CogView4Pipeline", "FlowMatchEulerDiscreteScheduler"),
    "CogVideoXTransformer3DModel": ("CogVideoXPipeline", "CogVideoXDDIMScheduler"),
    "LTXVideoTransformer3DModel": ("LTXPipeline", "FlowMatchEulerDiscreteScheduler"),
}
PROMPT = {  # tokens and mask of the prompt's embeddings each pipeline hands its denoiser
    "PixArtTransformer2DModel": (300, True),
    "SanaTransformer2DModel": (300, True),
    "AuraFlowTransformer2DModel": (256, True),
    "Lumina2Transformer2DModel": (256, True),
    "CogView4Transformer2DModel": (32, False),
    "CogVideoXTransformer3DModel": (64, False),
    "LTXVideoTransformer3DModel": (128, True),
}
FRAMES = 9  # a video case's frames: 3 latent frames for CogVideoX's VAE (4 a latent frame), 2 for LTX's (8)


def run(name: str, model: Any, runs: Sequence[Any]) -> list[torch.Tensor]:
    """Each run's output (float32): hidden states, generated tokens or latents."""
    kind = MODELS[name].kind
    with torch.no_grad():
        if kind == "vision":
            return [_vision(model, size, b) for size, b in runs]
        if kind == "segmentation":
            return [_segment(model, size, b) for size, b in runs]
        if kind == "audio":
            return [_audio(model, lengths) for lengths in runs]
        if kind == "multimodal":
            return [_image_text(model, size, lengths) for size, lengths in runs]
        return [_denoise(model, size, images, MODELS[name].text) for size, images in runs]


def _random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _vision(model: Any, size: tuple[int, int], b: int) -> torch.Tensor:
    own = model.config.image_size
    kwargs: dict[str, Any] = {"pixel_values": _random(b, model.config.num_channels, *size)}
    if "interpolate_pos_encoding" in inspect.signature(model.forward).parameters and size != (own, own):
        kwargs["interpolate_pos_encoding"] = True
    return model(**kwargs).last_hidden_state.float()


def _segment(model: Any, size: tuple[int, int], b: int) -> torch.Tensor:
    """SamModel's masks for ``b`` images of ``size``, each prompted with two points."""
    points = torch.rand((b, 1, 2, 2), generator=torch.Generator().manual_seed(b)) * min(size)
    return model(pixel_values=_random(b, 3, *size), input_points=points).pred_masks.float()


def _audio(model: Any, lengths: tuple[int, ...]) -> torch.Tensor:
    longest = max(lengths)
    values = _random(len(lengths), longest)
    mask = torch.zeros((len(lengths), longest), dtype=torch.long)
    for row, n in enumerate(lengths):
        values[row, n:] = 0
        mask[row, :n] = 1
    out = model(input_values=values, attention_mask=mask).last_hidden_state.float()
    frames = model._get_feature_vector_attention_mask(out.shape[1], mask)  # padding frames are no one's answer
    return out * frames.unsqueeze(-1)


def image_text_inputs(config: Any, size: tuple[int, int], lengths: tuple[int, ...]) -> dict[str, Any]:
    """Left-padded prompts of ``lengths`` text tokens, each after an image of
    ``size`` (its tokens as Qwen2.5-VL's processor lays them out), and the images."""
    vision = config.vision_config
    patch, merge = vision.patch_size, vision.spatial_merge_size
    grid_h, grid_w = size[0] // patch, size[1] // patch
    tokens = grid_h * grid_w // (merge * merge)
    b, n = len(lengths), max(lengths) + tokens
    ids, mask, types = (torch.zeros((b, n), dtype=torch.long) for _ in range(3))
    for row, t in enumerate(lengths):
        text = torch.randint(3, 800, (t,), generator=torch.Generator().manual_seed(t))
        prompt = torch.cat([text[:1], torch.full((tokens,), config.image_token_id), text[1:]])
        ids[row, n - len(prompt) :], mask[row, n - len(prompt) :] = prompt, 1
        types[row, n - len(prompt) + 1 : n - len(prompt) + 1 + tokens] = 1
    pixels = _random(b * grid_h * grid_w, vision.in_channels * vision.temporal_patch_size * patch * patch)
    grid = torch.tensor([[1, grid_h, grid_w]] * b)
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=types)


def _image_text(model: Any, size: tuple[int, int], lengths: tuple[int, ...]) -> torch.Tensor:
    inputs = image_text_inputs(model.config, size, lengths)
    return model.generate(
        **inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
    )


def _denoise(pipe: Any, size: tuple[int, int], images: int, tokens: int | None = None) -> torch.Tensor:
    """``images`` images of ``size`` (W, H), classifier-free guidance on:
    the UNet's and SD3's pipelines batch the pair, Flux's (true CFG) calls
    its transformer once for each half."""
    import diffusers

    width, height = size
    denoiser = getattr(pipe, "transformer", None) or pipe.unet
    c = denoiser.config
    steps = {"height": height, "width": width, "num_inference_steps": STEPS, "output_type": "latent"}
    generator = torch.Generator().manual_seed(0)
    if isinstance(pipe, diffusers.FluxPipeline):
        text, pooled = _random(images, 512, c.joint_attention_dim), _random(images, c.pooled_projection_dim)
        embeds = dict(prompt_embeds=text, pooled_prompt_embeds=pooled, true_cfg_scale=2.0)
        embeds.update(negative_prompt_embeds=torch.zeros_like(text), negative_pooled_prompt_embeds=pooled)
    elif isinstance(pipe, diffusers.StableDiffusion3Pipeline):
        text, pooled = _random(images, 77 + 256, c.joint_attention_dim), _random(images, c.pooled_projection_dim)
        embeds = dict(prompt_embeds=text, pooled_prompt_embeds=pooled)
        embeds.update(negative_prompt_embeds=torch.zeros_like(text), negative_pooled_prompt_embeds=pooled)
    elif isinstance(pipe, diffusers.StableDiffusionPipeline):
        text = _random(images, 77, c.cross_attention_dim)
        embeds = dict(prompt_embeds=text, negative_prompt_embeds=torch.zeros_like(text))
    else:
        embeds = _prompt(type(denoiser).__name__, pipe, images, c, tokens)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**embeds, **steps, generator=generator)
    return (out.frames if hasattr(out, "frames") else out.images).float()


def _prompt(name: str, pipe: Any, images: int, c: Any, tokens: int | None = None) -> dict[str, Any]:
    """A derived denoiser's pipeline's prompt: embeddings of its length (or
    ``tokens``) and width (the config's caption_channels, text_embed_dim,
    ...), the mask where the pipeline passes one, and a video's frames."""
    own, masked = PROMPT[name]
    tokens = tokens or own
    width = next(getattr(c, k) for k in ("caption_channels", "joint_attention_dim", "text_embed_dim", "cap_feat_dim") if getattr(c, k, None))  # fmt: skip
    text = _random(images, tokens, width)
    embeds: dict[str, Any] = dict(prompt_embeds=text, negative_prompt_embeds=torch.zeros_like(text))
    params = inspect.signature(pipe.__call__).parameters
    if masked:
        mask = torch.ones((images, tokens), dtype=torch.long)
        mask[:, tokens // 2 :] = 0  # half the prompt is padding, as a tokenizer pads a short prompt
        embeds.update(prompt_attention_mask=mask, negative_prompt_attention_mask=mask.clone())
    if "negative_prompt" in params:
        embeds["negative_prompt"] = None  # given as embeddings
    if "use_resolution_binning" in params:
        embeds["use_resolution_binning"] = False  # the size asked, not the nearest trained aspect ratio
    if "num_frames" in params:
        embeds["num_frames"] = FRAMES
    return embeds


def same(want: torch.Tensor, got: torch.Tensor) -> bool:
    """Tokens equal, or float outputs within TOLERANCE of their largest value."""
    if not want.is_floating_point():
        return torch.equal(want, got)
    scale = float(want.abs().max()) or 1.0
    return float((want - got).abs().max()) <= TOLERANCE * scale


def serve(
    name: str,
    model: Any,
    cache: GraphCache,
    only: Sequence[str] | None = None,
    cases: dict[str, list[Any]] | None = None,
) -> list[Case]:
    """Each case of ``name`` (or ``cases``; those in ``only``) unpatched, then
    through the drop-in from ``cache``: one Case each (the drop-in's
    counters, outputs agreeing)."""
    found = []
    for case, runs in (cases or MODELS[name].cases).items():
        if only is not None and case not in only:
            continue
        want = run(name, model, runs)
        gt.reset()
        gt.configure(cache, device="cpu", on_miss="torch")
        with gt.patch():
            got = run(name, model, runs)
        stats = gt.stats()
        gt.reset()
        equal = all(same(w, g) for w, g in zip(want, got, strict=True))
        found.append(Case(case, stats["calls"], stats["hits"], equal, dict(stats["fallbacks"])))
    return found


def served(
    name: str,
    folder: Path,
    compiler: Any,
    only: Sequence[str] | None = None,
    options: Sequence[str] | None = None,
    cases: dict[str, list[Any]] | None = None,
    separate: bool = True,
) -> tuple[list[Case], int]:
    """Warm ``name`` ONLY from ``graphcache manifest`` on its tiny config (the
    CLI as a user runs it, with MODELS' options or ``options``: in a process
    of its own, or with ``separate=False`` this one's, as the test suite
    runs it to spare an import of torch), then serve its cases (or
    ``cases``) with ``compiler`` executing the graphs. Returns the cases and
    how many graphs were built while serving (0: all from the manifest)."""
    out = folder / f"{name}.yaml"
    args = ["manifest", str(CONFIGS / name), *(options or MODELS[name].options), "-o", str(out)]
    if separate:
        from tests.clirun import cli

        run_ = cli(*args)
        if run_.returncode != 0:
            raise ManifestError(run_.stderr.strip())
    else:
        from graphcache.cli import main

        main.main(args, standalone_mode=False)
    store = DiskStore(folder / f"{name}-store")
    ops.warm(manifest.load(out), GraphCache(store, compiler, shape_classes="pow2"))
    builds = getattr(compiler, "builds", 0)
    cache = GraphCache(store, compiler, shape_classes="pow2")
    found = serve(name, build(name), cache, only, cases)
    return found, getattr(compiler, "builds", 0) - builds


def recorded(
    name: str, folder: Path, compiler: Any, record: Sequence[Any], max_seq: int | None, max_batch: int | None = 2
) -> Any:
    """Record ``name``'s ``record`` runs with ``gt.record(max_seq=, max_batch=)``
    (graphcache record --max-seq / --max-batch), warm that manifest alone,
    and return (the model, a cache holding it) to serve other sizes from."""
    model = build(name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-recorded.yaml"
    gt.reset()
    with gt.record(path, dtype="bfloat16", shape_classes="pow2", max_batch=max_batch, max_seq=max_seq):
        run(name, model, record)
    gt.reset()
    store = DiskStore(folder / f"{name}-recorded-store")
    ops.warm(manifest.load(path), GraphCache(store, compiler, shape_classes="pow2"))
    return model, GraphCache(store, compiler, shape_classes="pow2")
