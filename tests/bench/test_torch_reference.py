"""The sampler benchmark's PyTorch reference computes the same model as the JAX MMDiT: the
velocity on random weights (every zero-initialised layer perturbed, so each one matters) and a
whole Euler ODE rollout from the same x_T."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax import world
from spotlight_jax.config import load_config, model_config
from spotlight_jax.diffusion import Sampler, SamplerConfig
from spotlight_jax.diffusion.rollout import initial_noise
from spotlight_jax.models.factory import create_model

torch = pytest.importorskip("torch")
from spotlight_jax.bench._torch_reference import TorchMMDiT  # noqa: E402


@pytest.fixture(scope="module")
def model():
    cfg = model_config(load_config("configs/tiny.py"))
    graphdef, state = create_model(cfg, seed=3)
    params = nnx.to_pure_dict(state)
    rng = np.random.default_rng(0)
    # adaLN-Zero and the output layers start at zero: give every parameter a random part
    params = jax.tree.map(lambda a: np.asarray(a) + 0.05 * rng.standard_normal(a.shape)
                          .astype(np.float32), params)
    nnx.replace_by_pure_dict(state, params)
    return cfg, graphdef, state, params


def _prompts(cfg, n):
    prompts = (world.train_prompts(world.WorldConfig(image_size=cfg.image_size)) * 4)[:n]
    return world.tokenize(prompts, cfg.text_len)


def test_velocity_matches_the_jax_model(model):
    cfg, graphdef, state, params = model
    tokens, mask = _prompts(cfg, 6)
    assert not np.asarray(mask).all()       # padded prompts: the key mask is exercised
    x = np.random.default_rng(1).standard_normal((6, 32, 32, 3)).astype(np.float32)
    t = np.linspace(0.05, 0.95, 6).astype(np.float32)
    want = np.asarray(nnx.merge(graphdef, state)(jnp.asarray(x), jnp.asarray(t), tokens, mask))
    ref = TorchMMDiT(cfg, params)
    with torch.inference_mode():
        ctx = ref.encode(torch.from_numpy(np.asarray(tokens)), torch.from_numpy(np.asarray(mask)))
        got = ref(torch.from_numpy(x), torch.from_numpy(t), ctx).numpy()
    assert np.abs(want).mean() > 0.1        # a model that outputs something
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-5)   # measured: 7e-6


def test_ode_rollout_matches_the_jax_sampler(model):
    cfg, graphdef, state, params = model
    tokens, mask = _prompts(cfg, 4)
    seeds = np.arange(4, dtype=np.uint32)
    sc = SamplerConfig(num_steps=6, shift=3.0, noise_level=0.0, sde_type="ode")
    out = Sampler(graphdef, (32, 32, 3), sc).rollout(state, tokens, mask, seeds)
    want = np.asarray(out["latents"][:, -1])
    x_t = torch.from_numpy(np.array(initial_noise(seeds, (32, 32, 3))))
    got = TorchMMDiT(cfg, params).ode_rollout(
        x_t, sc.sigmas, torch.from_numpy(np.asarray(tokens)),
        torch.from_numpy(np.asarray(mask))).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert np.abs(got - np.asarray(x_t)).mean() > 0.1     # the rollout moved


def test_an_unported_option_is_a_clear_error(model):
    cfg, _, _, params = model
    with pytest.raises(ValueError, match="pos_embed='rope3d'"):
        TorchMMDiT(dataclasses.replace(cfg, pos_embed="rope3d"), params)
