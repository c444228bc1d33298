"""Random-weight stand-ins, at their real shapes, for the models a device profile times where
their weights cannot be downloaded (a lent accelerator reaches nothing outside it).

* :func:`vae_decoder`: the released Wan VAE of the model's latent channels (Wan 2.1's, which is
  also Qwen-Image's ``AutoencoderKLQwenImage`` on single frames), as a :class:`LatentVAE`
  decoding the DiT's latents, in float32 as the runs decode.
* :func:`learned_reward`: a learned reward's CLIP (:data:`REWARDS`: PickScore's CLIP-H/14, the
  reward Flow-GRPO and the paper train on) written as a transformers folder
  (:func:`write_reward_folder`: config, weights, a word-level tokenizer) and loaded as the runs
  load the real one (:class:`rewards.learned.LearnedReward`).

A random initialisation has the real model's shapes, dtypes and program, so its time is the
real model's; its outputs mean nothing: these are for timing only, and every profile row they
time says so (``"stand_in"``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import tempfile

from flax import nnx

from spotlight_jax.io import safetensors_format
from spotlight_jax.models.vae import LatentVAE, WanVAE
from spotlight_jax.models.vae.wan_vae import WanVAEConfig, released_vae
from spotlight_jax.rewards import clip_model, learned

PICKSCORE = clip_model.CLIPConfig(
    vision=clip_model.TowerConfig(width=1280, layers=32, heads=16, mlp=5120, act="gelu"),
    text=clip_model.TowerConfig(width=1024, layers=24, heads=16, mlp=4096, act="gelu"),
    image_size=224, patch=14, vocab=49408, max_len=77, projection=1024, eos_id=2)
"""PickScore's CLIP (``yuvalkirstain/PickScore_v1``: LAION's CLIP-ViT-H-14 fine-tuned)."""
REWARDS = {"pickscore": PICKSCORE}
"""A learned reward's name -> the architecture of its CLIP."""


def reward_config(name: str, layers: int = 0) -> clip_model.CLIPConfig:
    """The CLIP of reward ``name``, with ``layers`` per tower instead of its own (0: the real
    depth; fewer for a quick check on a CPU)."""
    if name not in REWARDS:
        raise ValueError(f"stand-in reward {name!r}: choose one of {sorted(REWARDS)}")
    if layers < 0:
        raise ValueError(f"layers={layers}: must be >= 0 (0 = the real model's depth)")
    cfg = REWARDS[name]
    if layers:
        cfg = dataclasses.replace(cfg, vision=dataclasses.replace(cfg.vision, layers=layers),
                                  text=dataclasses.replace(cfg.text, layers=layers))
    return cfg


def reward_label(name: str, layers: int = 0) -> str:
    """How a result timed with reward ``name``'s stand-in says so."""
    return (f"random-weight {name} CLIP, {reward_config(name, layers).vision.layers} "
            "vision layers")


@functools.cache
def reward_folder(name: str = "pickscore", layers: int = 0, seed: int = 0) -> pathlib.Path:
    """:func:`write_reward_folder` into a temporary folder, once per process, over the
    synthetic world's words (PickScore's is 3.9 GB: never under a folder that is sent back)."""
    from spotlight_jax import world  # noqa: PLC0415
    return write_reward_folder(tempfile.mkdtemp(prefix=f"stand_in_{name}_"), name, layers, seed,
                               words=world.VOCAB[1:])


def learned_reward(name: str = "pickscore", layers: int = 0, seed: int = 0):
    """Reward ``name`` as the runs score with it (:class:`rewards.learned.LearnedReward`: host
    preprocessing, tokenizer, batched scoring) over its random-weight stand-in
    (:func:`reward_folder`)."""
    return learned.LearnedReward(name, reward_folder(name, layers, seed))


def vae_decoder(latent_channels: int, video: bool = False, config: WanVAEConfig | None = None,
                seed: int = 0) -> LatentVAE:
    """A random-weight :class:`LatentVAE` of ``config`` (default: the released Wan VAE with
    ``latent_channels``), float32, identity latent normalisation."""
    cfg = config or released_vae(latent_channels)
    if cfg.z_dim != latent_channels:
        raise ValueError(f"stand-in VAE: its latents have {cfg.z_dim} channels, the model's "
                         f"{latent_channels}")
    module = WanVAE(cfg, rngs=nnx.Rngs(seed))
    return LatentVAE(module, latent_channels=cfg.z_dim, latent_scale=1.0, latent_shift=0.0,
                     downsample_factor=cfg.downsample_factor, family="stand-in Wan VAE",
                     video=video)


def write_reward_folder(folder, name: str = "pickscore", layers: int = 0, seed: int = 0,
                        words=()) -> pathlib.Path:
    """A transformers ``CLIPModel`` folder of reward ``name``'s CLIP with random weights
    (:func:`reward_config`): ``config.json``, ``model.safetensors`` and a word-level
    ``tokenizer.json`` over ``words`` (lower-cased, split on whitespace and punctuation,
    start- and end-of-text around them, the end-of-text id the largest, as CLIP's) -- what
    ``learned_rewards.<name>_dir`` takes, so that a run scores with the stand-in in its loop.
    Needs the ``tokenizers`` package, as the learned rewards do."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors  # noqa: PLC0415

    cfg = reward_config(name, layers)
    out = pathlib.Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model = clip_model.CLIP(cfg, rngs=nnx.Rngs(seed))
    (out / "config.json").write_text(json.dumps(clip_model.transformers_config(cfg), indent=1))
    safetensors_format.save(out / "model.safetensors", clip_model.transformers_tensors(model))
    words = sorted({w.lower() for w in words})
    if len(words) + 3 > cfg.vocab:
        raise ValueError(f"{len(words)} words: the model's vocabulary has {cfg.vocab} ids")
    bos, eos, unk = "<|startoftext|>", "<|endoftext|>", "<unk>"
    vocab = {unk: 0, **{w: i + 1 for i, w in enumerate(words)}, bos: cfg.vocab - 2,
             eos: cfg.vocab - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, cfg.vocab - 2), (eos, cfg.vocab - 1)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": bos, "eos_token": eos, "pad_token": eos, "unk_token": unk}))
    return out
