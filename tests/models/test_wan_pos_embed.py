"""The tiny Wan model's absolute positions (``pos_embed='learned'``, not in diffusers' Wan, which
has 3-D RoPE only): a frame, a row and a column table summed onto the video tokens. Checked
against the plain model whose patch embedding's output gets a table built cell by cell in the
tokens' (frame, row, column) order, zero-initialised so a grown base starts unchanged, able to
tell positions apart at pure noise where the plain model cannot, and its bad settings."""
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
                  num_layers=1, frames=3, image_size=6, image_width=8, text_len=5,
                  vocab_size=20, text_width=16, text_layers=1, text_heads=2)
TOKENS = jnp.array([[3, 7, 2, 9, 0], [5, 1, 0, 0, 0]])
MASK = TOKENS > 0


@nnx.jit
def velocity(model, x, t):
    return model(x, t, TOKENS, MASK)


def _pair():
    """(plain model, positioned model holding the plain one's parameters where names match)."""
    plain = WanTransformer(MICRO, rngs=nnx.Rngs(0))
    placed = WanTransformer(dataclasses.replace(MICRO, pos_embed="learned"), rngs=nnx.Rngs(1))
    return plain, grown_from(plain, placed)


def _inputs():
    x = jax.random.normal(jax.random.key(2), (2, *MICRO.latent_shape))
    return x, jnp.array([0.3, 1.0])


def test_the_tables_cover_the_patch_grid_and_a_grown_model_starts_as_the_plain_one():
    plain, placed = _pair()
    gf, gh, gw = MICRO.patch_grid
    assert (gf, gh, gw) == (3, 3, 4)
    assert placed.pos_frame.shape == (gf, MICRO.dim)
    assert placed.pos_row.shape == (gh, MICRO.dim) and placed.pos_col.shape == (gw, MICRO.dim)
    assert plain.pos_frame is None
    x, t = _inputs()
    np.testing.assert_array_equal(np.asarray(velocity(placed, x, t)),
                                  np.asarray(velocity(plain, x, t)))


def test_each_token_gets_its_frame_row_and_column_embedding():
    plain, placed = _pair()
    gf, gh, gw = MICRO.patch_grid
    keys = jax.random.split(jax.random.key(4), 3)
    tables = [jax.random.normal(k, (n, MICRO.dim)) for k, n in zip(keys, (gf, gh, gw))]
    placed.pos_frame[...], placed.pos_row[...], placed.pos_col[...] = tables
    table = np.zeros((gf * gh * gw, MICRO.dim), np.float32)
    for i, (f, r, c) in enumerate((f, r, c) for f in range(gf) for r in range(gh)
                                  for c in range(gw)):
        table[i] = tables[0][f] + tables[1][r] + tables[2][c]
    embed = plain.patch_embed

    class Shifted(nnx.Module):      # the plain model's patch embedding + the hand-built table
        def __init__(self):
            self.inner = embed

        def __call__(self, p):
            return self.inner(p) + jnp.asarray(table)

    plain.patch_embed = Shifted()
    x, t = _inputs()
    np.testing.assert_allclose(np.asarray(velocity(placed, x, t)),
                               np.asarray(velocity(plain, x, t)), atol=1e-5, rtol=1e-5)


def test_zero_initialised_tables_still_learn_and_tell_positions_apart_at_pure_noise():
    """At t = 1 the input carries no position: with the same value in every cell, every patch of
    the plain model's output is the same (RoPE sees only relative offsets, and the values it mixes
    are all alike); the positioned one, once its row table moved, differs from row to row."""
    plain, placed = _pair()
    graphdef, state = nnx.split(placed)
    x, t = _inputs()
    grads = jax.jit(jax.grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(x, t, TOKENS, MASK)
                                               ** 2)))(state)
    for name in ("pos_frame", "pos_row", "pos_col"):
        assert float(jnp.abs(grads[name][...]).max()) > 0, name
    flat, ones = jnp.full((2, *MICRO.latent_shape), 0.7), jnp.ones(2)

    def first_pixel_of_each_patch(model):      # [batch, frames, rows, columns, channels]
        return np.asarray(velocity(model, flat, ones))[:, :, ::2, ::2]

    plain_out = first_pixel_of_each_patch(plain)
    assert np.ptp(plain_out.reshape(2, -1, 3), axis=1).max() < 1e-4
    placed.pos_row[...] = jax.random.normal(jax.random.key(5), placed.pos_row.shape)
    rows = first_pixel_of_each_patch(placed).mean(axis=(1, 3))     # [batch, rows, channels]
    assert float(np.ptp(rows, axis=1).max()) > 1e-2


@pytest.mark.parametrize("change,match", [
    (dict(pos_embed="sincos"), "pos_embed='sincos'"),
])
def test_bad_pos_embed_settings_say_which(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(MICRO, **change).validate()


def test_a_latent_of_another_grid_is_a_clear_error():
    _, placed = _pair()
    x = jnp.zeros((1, 3, 6, 6, 3))
    with pytest.raises(ValueError, match="pos_embed='learned' holds tables for 3 x 3 x 4"):
        placed(x, jnp.ones(1), TOKENS[:1], MASK[:1])
