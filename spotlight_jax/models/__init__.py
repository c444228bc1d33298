"""Models: the MMDiT velocity model (images) with its prompt encoder, the Wan transformer
(video), Z-Image and FLUX.2."""
from spotlight_jax.models.flux2_transformer import Flux2Config, Flux2Transformer
from spotlight_jax.models.mmdit import (
    AttentionSpec,
    MMDiT,
    MMDiTConfig,
    as_dtype,
    count_params,
)
from spotlight_jax.models.wan_transformer import WanConfig, WanTransformer
from spotlight_jax.models.z_image_transformer import ZImageConfig, ZImageTransformer

__all__ = ["MMDiT", "AttentionSpec", "MMDiTConfig", "WanConfig", "WanTransformer",
           "ZImageConfig", "ZImageTransformer", "Flux2Config", "Flux2Transformer", "as_dtype",
           "count_params"]
