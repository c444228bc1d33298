"""Growing a model: the pixel-head decoder starts at zero, so a model grown from a checkpoint
without it computes exactly what the checkpoint's model computes; mismatches are clear errors."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import micro_model

from spotlight_jax.io import checkpoints
from spotlight_jax.models.factory import create_model


def _velocity(cfg, graphdef, state):
    k = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(k[0], (2, cfg.image_size, cfg.image_size, cfg.channels))
    tokens = jax.random.randint(k[1], (2, cfg.text_len), 1, cfg.vocab_size)
    return nnx.merge(graphdef, state)(x, jnp.array([0.3, 0.8]), tokens,
                                      jnp.ones((2, cfg.text_len), bool))




@pytest.mark.e2e   # ~25 s of compiles: kept out of the default command's budget (.ci/run runs it)
def test_grown_pixel_head_model_equals_its_source_then_trains(tmp_path):
    cfg, graphdef, state = micro_model()
    checkpoints.save_params(str(tmp_path / "small"), state, {})
    big_cfg = dataclasses.replace(cfg, pixel_head=4)
    big_graphdef, fresh = create_model(big_cfg, seed=3)
    grown, loaded, new = checkpoints.grow_params(str(tmp_path / "small"), fresh)
    assert sorted(new) == sorted(f"pixel_{n}" for n in (
        "feat.kernel", "feat.bias", "convs.0.kernel", "convs.0.bias", "convs.1.kernel",
        "convs.1.bias", "convs.2.kernel", "convs.2.bias"))
    assert len(loaded) == len(jax.tree.leaves(state))
    big = jax.jit(lambda s: _velocity(big_cfg, big_graphdef, s))
    source = np.asarray(jax.jit(lambda s: _velocity(cfg, graphdef, s))(state))
    np.testing.assert_array_equal(np.asarray(big(grown)), source)
    # the decoder is live: a non-zero last conv changes the velocity, and gradients reach it
    pure = nnx.to_pure_dict(grown)
    pure["pixel_convs"][2]["kernel"] = pure["pixel_convs"][2]["kernel"] + 0.1
    moved = jax.tree.map(lambda x: x, grown)
    nnx.replace_by_pure_dict(moved, pure)
    assert np.abs(np.asarray(big(moved)) - source).max() > 1e-3

    g = jax.jit(jax.grad(lambda s: jnp.sum(_velocity(big_cfg, big_graphdef, s) ** 2)))(moved)
    assert float(jnp.abs(nnx.to_pure_dict(g)["pixel_convs"][2]["kernel"]).max()) > 0


def test_grow_errors_name_the_problem(tmp_path):
    cfg, graphdef, state = micro_model()
    with pytest.raises(ValueError, match="no checkpoint to grow from"):
        checkpoints.grow_params(str(tmp_path / "missing"), state)
    checkpoints.save_params(str(tmp_path / "small"), state, {})
    wider = dataclasses.replace(cfg, width=48, num_heads=4)
    _, other = create_model(wider)
    with pytest.raises(ValueError, match="has shape"):
        checkpoints.grow_params(str(tmp_path / "small"), other)
