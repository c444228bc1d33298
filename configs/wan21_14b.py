"""Wan 2.1 T2V 14B (diffusers' WanTransformer3DModel config): 480 x 832 x 81 frames, i.e. a
21 x 60 x 104 latent (the VAE compresses 4x in time, 8x in space), 32,760 video tokens with its
(1, 2, 2) patches, UMT5 prompts of 512 tokens.

Dry run (memory per device of the update on 8 devices, Ulysses over the video tokens):
  python -m spotlight_jax.main --config=configs/wan21_14b.py --workdir=/tmp/x --dry_run
It is also the cost model's video profile: a tiny video run is timed as this model would be
(configs/tiny_video.py sets cost.profile_model='wan21_14b').
"""
import pathlib
import runpy

import ml_collections

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def wan_model(**fields):
    """The Wan 2.1 14B transformer section (``models.WanConfig``), with ``fields`` changed."""
    return ml_collections.ConfigDict(dict(dict(
        family="wan", frames=21, image_size=60, image_width=104, text_len=512,
        patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
        out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
        cross_attn_norm=True, eps=1e-6, rope_theta=10_000.0, dtype="bfloat16",
        param_dtype="bfloat16", remat=True, remat_policy="nothing", scan_blocks=True,
        vocab_size=64, text_width=0, text_layers=2, text_heads=2), **fields))


def get_config():
    c = _base["get_config"]()
    c.model = wan_model()
    c.num_cpu_devices = 8
    c.trainer_devices = 0
    c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, sp=8))
    c.attention = "ulysses"          # 40 heads: Ulysses over 8 devices
    c.rl.lora_rank = 32
    c.rl.lora_alpha = 64.0
    c.sampler.shift = 3.0
    c.rl.reward = "video_motion"
    c.rl.eval_reward = "video_motion"
    c.rl.prompts_per_iter = 4
    c.rl.group_size = 8
    c.rl.nft.minibatches = 32        # nft: one clip (x rl.nft.times rows) per accumulated chunk
    c.sampler.num_steps = 20
    c.sampler.noise_patch = 1
    c.sampler.guidance = 5.0
    c.cost.profile_model = "wan21_14b"
    c.cost.image_pixels = 480
    return c
