"""A Qwen-Image-architecture model (3-axis RoPE, text RMSNorm, timestep-only conditioning, text
mask) with its Flax VAE in the rollout loop: rollouts, one Flow-GRPO and one forward-process
train step on 8 emulated devices with sequence-parallel attention (a data x sp mesh, ring
attention) equal the same on one device with dense attention.

The transformer is random (its architecture is the converted Qwen-Image fixture's, with the
fixture VAE's 16 latent channels); the VAE is the tiny random diffusers checkpoint whose parity
tests/models/test_vae.py checks."""
import dataclasses
import pathlib

import jax
import numpy as np
import pytest

from spotlight_jax.diffusion import Sampler, SamplerConfig
from spotlight_jax.diffusion.rollout import sampling_compiler_options
from spotlight_jax.models import AttentionSpec
from spotlight_jax.models.convert import from_diffusers, vae_from_diffusers
from spotlight_jax.models.factory import create_model
from spotlight_jax.parallel import MeshConfig, make_mesh
from spotlight_jax.rl import GRPOConfig, GRPOTrainer, advantages
from spotlight_jax.rl.nft import NFTConfig, NFTTrainer

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"
SAMPLER = SamplerConfig(num_steps=3, shift=3.0, noise_level=0.7)
ODE = SamplerConfig(num_steps=3, shift=3.0, noise_level=0.0)


def _setup():
    vae = vae_from_diffusers(FIX / "vae" / "qwen_image")
    _, qcfg = from_diffusers(FIX / "transformer" / "qwen_image")
    cfg = dataclasses.replace(qcfg, channels=vae.latent_channels, image_size=8, text_len=8)
    graphdef, state = create_model(cfg, seed=3)
    # adaLN-Zero starts every gate and the output layer at zero (the blocks would be skipped):
    # perturb every weight so attention, RoPE and the mask shape the velocity
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(4), len(leaves))
    state = jax.tree.unflatten(treedef, [a + 0.2 * jax.random.normal(k, a.shape, a.dtype)
                                         for k, a in zip(keys, leaves)])
    mesh = make_mesh(jax.devices()[:8], MeshConfig(data=2, fsdp=1, sp=4))
    sp = AttentionSpec(mesh=mesh, strategy="ring", axis="sp")
    rng = np.random.default_rng(0)
    n = 8                                      # 2 prompts x 4 seeds
    tokens = np.repeat(rng.normal(size=(2, cfg.text_len, cfg.text_embed_dim)), 4, 0)
    mask = np.ones((n, cfg.text_len), bool)
    mask[4:, 5:] = False                       # the second prompt is 5 tokens long
    return vae, cfg, graphdef, state, mesh, sp, tokens.astype(np.float32), mask


def _close(a, b, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


def _close_after_adam(a, b, lr):
    """Weights after one AdamW step from the same start. Adam's first update is
    lr * g / (|g| + eps) per element: an element whose gradient is ~0 moves by an ill-conditioned
    fraction of lr when the devices sum in another order, so the check is that almost every
    element agrees to 1% of one step (a wrong sharded computation changes every gradient) and
    that the mean difference is 1e-4 of a step; the losses and gradient norms are compared
    tightly by the caller."""
    d = np.concatenate([np.abs(np.asarray(x) - np.asarray(y)).ravel() for x, y in
                        zip(jax.tree.leaves(a), jax.tree.leaves(b))])
    assert float((d > 0.01 * lr).mean()) <= 1e-3, float((d > 0.01 * lr).mean())
    assert float(d.mean()) <= 1e-4 * lr, float(d.mean())


@pytest.mark.e2e
def test_rollouts_and_train_steps_on_8_devices_equal_one_device():
    vae, cfg, graphdef, state, mesh, sp, tokens, mask = _setup()
    seeds = np.arange(8, dtype=np.uint32)
    shape = (cfg.image_size, cfg.image_size, cfg.channels)
    with jax.default_matmul_precision("highest"):
        one = Sampler(graphdef, shape, SAMPLER, decoder=vae).rollout(state, tokens, mask, seeds)
        many = Sampler(graphdef, shape, SAMPLER, attn=sp, mesh=mesh, decoder=vae).rollout(
            state, tokens, mask, seeds)
        assert one["images"].shape == (8, 32, 32, 3)          # the VAE upsamples x4
        # the prompt and its mask reach the velocity (the two prompts' latents differ)
        assert np.abs(np.asarray(one["latents"][0, -1] - one["latents"][4, -1])).max() > 1e-2
        _close(one, many, 2e-5)
        # the images are the VAE's decode of the final latent (compiled as the rollout program
        # is: XLA's fusion choices alone move a pixel by ~1e-6)
        decode = jax.jit(vae.decode, compiler_options=sampling_compiler_options())
        np.testing.assert_allclose(np.asarray(one["images"]),
                                   np.asarray(decode(one["latents"][:, -1])), atol=1e-6)
        # a pixel-space reward: each image's mean red minus blue (seeds draw different images)
        img = np.asarray(one["images"], np.float64)
        r = (img[..., 0] - img[..., 2]).mean(axis=(1, 2))
        batch = {"latents": np.asarray(one["latents"]), "log_probs": np.asarray(
                 one["log_probs"]), "tokens": tokens, "mask": mask,
                 "prompt_ids": np.repeat([0, 1], 4),
                 "advantages": advantages(r, np.repeat([0, 1], 4))}
        assert np.abs(batch["advantages"]).max() > 0

        grpo = GRPOConfig(train_steps=2, minibatches=1, lr=1e-3, beta=0.01)
        g1 = GRPOTrainer(graphdef, state, grpo, SAMPLER)
        g8 = GRPOTrainer(graphdef, state, grpo, SAMPLER, mesh=mesh, attn=sp)
        m1 = g1.update(batch, jax.random.key(0), 0)
        m8 = g8.update(batch, jax.random.key(0), 0)
        assert m1["grad_norm"] > 0
        np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-5)
        _close_after_adam(g8.trainable, g1.trainable, grpo.lr)

        nft = NFTConfig(lr=1e-3, times=2)
        n1 = NFTTrainer(graphdef, state, nft, ODE)
        n8 = NFTTrainer(graphdef, state, nft, ODE, mesh=mesh, attn=sp)
        k1 = n1.update(batch, jax.random.key(1), 0)
        k8 = n8.update(batch, jax.random.key(1), 0)
        assert k1["grad_norm"] > 0
        np.testing.assert_allclose(k8["loss"], k1["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(k8["grad_norm"], k1["grad_norm"], rtol=1e-5)
        _close_after_adam(n8.trainable, n1.trainable, nft.lr)
        _close_after_adam(n8.old, n1.old, nft.lr)
