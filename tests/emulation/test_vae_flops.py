"""A clip's VAE decode in the cost model: ``emulation.flops.vae_decode_flops`` (the
convolutions and matmuls of our decoder's jaxpr) against XLA's own count of the compiled
decode, and the profile cost model charging it per clip of a video model only."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from spotlight_jax import config as conf
from spotlight_jax.emulation import cost_models, flops
from spotlight_jax.models.vae.wan_vae import (
    WAN21_VAE,
    WAN22_VAE,
    WanVAE,
    WanVAEConfig,
    released_vae,
)

TINY_21 = WanVAEConfig(base_dim=8, z_dim=4, dim_mult=(1, 2, 2), num_res_blocks=1,
                       temperal_downsample=(False, True))
TINY_22 = dataclasses.replace(TINY_21, is_residual=True, patch_size=2, input_channels=12,
                              decoder_base_dim=12)


@pytest.mark.parametrize("cfg", [TINY_21, TINY_22], ids=["wan21", "wan22"])
def test_vae_decode_flops_match_xla_cost_analysis(cfg):
    latent = (3, 16, 16, cfg.z_dim)      # 3 latent frames -> 1 + 2 * 2 = 5 frames
    counted = flops.vae_decode_flops(cfg, latent)
    # shapes only: lowering and compiling need no weights
    graphdef, state = nnx.split(nnx.eval_shape(lambda: WanVAE(cfg, rngs=nnx.Rngs(0))))
    z = jax.ShapeDtypeStruct((1, *latent), jnp.float32)

    def decode(s, z):       # the whole clip in one chunk: XLA counts a loop's body only once
        return nnx.merge(graphdef, s).decode(z, chunk=None)

    assert flops.jaxpr_flops(jax.make_jaxpr(decode)(state, z).jaxpr) == counted
    analysis = jax.jit(decode).lower(state, z).compile().cost_analysis()
    xla = (analysis[0] if isinstance(analysis, (list, tuple)) else analysis)["flops"]
    # XLA skips the taps that fall on spatial padding and adds the elementwise work
    assert 0.9 * counted < xla < 1.1 * counted


def test_released_vae_by_latent_channels():
    assert released_vae(16) is WAN21_VAE and released_vae(48) is WAN22_VAE
    with pytest.raises(ValueError, match="latent channels=8: no released Wan VAE"):
        released_vae(8)


def test_video_profile_charges_the_clip_decode_image_profile_does_not():
    video = cost_models.make_cost_model(conf.cost_config(conf.load_config("configs/tiny_video.py")))
    image = cost_models.make_cost_model(conf.cost_config(conf.load_config("configs/tiny.py")))
    cost = video.cost
    shape = tuple(video.model.latent_shape)
    assert shape == (21, 60, 104, 16)        # Wan 2.1 14B at 480 x 832 x 81 frames
    want = flops.vae_decode_flops(WAN21_VAE, shape) / (video.peak * cost.mfu)
    assert video.clip_decode_s == pytest.approx(want)
    assert 0.1 < want < 10.0                  # ~2.7e14 FLOPs: under a second at 40% of an H100
    assert video.reward(2) == pytest.approx(2 * (want + cost.reward_s_per_image))
    assert image.clip_decode_s == 0.0
    assert image.reward(2) == pytest.approx(2 * image.cost.reward_s_per_image)
    assert any(row.name == "clip_decode" for row in video.describe())
