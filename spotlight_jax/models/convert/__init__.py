"""Converters from diffusers-format checkpoints to the project's Flax models."""
from spotlight_jax.models.convert.vae import vae_from_diffusers

__all__ = ["vae_from_diffusers"]
