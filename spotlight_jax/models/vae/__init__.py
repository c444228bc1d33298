"""Flax VAEs of the real-model families (SD3's ``AutoencoderKL``, Qwen-Image's single-frame
``AutoencoderKLQwenImage``), channels-last, and ``LatentVAE``, the frozen wrapper that speaks the
DiT's normalised latents. Loading from diffusers folders is ``models.convert.vae``."""
from spotlight_jax.models.vae.autoencoder_kl import AutoencoderKL, AutoencoderKLConfig
from spotlight_jax.models.vae.latent_vae import LatentVAE
from spotlight_jax.models.vae.qwen_image import QwenImageVAE, QwenImageVAEConfig

__all__ = ["AutoencoderKL", "AutoencoderKLConfig", "LatentVAE", "QwenImageVAE",
           "QwenImageVAEConfig"]
