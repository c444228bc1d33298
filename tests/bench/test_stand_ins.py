"""The random-weight stand-ins a device profile times where no weights are on the device: they
have the real models' sizes (parameter counts against the published checkpoints' f32 sizes),
compute what the learned reward and the VAE compute (against the formula on the same weights),
and the profile records the decode and reward it timed with them, saying so. Building
PickScore's CLIP (even at one layer: its 49408 x 1024 token table) takes tens of seconds on 2
cores, so those checks are among the longer ones (e2e)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import micro_config

from spotlight_jax.bench import _stand_ins as stand_ins
from spotlight_jax.bench import device_profile
from spotlight_jax.config import RunSpec
from spotlight_jax.models.vae import WanVAE
from spotlight_jax.models.vae.wan_vae import WanVAEConfig
from spotlight_jax.rewards import clip_model, learned

SMALL_VAE = WanVAEConfig(base_dim=8, dim_mult=(1, 2), num_res_blocks=1,
                         temperal_downsample=(False,))


def _param_count(build) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(nnx.eval_shape(build))))


@pytest.mark.e2e
def test_the_stand_ins_have_the_published_models_sizes():
    # PickScore_v1 / CLIP-ViT-H-14: pytorch_model.bin 3.94 GB of float32; Wan 2.1's VAE 508 MB
    pick = _param_count(lambda: clip_model.CLIP(stand_ins.PICKSCORE, rngs=nnx.Rngs(0)))
    assert abs(4 * pick / 3.94e9 - 1) < 0.01, pick
    vae = _param_count(lambda: WanVAE(stand_ins.released_vae(16), rngs=nnx.Rngs(0)))
    assert abs(4 * vae / 508e6 - 1) < 0.01, vae


@pytest.mark.e2e
def test_the_stand_in_reward_is_pickscores_formula_on_its_weights():
    pytest.importorskip("tokenizers")
    images = np.random.default_rng(0).uniform(size=(3, 40, 56, 3)).astype(np.float32)
    prompts = ["2 red circles", "a blue square above a green triangle", "nothing known"]
    reward = stand_ins.learned_reward("pickscore", layers=1, seed=3)
    got = reward(images, prompts)
    cfg = stand_ins.reward_config("pickscore", 1)
    assert cfg.vision.layers == cfg.text.layers == 1 and cfg.vision.width == 1280
    model = clip_model.CLIP(cfg, rngs=nnx.Rngs(3))           # the same weights, rebuilt
    with jax.default_matmul_precision("highest"):
        img = model.image_embeds(clip_model.preprocess(images, cfg))
        txt = model.text_embeds(reward.tokenize(prompts))
    cos = np.sum(np.asarray(img / jnp.linalg.norm(img, axis=-1, keepdims=True))
                 * np.asarray(txt / jnp.linalg.norm(txt, axis=-1, keepdims=True)), axis=-1)
    scale = np.exp(float(model.logit_scale[...]))
    assert got.shape == (3,) and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, scale * cos, atol=2e-3 * scale)
    assert np.ptp(got) > 0                                     # the images are told apart
    assert stand_ins.reward_folder("pickscore", 1, 3) == stand_ins.reward_folder("pickscore", 1, 3)


def test_the_stand_in_vae_decodes_as_its_module():
    dec = stand_ins.vae_decoder(16, config=SMALL_VAE, seed=1)
    latents = np.random.default_rng(1).normal(size=(2, 6, 5, 16)).astype(np.float32)
    images = np.asarray(dec.decode(latents))
    assert images.shape == (2, 12, 10, 3) and images.min() >= 0 and images.max() <= 1
    module = WanVAE(SMALL_VAE, rngs=nnx.Rngs(1))
    want = np.clip(np.asarray(module.decode(jnp.asarray(latents))) * 0.5 + 0.5, 0, 1)
    np.testing.assert_allclose(images, want, atol=1e-5)


def test_bad_stand_ins_are_one_line_errors():
    with pytest.raises(ValueError, match="'nope': choose one of \\['pickscore'\\]"):
        stand_ins.reward_config("nope")
    with pytest.raises(ValueError, match="layers=-1"):
        stand_ins.reward_config("pickscore", -1)
    with pytest.raises(ValueError, match="48 channels, the model's 16"):
        stand_ins.vae_decoder(16, config=stand_ins.released_vae(48))


def _rollout(spec, n=2):
    shape = spec.model.latent_shape
    return {"latents": np.random.default_rng(0).normal(size=(n, *shape)).astype(np.float32)}


@pytest.mark.e2e
def test_the_profile_times_the_decode_and_reward_on_stand_ins():
    latent = RunSpec.from_config(micro_config(1, **{"model.channels": 16}))
    decode, reward = device_profile.time_decode_and_reward(
        latent, _rollout(latent), 1, device_profile.StandIns("pickscore", 1, SMALL_VAE))
    assert decode["s_per_image"] > 0 and "Wan VAE" in decode["stand_in"], decode
    assert reward["name"] == "pickscore" and reward["s_per_image"] > 0, reward
    assert reward["stand_in"] == "random-weight pickscore CLIP, 1 vision layers"
    # no stand-in VAE: nothing to score, and the line says how to get one
    decode, reward = device_profile.time_decode_and_reward(latent, _rollout(latent), 1,
                                                           device_profile.StandIns("", 0, None))
    assert "--stand_in_vae" in decode["skipped"] and reward == {"skipped": "no decoded images"}
    # a model that draws pixels: no decode; the run's own reward timed on its images
    pixels = RunSpec.from_config(micro_config(1))
    decode, reward = device_profile.time_decode_and_reward(pixels, _rollout(pixels), 1,
                                                           device_profile.StandIns("", 0, True))
    assert decode == {"skipped": "the model draws pixels: nothing to decode"}
    assert reward["name"] == pixels.settings.reward and reward["s_per_image"] > 0, reward
    assert "stand_in" not in reward


@pytest.mark.e2e
def test_the_stand_in_reward_folder_loads_back_bit_for_bit(tmp_path):
    pytest.importorskip("tokenizers")
    folder = stand_ins.write_reward_folder(tmp_path / "pick", "pickscore", layers=1, seed=2,
                                           words=("Red", "circle", "above"))
    model, cfg = clip_model.from_transformers(folder)
    assert cfg == stand_ins.reward_config("pickscore", 1)
    want = clip_model.CLIP(cfg, rngs=nnx.Rngs(2))
    got = dict(nnx.to_flat_state(nnx.state(model)))
    for path, v in nnx.to_flat_state(nnx.state(want)):
        np.testing.assert_array_equal(np.asarray(got[path].get_value()),
                                      np.asarray(v.get_value()), err_msg=str(path))
    # the run's reward reads it: start-of-text, the words, end-of-text (the largest id), padding
    reward = learned.LearnedReward("pickscore", folder)
    ids = reward.tokenize(["red Circle", "above nowhere"])
    eos = cfg.vocab - 1
    assert ids[0, :4].tolist() == [cfg.vocab - 2, 3, 2, eos] and ids[0, 4] == eos
    assert ids[1, :4].tolist() == [cfg.vocab - 2, 1, 0, eos]          # unknown word: id 0
    scores = reward(np.random.default_rng(0).uniform(size=(2, 32, 32, 3)), ["red", "circle"])
    assert scores.shape == (2,) and np.all(np.isfinite(scores))
