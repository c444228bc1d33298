"""A run whose base model is a diffusers pipeline folder (a tiny random Qwen-Image transformer
and its VAE, tests/fixtures/diffusers/pipeline_qwen_image): the transformer is converted into the
MMDiT, its architecture comes from the checkpoint (the config chooses latent size, prompt length
and dtypes), prompts come from an embedding file, and every rollout's latents are decoded by the
Flax VAE before the reward. nft post-trains a Qwen-Image base and Flow-GRPO a FLUX.1 [dev] one
(tests/fixtures/diffusers/pipeline_flux) for an iteration; the held-out images are the VAE's
pixels."""

import jax
import numpy as np
import pytest
from helpers import QWEN_PIPE, flux_fixture_config, qwen_fixture_config

from spotlight_jax.config import ConfigError, image_decoder, model_config, validate
from spotlight_jax.io import safetensors_format
from spotlight_jax.train import train_and_evaluate

PIPE = QWEN_PIPE


def _config(tmp_path, objective, **overrides):
    return qwen_fixture_config(tmp_path, objective, **overrides)


def test_the_checkpoints_config_is_read_once(tmp_path, monkeypatch):
    from spotlight_jax import config as conf
    from spotlight_jax.models import convert

    reads = []
    real = convert.config_from_diffusers
    monkeypatch.setattr(convert, "config_from_diffusers",
                        lambda *a, **k: reads.append(a) or real(*a, **k))
    conf.sections._diffusers_architecture.cache_clear()
    config = _config(tmp_path, "nft")
    first = model_config(config)
    assert all(model_config(config) == first for _ in range(3)) and len(reads) == 1
    config.model.text_len = 16              # another run field: its own read
    assert model_config(config).text_len == 16 and len(reads) == 2


def test_the_model_config_comes_from_the_checkpoint(tmp_path):
    config = _config(tmp_path, "nft", **{"model.depth": 7, "model.width": 512})
    cfg = model_config(config)
    # architecture from the checkpoint (the config's depth and width are not read) ...
    assert (cfg.depth, cfg.width, cfg.channels, cfg.pos_embed) == (1, 32, 16, "rope3d")
    # ... the run's choices from the config
    assert (cfg.image_size, cfg.text_len) == (8, 12)
    vae = image_decoder(config)
    assert vae.latent_channels == 16 and vae.downsample_factor == 4
    validate(config, jax.devices())


def test_a_folder_without_a_vae_is_a_config_error(tmp_path):
    (tmp_path / "pipe").mkdir()
    (tmp_path / "pipe" / "transformer").symlink_to(PIPE / "transformer")
    config = _config(tmp_path, "nft", base_checkpoint=str(tmp_path / "pipe"))
    with pytest.raises(ConfigError, match="no vae/config.json"):
        image_decoder(config)


@pytest.mark.e2e
def test_post_training_a_diffusers_base_decodes_with_its_vae(tmp_path):
    """nft here; Flow-GRPO from a diffusers base is the Flux run below (the same path: the
    VAE decodes every rollout, the LoRA is exported)."""
    config = _config(tmp_path, "nft")
    history = train_and_evaluate(config, str(tmp_path / "run"))
    rows = [h for h in history if "reward_mean" in h]
    evals = [h for h in history if "val_reward" in h]
    assert len(rows) == 1 and evals and all(np.isfinite(h["val_reward"]) for h in evals)
    assert np.isfinite(rows[0]["reward_mean"]) and rows[0]["loss"] == rows[0]["loss"]
    grid = list((tmp_path / "run" / "samples").glob("*.png"))
    assert grid, "the held-out sample grid (decoded pixels) was not written"
    # the post-trained LoRA, exported for diffusers at the end of the run
    lora = safetensors_format.load(tmp_path / "run" / "lora_diffusers.safetensors")
    assert "transformer.transformer_blocks.0.attn.to_q.lora_A.weight" in lora
    assert any(np.abs(v).max() > 0 for k, v in lora.items() if "lora_B" in k)


@pytest.mark.e2e
def test_post_training_a_flux_dev_base_with_its_distilled_guidance(tmp_path):
    """FLUX.1 [dev]'s structure from a pipeline folder: its single-stream blocks and guidance
    embedding converted, rollouts at guidance 3.5 as the model's input (one pass), Flow-GRPO's
    log-probs recomputed the same way, the VAE's pixels rewarded, the LoRA (single-stream
    blocks included) exported for diffusers."""
    config = flux_fixture_config(tmp_path, "flow_grpo")
    cfg = model_config(config)
    assert (cfg.single_blocks, cfg.guidance_embed, cfg.pos_embed) == (1, True, "rope3d_flux")
    vae = image_decoder(config)
    assert vae.latent_channels == 16
    history = train_and_evaluate(config, str(tmp_path / "run"))
    rows = [h for h in history if "reward_mean" in h]
    assert len(rows) == 1 and np.isfinite(rows[0]["loss"]) and rows[0]["grad_norm"] > 0
    # the rollout's log-probs and the trainer's recomputation agree (the same one-pass velocity)
    assert rows[0]["rollout_logp_dev"] < 1e-3
    assert all(np.isfinite(h["val_reward"]) for h in history if "val_reward" in h)
    lora = safetensors_format.load(tmp_path / "run" / "lora_diffusers.safetensors")
    assert "transformer.single_transformer_blocks.0.proj_out.lora_A.weight" in lora
    assert "transformer.transformer_blocks.0.attn.add_q_proj.lora_B.weight" in lora


def test_prompts_outside_the_world_grammar_form_one_planner_cluster():
    from spotlight_jax.runner.build import prompt_kind
    assert prompt_kind("a red square") == "single"
    assert prompt_kind("a photo of a cat on a sofa, golden hour") == "other"
