"""Wan 2.1 T2V 1.3B (diffusers' WanTransformer3DModel config), the size most video RL work
post-trains: 480 x 832 x 81 frames, i.e. a 21 x 60 x 104 latent through the Wan 2.1 VAE (4x in
time, 8x in space), 32,760 video tokens with its (1, 2, 2) patches; UMT5 prompts of 512 tokens.

Dry run (memory per device of the update on 8 devices: 2-way FSDP x 4-way Ulysses over the video
tokens, its 12 heads split 3 per device):
  python -m spotlight_jax.main --config=configs/wan21_1_3b.py --workdir=/tmp/x --dry_run
"""
import pathlib
import runpy

import ml_collections

_wan = runpy.run_path(str(pathlib.Path(__file__).with_name("wan21_14b.py")))


def get_config():
    c = _wan["get_config"]()
    c.model = _wan["wan_model"](num_attention_heads=12, ffn_dim=8960, num_layers=30)
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=2, sp=4))
    c.attention = "ulysses"          # 12 heads: Ulysses over 4 devices
    c.cost.profile_model = "wan21_1_3b"
    return c
