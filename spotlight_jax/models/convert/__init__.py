"""Converters from diffusers-format checkpoints to the project's Flax models: ``from_diffusers``
(Qwen-Image, SD3/SD3.5 transformers into the one MMDiT, by table-driven layout rules) and
``vae_from_diffusers``."""
from spotlight_jax.models.convert.diffusers_folder import CheckpointError, read_component
from spotlight_jax.models.convert.transformer import (
    FAMILIES,
    config_from_diffusers,
    convert_tensors,
    from_diffusers,
)
from spotlight_jax.models.convert.vae import vae_from_diffusers

__all__ = ["CheckpointError", "FAMILIES", "config_from_diffusers", "convert_tensors",
           "from_diffusers", "read_component", "vae_from_diffusers"]
