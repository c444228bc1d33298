"""Models: the MMDiT velocity model and its prompt encoder."""
from spotlight_jax.models.mmdit import (
    AttentionSpec,
    MMDiT,
    MMDiTConfig,
    as_dtype,
    count_params,
)

__all__ = ["MMDiT", "AttentionSpec", "MMDiTConfig", "as_dtype", "count_params"]
