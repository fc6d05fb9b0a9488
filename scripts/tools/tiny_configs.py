"""Write the tiny model configs of docs/examples/configs/tiny/ (issue 40) as
the installed transformers and diffusers save them: 2 layers, hidden 256 (head
dim 32), no weights. The files are committed; this script is how they were
made, and rewrites them for another release:

    python scripts/tools/tiny_configs.py            # every config
    python scripts/tools/tiny_configs.py vit flux   # some

transformers' ``save_pretrained`` writes Granite 4.0-H's and Falcon-H1's
``time_step_limit`` upper bound as ``{"__float__": "Infinity"}`` (transformers
5); diffusers' ``save_config`` writes ``_class_name``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "examples" / "configs" / "tiny"
_SMALL: dict[str, Any] = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8)
_DECODER: dict[str, Any] = dict(_SMALL, num_key_value_heads=2, vocab_size=1000, pad_token_id=0)


def transformers_configs() -> dict[str, Any]:
    import transformers
    from transformers import AutoConfig

    qwen_text = dict(
        _DECODER,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 1000000.0},
    )
    qwen_vision = dict(
        depth=2, hidden_size=128, intermediate_size=256, num_heads=4, out_hidden_size=256, fullatt_block_indexes=[1]
    )
    mamba = dict(mamba_n_heads=8, mamba_d_head=64, mamba_d_state=64)
    return {
        "vit": AutoConfig.for_model("vit", **_SMALL, image_size=224, patch_size=16),
        "dinov2": AutoConfig.for_model("dinov2", **_SMALL, image_size=224, patch_size=14),
        "siglip-vision": AutoConfig.for_model("siglip_vision_model", **_SMALL, image_size=224, patch_size=16),
        "clip-vision": AutoConfig.for_model("clip_vision_model", **_SMALL, image_size=224, patch_size=32),
        # Its feature extractor narrowed to 64 channels (512 in wav2vec2-base): bf16 convolutions are slow on a CPU.
        "wav2vec2": AutoConfig.for_model(
            "wav2vec2", **_SMALL, vocab_size=32, feat_extract_norm="layer", conv_dim=[64] * 7, conv_bias=True
        ),
        "qwen2_5_vl": transformers.Qwen2_5_VLConfig(
            text_config=qwen_text,
            vision_config=qwen_vision,
            image_token_id=900,
            video_token_id=901,
            vision_start_token_id=902,
            vision_end_token_id=903,
            bos_token_id=1,
            eos_token_id=2,
        ),
        # A Mamba layer, then an attention one (Granite 4.0-H interleaves them).
        "granite-4.0-h": AutoConfig.for_model(
            "granitemoehybrid",
            **{**_DECODER, **mamba},
            shared_intermediate_size=512,
            num_local_experts=4,
            layer_types=["mamba", "attention"],
        ),
        "falcon-h1": AutoConfig.for_model("falcon_h1", **_DECODER),
        # Windowed attention: 56 px in patches of 4 is 14 x 14, 4 windows of 7 x 7 (shifted in the second
        # block), then 7 x 7, one window: each call's batch is images x windows.
        "swin": AutoConfig.for_model(
            "swin", image_size=56, patch_size=4, embed_dim=64, depths=[2, 2], num_heads=[2, 4], window_size=7
        ),
        # SAM: a windowed layer and a global one (relative position biases), then the mask decoder's
        # two-way attention between the prompt's tokens and the image's 16 x 16 embeddings.
        "sam": transformers.SamConfig(
            vision_config=dict(
                hidden_size=256,
                num_hidden_layers=2,
                num_attention_heads=8,
                mlp_dim=512,
                image_size=256,
                patch_size=16,
                window_size=7,
                global_attn_indexes=[1],
                output_channels=256,
            ),
            prompt_encoder_config=dict(image_size=256, patch_size=16, image_embedding_size=16, hidden_size=256),
            mask_decoder_config=dict(hidden_size=256, mlp_dim=512, num_hidden_layers=2, num_attention_heads=8),
        ),
    }


def diffusers_models() -> dict[str, Any]:
    import diffusers

    sana = diffusers.SanaTransformer2DModel.from_config(
        dict(
            in_channels=8,
            out_channels=8,
            num_attention_heads=8,
            attention_head_dim=32,
            num_layers=2,
            num_cross_attention_heads=8,
            cross_attention_head_dim=32,
            cross_attention_dim=256,
            caption_channels=128,
            sample_size=16,
            patch_size=1,
        )
    )
    return {
        "sd-unet": diffusers.UNet2DConditionModel.from_config(
            dict(
                sample_size=16,
                in_channels=4,
                out_channels=4,
                block_out_channels=[64, 128],
                layers_per_block=1,
                down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
                up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"],
                cross_attention_dim=256,
                attention_head_dim=2,  # heads, in UNet2DConditionModel's naming: head dims 32 and 64
                norm_num_groups=32,
            )
        ),
        "flux": diffusers.FluxTransformer2DModel.from_config(
            dict(
                patch_size=1,
                in_channels=64,
                num_layers=2,
                num_single_layers=2,
                attention_head_dim=32,
                num_attention_heads=8,
                joint_attention_dim=256,
                pooled_projection_dim=128,
                guidance_embeds=True,
                axes_dims_rope=[4, 14, 14],
            )
        ),
        "sd3": diffusers.SD3Transformer2DModel.from_config(
            dict(
                sample_size=16,
                patch_size=2,
                in_channels=16,
                out_channels=16,
                num_layers=2,
                attention_head_dim=32,
                num_attention_heads=8,
                joint_attention_dim=256,
                caption_projection_dim=256,
                pooled_projection_dim=128,
                pos_embed_max_size=96,
            )
        ),
        # Denoisers whose inputs graphcache manifest derives from their config (text width 128, not the
        # hidden 256, so the trace settles which width the model takes).
        "pixart": diffusers.PixArtTransformer2DModel.from_config(
            dict(
                num_attention_heads=8,
                attention_head_dim=32,
                in_channels=4,
                out_channels=8,
                num_layers=2,
                cross_attention_dim=256,
                caption_channels=128,
                sample_size=16,
                patch_size=2,
                norm_type="ada_norm_single",
                use_additional_conditions=False,
            )
        ),
        "cogvideox": diffusers.CogVideoXTransformer3DModel.from_config(
            dict(
                num_attention_heads=8,
                attention_head_dim=32,
                in_channels=4,
                out_channels=4,
                time_embed_dim=128,
                text_embed_dim=128,
                num_layers=2,
                sample_width=16,
                sample_height=16,
                sample_frames=9,
                patch_size=2,
                max_text_seq_length=64,
            )
        ),
        "sana": sana,
        "auraflow": diffusers.AuraFlowTransformer2DModel.from_config(
            dict(
                sample_size=16,
                patch_size=2,
                in_channels=4,
                num_mmdit_layers=1,
                num_single_dit_layers=1,
                attention_head_dim=32,
                num_attention_heads=8,
                joint_attention_dim=128,
                caption_projection_dim=256,
                out_channels=4,
                pos_embed_max_size=256,
            )
        ),
        "lumina2": diffusers.Lumina2Transformer2DModel.from_config(
            dict(
                sample_size=16,
                patch_size=2,
                in_channels=4,
                hidden_size=256,
                num_layers=2,
                num_refiner_layers=1,
                num_attention_heads=8,
                num_kv_heads=2,
                cap_feat_dim=128,
                axes_dim_rope=[8, 12, 12],
                axes_lens=[300, 512, 512],
            )
        ),
        "ltx": diffusers.LTXVideoTransformer3DModel.from_config(
            dict(
                in_channels=8,
                out_channels=8,
                patch_size=1,
                patch_size_t=1,
                num_attention_heads=8,
                attention_head_dim=32,
                cross_attention_dim=256,
                num_layers=2,
                caption_channels=128,
            )
        ),
        # A class no table of graphcache.models.diffusion names: its prompt length is --text-len's.
        "cogview4": diffusers.CogView4Transformer2DModel.from_config(
            dict(
                patch_size=2,
                in_channels=4,
                out_channels=4,
                num_layers=2,
                attention_head_dim=32,
                num_attention_heads=8,
                text_embed_dim=128,
                time_embed_dim=128,
                condition_dim=32,
                pos_embed_max_size=64,
                sample_size=16,
                rope_axes_dim=[256, 256],
            )
        ),
        # A pipeline folder: Sana's transformer beside a VAE of 8 pixels a latent (DC-AE's own is 32), so
        # 64 px is 8 x 8 latents and 256 px 32 x 32 (1024 tokens); graphcache manifest reads its VAE's factor.
        "sana-vae8": {
            "model_index.json": {
                "_class_name": "SanaPipeline",
                "transformer": ["diffusers", "SanaTransformer2DModel"],
                "vae": ["diffusers", "AutoencoderDC"],
            },  # fmt: skip
            "transformer": sana,  # the same model as "sana": only the VAE beside it differs
            "vae": diffusers.AutoencoderDC.from_config(
                dict(
                    latent_channels=8,
                    attention_head_dim=8,
                    encoder_block_out_channels=[8, 16, 32, 32],
                    decoder_block_out_channels=[8, 16, 32, 32],
                    encoder_layers_per_block=[1, 1, 1, 1],
                    decoder_layers_per_block=[1, 1, 1, 1],
                    encoder_qkv_multiscales=[[], [], [], []],
                    decoder_qkv_multiscales=[[], [], [], []],
                )
            ),
        },
        "wan": diffusers.WanTransformer3DModel.from_config(
            dict(
                patch_size=[1, 2, 2],
                num_attention_heads=8,
                attention_head_dim=32,
                in_channels=16,
                out_channels=16,
                text_dim=256,
                freq_dim=256,
                ffn_dim=512,
                num_layers=2,
            )
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    made = {**transformers_configs(), **diffusers_models()}
    for name in args.names or sorted(made):
        if name not in made:
            print(f"unknown config {name!r}: {', '.join(sorted(made))}", file=sys.stderr)
            return 2
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        what = made[name]
        if isinstance(what, dict):  # a diffusers pipeline folder: model_index.json and a folder per model
            for part, model in what.items():
                if part.endswith(".json"):
                    (folder / part).write_text(json.dumps(model, indent=2) + "\n")
                else:
                    model.save_config(folder / part)
            print(f"wrote {folder.relative_to(ROOT)}/ ({', '.join(what)})")
            continue
        if hasattr(what, "save_pretrained") and not hasattr(what, "save_config"):
            what.save_pretrained(folder)  # a transformers config: config.json
        else:
            what.save_config(folder)  # a diffusers model's config.json, _class_name and all
        print(f"wrote {(folder / 'config.json').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
