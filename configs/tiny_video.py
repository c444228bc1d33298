"""Tiny CPU video config: the synthetic video world (moving shapes), a ~1M-parameter Wan
transformer drawing 5 frames of 24x24 RGB pixels (4x4 patches: 180 video tokens).

Prompts such as "a red square moving left" or "two blue bars falling"; the reward
(``video_motion``) is the mean of four parts: the frames holding the asked count of the asked
color, those objects' shape, how well they move the asked way and how steadily they are followed
(``spotlight_jax.world.video``, docs/video.md).

Run:  python -m spotlight_jax.main --config=configs/tiny_video.py --workdir=/tmp/spotlight_video
Dry run:  python -m spotlight_jax.main --config=configs/tiny_video.py --workdir=/tmp/x --dry_run
"""
import pathlib
import runpy

import ml_collections

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def get_config():
    c = _base["get_config"]()
    # The Wan transformer (spotlight_jax.models.WanConfig; diffusers' config.json names), with
    # the synthetic world's prompt encoder in place of UMT5 states, its masked mean also added to
    # the timestep embedding (pooled='text_mean', not in diffusers' Wan: docs/video.md).
    c.model = ml_collections.ConfigDict(dict(
        family="wan", frames=5, image_size=24, text_len=8,
        patch_size=(1, 4, 4), num_attention_heads=4, attention_head_dim=32, in_channels=3,
        out_channels=3, text_dim=64, freq_dim=64, ffn_dim=384, num_layers=4,
        cross_attn_norm=True, eps=1e-6, rope_theta=10_000.0, dtype="float32",
        param_dtype="float32", remat=False, remat_policy="nothing",
        vocab_size=64, text_width=64, text_layers=2, text_heads=2, pooled="text_mean",
        pos_embed="learned"))
    c.pretrain.batch_size = 64
    c.pretrain.steps = 2000
    c.pretrain.eval_every = 500
    c.pretrain.eval_prompts = 20
    c.rl.reward = "video_motion"
    c.rl.eval_reward = "video_motion"
    c.rl.eval_prompts = 20
    # An iteration budget, not RL minutes: the same run on every machine (a slower one takes
    # longer; the progress bar projects when it ends). 60 iterations: 15-21 minutes on 2 shared
    # cores (docs/video.md).
    c.rl.iterations = 60
    c.rl.max_minutes = 0.0
    c.rl.eval_every = 20
    # 20 held-out prompts x 16 seeds, the same clips before and after: a paired gain's interval
    c.rl.eval_seeds = 16
    c.rl.prompts_per_iter = 4
    c.sampler.noise_patch = 1
    # the virtual clock prices each video as Wan 2.1 14B would take it at 480p x 81 frames
    c.cost.profile_model = "wan21_14b"
    c.cost.image_pixels = 480
    return c
