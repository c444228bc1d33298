"""Flax VAEs of the real-model families (SD3's ``AutoencoderKL``, also the network of FLUX.2's
``AutoencoderKLFlux2``, whose packed batch-norm latent statistics are ``flux2_vae``; Wan 2.1's
causal 3-D ``AutoencoderKLWan``, which is also Qwen-Image's ``AutoencoderKLQwenImage`` on single
frames), channels-last, and ``LatentVAE``, the frozen wrapper that speaks the DiT's normalised
latents. Loading from diffusers folders is ``models.convert.vae``."""
from spotlight_jax.models.vae.autoencoder_kl import AutoencoderKL, AutoencoderKLConfig
from spotlight_jax.models.vae.latent_vae import LatentVAE
from spotlight_jax.models.vae.wan_vae import WanVAE, WanVAEConfig

__all__ = ["AutoencoderKL", "AutoencoderKLConfig", "LatentVAE", "WanVAE", "WanVAEConfig"]
