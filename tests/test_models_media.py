"""``graphcache manifest`` for the models issue 40 names (their tiny configs in
docs/examples/configs/tiny/): vision and audio encoders (images at each
``--image-size``, audio up to ``--max-seq`` samples), a vision-language model
with its vision tower, diffusers denoisers (``--resolution``, the guidance
pair, the pipeline's prompt length), configs as transformers 5 writes them
(``{"__float__": "Infinity"}``), and what is refused, in one line naming why.
Serving from these manifests is tests/test_media_models.py's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the tracer needs torch (pip install '.[hf]')")
transformers = pytest.importorskip("transformers", reason="the tracer needs transformers (pip install '.[hf]')")

from graphcache import ManifestError, manifest  # noqa: E402
from graphcache.cli import main  # noqa: E402
from graphcache.models.build import config_of  # noqa: E402
from graphcache.models.config import locate, read, special_floats  # noqa: E402
from graphcache.models.scenarios import Sizes  # noqa: E402
from graphcache.models.trace import trace  # noqa: E402
from tests.clirun import cli  # noqa: E402

diffusion = pytest.importorskip("graphcache.models.diffusion")
needs_diffusers = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None, reason="needs diffusers (the dev extra; graphcache[diffusers])"
)

TINY = Path(__file__).parent.parent / "docs" / "examples" / "configs" / "tiny"


def data(name: str) -> dict:
    return read(TINY / name)


def shapes(specs) -> set[tuple]:  # noqa: ANN001
    return {(s.batch, s.seq_q, s.seq_kv, s.heads_q, s.mask, s.bias) for s in specs}


def phases(traced) -> set[str]:  # noqa: ANN001
    return {u for us in traced.specs.users.values() for u in us}


# Eager code and the default cache: what each kind of input makes (compiled code's
# and static caches' calls are tests/test_models_trace.py's and test_manifest_models.py's).
EAGER = {"caches": ("dynamic",), "compiled": False}


def test_a_vision_encoder_is_traced_at_each_image_size_and_needs_no_max_seq():
    vit = trace(data("vit"), "vit", Sizes(4, 0, image_sizes=((224, 224), (288, 288)), **EAGER), "sdpa")
    # 224 / 16 = 14 patches a side and the class token: 197 (class 256); 288: 18 x 18 + 1 = 325 (class 512).
    assert shapes(vit.specs.users) == {(b, n, n, 8, "none", None) for b in (1, 2, 4) for n in (256, 512)}
    assert vit.kind == "vision encoder" and "layers 0-1 attention: images 288x288" in phases(vit)
    # Without --image-size: the config's own image_size.
    siglip = trace(data("siglip-vision"), "siglip", Sizes(1, 0, **EAGER), "sdpa")
    assert shapes(siglip.specs.users) == {(1, 256, 256, 8, "none", None)}  # 14 x 14 = 196 tokens, no class token


def test_an_audio_encoder_is_traced_over_its_samples_unpadded_and_right_padded():
    wav2vec2 = trace(data("wav2vec2"), "wav2vec2", Sizes(2, 48000, **EAGER), "sdpa")
    # 48000 samples of 16 kHz audio are 149 frames (class 256); the class 128 is traced at its longest.
    dense = {(b, n, n, 8, "none", None) for b in (1, 2) for n in (128, 256)}
    padded = {(2, n, n, 8, "none", "b1ss") for n in (128, 256)}  # transformers' 4-D mask: bias graphs
    assert shapes(wav2vec2.specs.users) == dense | padded
    assert wav2vec2.kind == "audio encoder" and "encoder.layers 0-1 attention: audio, right-padded" in phases(wav2vec2)
    with pytest.raises(ManifestError, match="'wav2vec2' is an audio encoder: pass --max-seq N, the most samples"):
        trace(data("wav2vec2"), "wav2vec2", Sizes(1, 0), "sdpa")


def test_a_vision_language_model_is_traced_with_its_vision_tower_and_images_in_its_prompts():
    qwen = trace(data("qwen2_5_vl"), "qwen", Sizes(1, 512, image_sizes=((448, 448),), **EAGER), "sdpa")
    tower = {s for s in qwen.specs.users if s.heads_q == 4}  # the vision tower's 4 heads (the language model has 8)
    # 448 / 14 = 32 x 32 patches: windows of 8 x 8 (64, class 128) on block 0, the whole image on block 1.
    assert shapes(tower) == {(1, 128, 128, 4, "none", None), (1, 1024, 1024, 4, "none", None)}
    assert "visual.blocks 0 attn: prefill with an image, vision_config (images)" in phases(qwen)
    assert "language_model.layers 0-1 self_attn: decode, decode after an image" in phases(qwen)
    assert not qwen.untraced
    # Its vision config fixes no image size: without --image-size the tower is named, not skipped.
    text_only = trace(data("qwen2_5_vl"), "qwen", Sizes(1, 256, **EAGER), "sdpa")
    assert text_only.untraced == [
        "vision_config (qwen2_5_vl_vision): its config fixes no image size (no image_size): pass --image-size "
        "HxW for the sizes you serve"
    ]


@needs_diffusers
def test_a_unet_is_traced_at_each_resolution_with_the_guidance_pair_and_77_prompt_tokens():
    unet = diffusion.trace(data("sd-unet"), "unet", diffusion.Sizes(2, ((128, 128), (192, 192))))
    assert {s.batch for s in unet.specs.users} == {1, 2, 4}  # 2 images, each a conditional and an unconditional row
    # 128 px: a 16 x 16 latent (256 tokens, head dim 32), 8 x 8 in the middle block (64, head dim 64);
    # 192 px: 24 x 24 = 576 (class 1024) and 12 x 12 = 144 (class 256). Cross-attention: to 77 tokens (class 128).
    self_attention = {(256, 256, 32), (1024, 1024, 32), (128, 128, 64), (256, 256, 64)}
    cross = {(256, 128, 32), (1024, 128, 32), (128, 128, 64), (256, 128, 64)}
    assert {(s.seq_q, s.seq_kv, s.head_dim) for s in unet.specs.users} == self_attention | cross
    assert {(s.heads_q, s.mask, s.bias, s.layout) for s in unet.specs.users} == {(2, "none", None, "bshd")}
    assert unet.kind == "diffusion"
    assert "down_blocks.0.attentions.0.transformer_blocks.0.attn2: denoise 192x192, guidance pair" in phases(unet)


@needs_diffusers
def test_a_flux_transformer_attends_over_its_512_prompt_tokens_and_the_image_together(tmp_path):
    flux = diffusion.trace(data("flux"), "flux", diffusion.Sizes(1, ((128, 128),), guidance=False))
    # 128 px: 16 x 16 latents packed 2 x 2, 64 image tokens, after 512 prompt tokens: 576 (class 1024).
    assert shapes(flux.specs.users) == {(1, 1024, 1024, 8, "none", None)}
    # The CLI: --text-len, the guidance pair, and --max-seq widening a diffusion model's calls.
    out = tmp_path / "flux.yaml"
    options = ("--max-batch", "1", "--resolution", "128x128", "--text-len", "256", "--max-seq", "1024")
    main.main(["manifest", str(TINY / "flux"), *options, "-o", str(out)], standalone_mode=False)  # the CLI, in-process
    # 64 + 256 = 320 tokens (class 512), batches 1 and 2 (the pair), widened to every class up to 1024.
    assert {(s.batch, s.seq_q) for s in manifest.load(out)} == {(b, n) for b in (1, 2) for n in (128, 256, 512, 1024)}
    assert "# traced: a diffusion on the meta device" in out.read_text()
    assert "(widened to --max-seq 1024)" in out.read_text()


@needs_diffusers
def test_a_denoiser_outside_every_table_is_fed_from_its_forward_signature_and_config():
    """PixArt's latents at the config's in_channels, its 300 prompt tokens at
    caption_channels' width (128; the attention's own is 256) with the mask
    its pipeline passes; CogVideoX's video with its frames after the batch and
    before the channels, joint with the config's max_text_seq_length tokens."""
    pixart = diffusion.trace(data("pixart"), "pixart", diffusion.Sizes(1, ((128, 128),)))
    # 128 px: 16 x 16 latents in patches of 2, 64 tokens (class 128); the prompt: 300 (class 512), its mask a bias.
    assert shapes(pixart.specs.users) == {(b, 128, 128, 8, "none", None) for b in (1, 2)} | {
        (b, 128, 512, 8, "none", "bhss") for b in (1, 2)
    }
    assert "transformer_blocks 0-1 attn2: denoise 128x128, guidance pair" in phases(pixart)
    video = diffusion.trace(data("cogvideox"), "cogvideox", diffusion.Sizes(1, ((128, 128),), frames=9))
    # 9 frames are 3 latent frames of 8 x 8 patches (192 tokens) after 64 prompt tokens: 256.
    assert shapes(video.specs.users) == {(b, 256, 256, 8, "none", None) for b in (1, 2)}
    assert video.kind == "video diffusion" and "denoise 128x128, 9 frames, guidance pair" in str(phases(video))
    # A class in no table needs what no config says: the prompt length its pipeline pads to.
    for table in (diffusion.TEXT, diffusion.FRAMES, diffusion.VAES, diffusion.INPUTS, diffusion.PREFIX):
        assert "CogView4Transformer2DModel" not in table
    with pytest.raises(ManifestError, match="CogView4Transformer2DModel: pass --text-len N"):
        diffusion.trace(data("cogview4"), "cogview4", diffusion.Sizes(1, ((128, 128),)))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("flux", "--resolution", "100x100"), "--resolution 100x100: FluxTransformer2DModel takes images whose sides"),
        (("flux",), "FluxTransformer2DModel's config fixes no sample_size: pass --resolution WxH"),
        (("sd3", "--frames", "9"), "SD3Transformer2DModel makes images: --frames is for video models"),
        (("sd3", "--route", "graphcache"), "use --route sdpa"),
        (("sd3", "--image-size", "64x64"), "a diffusers model takes --resolution WxH"),
        (("vit", "--resolution", "64x64"), "--resolution: for diffusers models"),
        (("vit", "--image-size", "64"), "'64' is not HxW"),
    ],
)
def test_what_a_model_cannot_take_is_refused_in_one_line_naming_the_option(args, named):
    name, *rest = args
    run = cli("manifest", str(TINY / name), "--max-batch", "1", *rest)
    assert run.returncode != 0 and not run.stdout
    assert run.stderr.strip().count("\n") <= 1 and named in run.stderr, run.stderr


@needs_diffusers
def test_a_diffusers_class_the_trace_cannot_feed_and_a_missing_diffusers_are_named():
    autoencoder = {"_class_name": "AutoencoderKL", "_diffusers_version": "0.42.1"}
    with pytest.raises(ManifestError, match="diffusers' AutoencoderKL is not a denoiser") as refused:
        diffusion.trace(autoencoder, "vae", diffusion.Sizes(1))
    assert "transformer/ or unet/" in str(refused.value) and "graphcache record" in str(refused.value)
    # Stable Video Diffusion's UNet takes size and motion conditions its config does not describe: named.
    svd = {"_class_name": "UNetSpatioTemporalConditionModel", "_diffusers_version": "0.42.1"}
    with pytest.raises(ManifestError, match="takes 'added_time_ids', an input the trace cannot make") as refused:
        diffusion.trace(svd, "svd", diffusion.Sizes(1, ((64, 64),), frames=14))
    assert "\n" not in str(refused.value)
    hidden = cli("manifest", str(TINY / "sd3"), "--max-batch", "1", hide=("diffusers",))
    assert hidden.returncode != 0 and hidden.stderr.count("\n") == 1
    assert "pip install 'graphcache[diffusers]'" in hidden.stderr


@needs_diffusers
def test_a_pipeline_folder_traces_its_denoiser_at_its_vaes_scale(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text((TINY / "sd3" / "config.json").read_text())
    (tmp_path / "vae").mkdir()  # a VAE of three stages: 4 pixels a latent, not 8
    (tmp_path / "vae" / "config.json").write_text(json.dumps({"block_out_channels": [32, 64, 64]}))
    file = locate(tmp_path)
    assert file == tmp_path / "transformer" / "config.json"
    sd3 = diffusion.trace(read(file), str(file), diffusion.Sizes(1, ((64, 64),), guidance=False), folder=file.parent)
    # 64 px / 4 = 16 x 16 latents, patches of 2: 64 image tokens after 77 + 256 prompt tokens: 397 (class 512).
    assert shapes(sd3.specs.users) == {(1, 512, 512, 8, "none", None)}
    (tmp_path / "transformer" / "config.json").unlink()
    with pytest.raises(ManifestError, match="pipeline folder .* with no transformer or unet or prior or decoder"):
        locate(tmp_path)


@needs_diffusers
def test_a_pipeline_folder_gives_its_vaes_factor_and_its_pipelines_prompt_length(tmp_path):
    file = locate(TINY / "sana-vae8")  # vae/: a DC-AE of four stages, 8 pixels a latent (Sana's own is 32)
    sana = diffusion.trace(read(file), str(file), diffusion.Sizes(1, ((256, 256),), guidance=False), folder=file.parent)
    # 256 px / 8 = 32 x 32 latents: 1024 queries over SanaPipeline's 300 prompt tokens, with the prompt's mask
    # (Sana's linear self-attention makes no SDPA call).
    assert shapes(sana.specs.users) == {(1, 1024, 512, 8, "none", "bhss")}
    # PixArt in PixArtAlphaPipeline's folder: that pipeline's 120 tokens (class 128), not PixArt-Sigma's 300.
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "PixArtAlphaPipeline"}))
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text((TINY / "pixart" / "config.json").read_text())
    alpha = diffusion.trace(data("pixart"), "pixart", diffusion.Sizes(1, ((128, 128),), guidance=False), folder=tmp_path / "transformer")  # fmt: skip
    assert {(s.seq_q, s.seq_kv) for s in alpha.specs.users} == {(128, 128)}


@needs_diffusers
def test_manifest_max_seq_widens_traced_cross_attention_by_its_own_lengths(tmp_path):
    # Sana beside an 8x VAE at 64 px: 64 queries over 120 prompt tokens, both in the class of 128.
    out = tmp_path / "sana.yaml"
    options = ("--max-batch", "1", "--resolution", "64x64", "--text-len", "120", "--max-seq", "1024")
    main.main(["manifest", str(TINY / "sana-vae8"), *options, "-o", str(out)], standalone_mode=False)
    # Cross-attention: each side to every class, so 1024 queries (256 px) over the same 120 keys are listed.
    assert {(s.seq_q, s.seq_kv) for s in manifest.load(out)} == {(q, kv) for q in (128, 256, 512, 1024) for kv in (128, 256, 512, 1024)}  # fmt: skip


@pytest.mark.parametrize("name", ["granite-4.0-h", "falcon-h1"])
def test_a_config_transformers_5_wrote_with_an_infinity_gets_a_manifest(tmp_path, name):
    raw = json.loads((TINY / name / "config.json").read_text())
    assert raw["time_step_limit"] == [0.0, {"__float__": "Infinity"}]  # as save_pretrained wrote it
    assert read(TINY / name)["time_step_limit"] == [0.0, float("inf")]
    assert config_of(read(TINY / name), name) == transformers.AutoConfig.from_pretrained(TINY / name)
    traced = trace(read(TINY / name), name, Sizes(1, 128), "sdpa")
    assert traced.specs.users and all(s.heads_q == 8 for s in traced.specs.users)
    if name == "granite-4.0-h":  # its attention layer, after the Mamba one, named
        assert "layers 1 self_attn: prefill" in phases(traced)


def test_special_floats_are_decoded_as_transformers_decodes_them():
    encoded = {"a": [{"__float__": "-Infinity"}, {"__float__": "NaN"}], "b": {"__float__": "other"}, "c": 1.5}
    decoded = special_floats(encoded)
    assert decoded["a"][0] == float("-inf") and decoded["a"][1] != decoded["a"][1]
    assert decoded["b"] == {"__float__": "other"} and decoded["c"] == 1.5
    from transformers import PreTrainedConfig

    truth = PreTrainedConfig._decode_special_floats(encoded)
    assert json.dumps(decoded, default=str) == json.dumps(truth, default=str)


def test_a_field_transformers_refuses_is_named_on_one_line(tmp_path):
    data = read(TINY / "falcon-h1")
    with pytest.raises(ManifestError, match="time_step_limit") as refused:
        config_of({**data, "time_step_limit": "forever"}, "falcon-h1")
    assert "\n" not in str(refused.value)
    (tmp_path / "config.json").write_text(json.dumps({**data, "time_step_limit": "forever"}))
    with pytest.raises(ManifestError, match="cannot read this falcon_h1 config: Validation error for field 'time_step"):
        main.main(["manifest", str(tmp_path), "--max-batch", "1", "--max-seq", "128"], standalone_mode=False)
