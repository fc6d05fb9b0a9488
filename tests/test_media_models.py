"""Vision, audio, multimodal and diffusers models (issue 40) warmed ONLY from
``graphcache manifest`` for their tiny configs, then served through the
drop-in (graphcache.torch.patch()) by their own code: the model's forward, an
image-text model's generate(), a diffusers pipeline. One case of each kind,
the CPU stand-in compiler executing every graph; every case of every model,
with the reference compiler, is scripts/bench/bench_media_models.py's table."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from tests import media_models  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    monkeypatch.setattr(media_models, "STEPS", 1)  # one denoising step makes every call a step makes
    gt.reset()
    yield
    gt.reset()


# One case of each kind, small: the table's cases at the suite's sizes (each (size, batch), or audio lengths).
CASES = {
    "vit": ("--max-batch 4 --image-size 288x288", {"288x288, batch of 4": [((288, 288), 4)]}),  # interpolated
    "wav2vec2": ("--max-batch 4 --max-seq 24000", {"padded batch of 4": [(8000, 12000, 20000, 24000)]}),
    "qwen2_5_vl": (  # its vision tower's windows and full block, then the prompt holding the image
        "--max-batch 1 --max-seq 384 --image-size 224x224",
        {"224x224 image, b=1": [((224, 224), (20,))]},
    ),
    "sam": ("--max-batch 2", {"2 images": [((256, 256), 2)]}),  # its vision encoder and mask decoder
    "sd-unet": ("--max-batch 1 --resolution 192x192", {"192x192, guidance pair": [((192, 192), 1)]}),  # batch 2
    "flux": ("--max-batch 1 --resolution 128x128", {"128x128, guidance pair": [((128, 128), 1)]}),  # 512 + 64
    # A denoiser in no table of graphcache.models.diffusion: its inputs derived from its forward and config.
    "cogview4": ("--max-batch 1 --resolution 128x128 --text-len 32", {"128x128, guidance pair": [((128, 128), 1)]}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_of_model_is_served_from_its_traced_manifest(tmp_path, name):
    if media_models.MODELS[name].kind == "diffusion":
        pytest.importorskip("diffusers", reason="needs diffusers (the dev extra; graphcache[diffusers])")
    options, cases = CASES[name]
    compiler = CpuGraphCompiler()
    (result,), builds = media_models.served(name, tmp_path, compiler, None, options.split(), cases, separate=False)
    assert builds == 0 and compiler.loads > 0
    assert result.calls and result.fraction >= 0.95, result
    assert result.equal, result


def test_a_unet_recorded_at_one_latent_size_with_max_seq_serves_a_larger_one(tmp_path):
    pytest.importorskip("diffusers", reason="needs diffusers (the dev extra; graphcache[diffusers])")
    from graphcache import manifest

    compiler = CpuGraphCompiler()
    record = [((128, 128), 1)]  # a 16 x 16 latent (256 tokens in the first block), its guidance pair
    model, cache = media_models.recorded("sd-unet", tmp_path, compiler, record, max_seq=1024)
    (larger,) = media_models.serve("sd-unet", model, cache, only=["192x192, guidance pair"])  # 24 x 24: 576
    assert larger.calls and larger.fraction >= 0.95, larger
    assert larger.equal, larger
    # Without --max-seq the recording holds only the classes it saw: not the 576 tokens' (class 1024).
    media_models.recorded("sd-unet", tmp_path / "plain", compiler, record, max_seq=None)
    plain = manifest.load(tmp_path / "plain" / "sd-unet-recorded.yaml")
    assert max(s.seq_q for s in plain) == 256
    assert max(s.seq_q for s in manifest.load(tmp_path / "sd-unet-recorded.yaml")) == 1024


@pytest.mark.parametrize("name", ["swin", "sam"])
def test_windowed_attention_recorded_at_one_image_with_max_batch_2_serves_two_images(tmp_path, name):
    """Windows: each call's batch is images x windows (Swin at 56 px: 4
    windows, then one; SAM at 256 px: 9 windows, then its global layer), so
    --max-batch 2 widens each call by images (4 windows to 8 rows, one to 2),
    not every call to batches 1 and 2. SAM's global layer takes q, k and v
    as views of its fused qkv at one image and as copies at two: both."""
    from graphcache import manifest

    compiler = CpuGraphCompiler()
    size = (56, 56) if name == "swin" else (256, 256)
    model, cache = media_models.recorded(name, tmp_path, compiler, [(size, 1)], max_seq=None, max_batch=2)
    rows = {4, 8} if name == "swin" else {16, 32}  # the windows' classes for one image and two
    assert {s.batch for s in manifest.load(tmp_path / f"{name}-recorded.yaml") if s.bias} >= rows
    (two,) = media_models.serve(name, model, cache, cases={"2 images": [(size, 2)]})
    assert two.calls and two.fraction == 1.0, two
    assert two.equal, two
