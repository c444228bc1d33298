"""Models: the MMDiT velocity model (images) with its prompt encoder, the Wan transformer
(video)."""
from spotlight_jax.models.mmdit import (
    AttentionSpec,
    MMDiT,
    MMDiTConfig,
    as_dtype,
    count_params,
)
from spotlight_jax.models.wan_transformer import WanConfig, WanTransformer

__all__ = ["MMDiT", "AttentionSpec", "MMDiTConfig", "WanConfig", "WanTransformer", "as_dtype",
           "count_params"]
