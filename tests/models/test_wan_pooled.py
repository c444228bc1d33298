"""The tiny Wan model's pooled text conditioning (``pooled='text_mean'``, not in diffusers' Wan):
the prompt encoder's masked mean, projected, added to the timestep embedding. Checked against
the plain model with that projection folded into its timestep bias (one prompt per call, so a
bias shift is the same thing), zero-initialised so a grown base starts unchanged, the sampler's
``context`` path, and its bad settings."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import grown_from

from spotlight_jax.models.wan_transformer import WanConfig, WanTransformer

MICRO = WanConfig(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                  in_channels=3, out_channels=3, text_dim=16, freq_dim=16, ffn_dim=32,
                  num_layers=2, frames=3, image_size=6, image_width=8, text_len=5,
                  vocab_size=20, text_width=16, text_layers=1, text_heads=2)
TOKENS = jnp.array([[3, 7, 2, 9, 0], [5, 1, 0, 0, 0]])
MASK = TOKENS > 0


@nnx.jit
def velocity(model, x, t, tokens, mask):
    return model(x, t, tokens, mask)


@nnx.jit
def velocity_of_encoded(model, x, t, tokens, mask):
    """As a sampler calls it: the prompt encoded once, passed as ``context``."""
    return model(x, t, tokens, mask, context=model.encode(tokens, mask))


def _pair():
    """(plain model, pooled model holding the plain one's parameters where names match)."""
    plain = WanTransformer(MICRO, rngs=nnx.Rngs(0))
    pooled = WanTransformer(dataclasses.replace(MICRO, pooled="text_mean"), rngs=nnx.Rngs(1))
    return plain, grown_from(plain, pooled)


def _inputs():
    x = jax.random.normal(jax.random.key(2), (2, *MICRO.latent_shape))
    return x, jnp.array([0.3, 0.8])


def test_a_grown_model_starts_as_the_plain_one():
    plain, pooled = _pair()
    assert float(jnp.abs(pooled.pool_proj.kernel[...]).max()) == 0.0
    x, t = _inputs()
    np.testing.assert_array_equal(np.asarray(velocity(pooled, x, t, TOKENS, MASK)),
                                  np.asarray(velocity(plain, x, t, TOKENS, MASK)))


def test_the_pooled_prompt_shifts_the_timestep_embedding_of_its_sample():
    """Per sample: the pooled model = the plain model whose timestep bias carries that
    sample's projected mean prompt features (computed here from the encoder directly)."""
    plain, pooled = _pair()
    k = jax.random.normal(jax.random.key(3), pooled.pool_proj.kernel.shape) * 0.5
    pooled.pool_proj.kernel[...] = k
    pooled.pool_proj.bias[...] = jnp.linspace(-0.2, 0.2, k.shape[1])
    x, t = _inputs()
    got = np.asarray(velocity(pooled, x, t, TOKENS, MASK))
    feats, _ = pooled.encoder(TOKENS, MASK)
    bias = np.asarray(plain.time_2.bias[...])
    for i in range(2):
        valid = np.asarray(feats[i])[np.asarray(MASK[i])]
        shift = valid.mean(0) @ np.asarray(k) + np.asarray(pooled.pool_proj.bias[...])
        plain.time_2.bias[...] = jnp.asarray(bias + shift)
        want = np.asarray(velocity(plain, x[i:i + 1], t[i:i + 1], TOKENS[i:i + 1],
                                   MASK[i:i + 1]))
        np.testing.assert_allclose(got[i:i + 1], want, atol=1e-5, rtol=1e-5)
    assert float(np.abs(got - np.asarray(velocity(plain, x, t, TOKENS, MASK))).max()) > 1e-3
    # the sampler's path: the prompt encoded once and passed as context
    np.testing.assert_allclose(np.asarray(velocity_of_encoded(pooled, x, t, TOKENS, MASK)), got,
                               atol=1e-6)


def test_a_zero_initialised_projection_still_learns():
    _, pooled = _pair()
    graphdef, state = nnx.split(pooled)
    x, t = _inputs()
    grads = jax.jit(jax.grad(
        lambda s: jnp.sum(nnx.merge(graphdef, s)(x, t, TOKENS, MASK) ** 2)))(state)
    assert float(jnp.abs(grads["pool_proj"]["kernel"][...]).max()) > 0


@pytest.mark.parametrize("change,match", [
    (dict(pooled="mean"), "pooled='mean'"),
    (dict(pooled="text_mean", text_width=0), "needs the world's prompt encoder"),
])
def test_bad_pooled_settings_say_which(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(MICRO, **change).validate()
