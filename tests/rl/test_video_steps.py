"""Video through the RL steps: a micro Wan transformer (the tiny video world's layout: a prompt
encoder over token ids, pixel frames) samples clips ``[B, F, H, W, 3]`` with block noise on
each frame, the video world's reward scores them, and one Flow-GRPO and one forward-process
train step run on them; on 8 emulated devices with the video tokens ring-attended over ``sp``
(a data x sp mesh) every result equals the same on one device with dense attention."""
import jax
import numpy as np
import pytest

from spotlight_jax import rewards, world
from spotlight_jax.diffusion import Sampler, SamplerConfig
from spotlight_jax.diffusion.sde import block_project
from spotlight_jax.models import AttentionSpec, WanConfig
from spotlight_jax.models.factory import create_model
from spotlight_jax.parallel import MeshConfig, make_mesh
from spotlight_jax.rl import GRPOConfig, GRPOTrainer, advantages
from spotlight_jax.rl.nft import NFTConfig, NFTTrainer

MICRO_WAN = WanConfig(patch_size=(1, 4, 4), num_attention_heads=2, attention_head_dim=12,
                      in_channels=3, out_channels=3, text_dim=16, freq_dim=16, ffn_dim=32,
                      num_layers=2, frames=3, image_size=16, text_len=6, vocab_size=64,
                      text_width=16, text_heads=2, text_layers=1)
SDE = SamplerConfig(num_steps=3, shift=3.0, noise_level=0.7, noise_patch=2)
ODE = SamplerConfig(num_steps=3, shift=3.0, noise_level=0.0)
PROMPTS = ["a red square moving left", "two blue bars falling"]


def _setup():
    graphdef, state = create_model(MICRO_WAN, seed=3)
    rng = np.random.default_rng(4)      # numpy: eager jax.random would compile every shape
    state = jax.tree.map(lambda a: a + 0.2 * rng.standard_normal(a.shape).astype(a.dtype),
                         state)
    prompts = [p for p in PROMPTS for _ in range(4)]
    tokens, mask = world.tokenize(prompts, MICRO_WAN.text_len)
    return graphdef, state, prompts, tokens, mask


def _close(a, b, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


def test_video_rollout_shapes_block_noise_and_reward():
    graphdef, state, prompts, tokens, mask = _setup()
    seeds = np.arange(8, dtype=np.uint32)
    out = Sampler(graphdef, MICRO_WAN.latent_shape, SDE).rollout(state, tokens, mask, seeds)
    assert out["latents"].shape == (8, 4, 3, 16, 16, 3)        # x_T and 3 steps of clips
    assert out["images"].shape == (8, 3, 16, 16, 3)
    assert np.isfinite(np.asarray(out["log_probs"])).all()
    # block noise on a clip is each frame's own block noise
    clip = np.asarray(out["latents"][:, 1])
    per_frame = np.stack([np.asarray(block_project(clip[:, f], 2)) for f in range(3)], 1)
    np.testing.assert_allclose(np.asarray(block_project(clip, 2)), per_frame, atol=1e-6)
    assert np.abs(per_frame - clip).max() > 1e-3            # the projection is not identity
    r = rewards.resolve("video_motion")(np.asarray(out["images"]), prompts)
    assert r.shape == (8,) and np.all((r >= 0) & (r <= 1))
    with pytest.raises(ValueError, match=r"'video_motion' scores clips \[B, F, H, W, 3\]"):
        rewards.resolve("video_motion")(np.asarray(out["images"])[:, 0], prompts)


@pytest.mark.e2e
def test_video_rollouts_and_train_steps_on_8_devices_equal_one_device():
    graphdef, state, prompts, tokens, mask = _setup()
    mesh = make_mesh(jax.devices()[:8], MeshConfig(data=2, fsdp=1, sp=4))
    sp = AttentionSpec(mesh=mesh, strategy="ring", axis="sp")
    seeds = np.arange(8, dtype=np.uint32)
    shape = MICRO_WAN.latent_shape
    with jax.default_matmul_precision("highest"):
        one = Sampler(graphdef, shape, SDE).rollout(state, tokens, mask, seeds)
        many = Sampler(graphdef, shape, SDE, attn=sp, mesh=mesh).rollout(state, tokens, mask,
                                                                          seeds)
        _close(one, many, 2e-5)
        # a pixel reward with spread: each clip's mean red minus blue
        img = np.asarray(one["images"], np.float64)
        r = (img[..., 0] - img[..., 2]).mean(axis=(1, 2, 3))
        ids = np.repeat([0, 1], 4)
        batch = {"latents": np.asarray(one["latents"]), "log_probs": np.asarray(
                 one["log_probs"]), "tokens": tokens, "mask": mask, "prompt_ids": ids,
                 "advantages": advantages(r, ids)}
        grpo = GRPOConfig(train_steps=2, minibatches=1, lr=1e-3, beta=0.01)
        g1 = GRPOTrainer(graphdef, state, grpo, SDE)
        g8 = GRPOTrainer(graphdef, state, grpo, SDE, mesh=mesh, attn=sp)
        m1, m8 = g1.update(batch, jax.random.key(0), 0), g8.update(batch, jax.random.key(0), 0)
        assert m1["grad_norm"] > 0
        np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-5)
        nft = NFTConfig(lr=1e-3, times=2)
        n1 = NFTTrainer(graphdef, state, nft, ODE)
        n8 = NFTTrainer(graphdef, state, nft, ODE, mesh=mesh, attn=sp)
        k1, k8 = n1.update(batch, jax.random.key(1), 0), n8.update(batch, jax.random.key(1), 0)
        assert k1["grad_norm"] > 0
        np.testing.assert_allclose(k8["loss"], k1["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(k8["grad_norm"], k1["grad_norm"], rtol=1e-5)
