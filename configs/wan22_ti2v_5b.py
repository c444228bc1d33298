"""Wan 2.2 TI2V 5B (diffusers' WanTransformer3DModel config), text-to-video: 704 x 1280 x 121
frames through the Wan 2.2 VAE (4x in time, 16x in space, 48 channels), i.e. a 31 x 44 x 80
latent, 27,280 video tokens with its (1, 2, 2) patches; UMT5 prompts of 512 tokens.

Dry run (memory per device of the update on 8 devices, Ulysses over the video tokens):
  python -m spotlight_jax.main --config=configs/wan22_ti2v_5b.py --workdir=/tmp/x --dry_run
From a diffusers Wan 2.2 TI2V 5B folder, its transformer converts and its VAE (residual levels,
2 x 2 pixels folded into channels) decodes the clips (docs/video.md).
"""
import pathlib
import runpy

import ml_collections

_wan = runpy.run_path(str(pathlib.Path(__file__).with_name("wan21_14b.py")))


def get_config():
    c = _wan["get_config"]()
    c.model = _wan["wan_model"](frames=31, image_size=44, image_width=80, num_attention_heads=24,
                                ffn_dim=14336, num_layers=30, in_channels=48, out_channels=48)
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, sp=8))
    c.attention = "ulysses"          # 24 heads: Ulysses over 8 devices
    c.sampler.shift = 5.0
    c.cost.profile_model = "wan22_ti2v_5b"
    c.cost.image_pixels = 704
    return c
