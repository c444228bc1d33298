"""Building a model from its config: abstractly (shapes only) or with parameters created
directly in their sharded layout (``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``),
never on one device first. The config's type picks the model: ``MMDiTConfig`` -> the MMDiT
(images), ``WanConfig`` -> the Wan transformer (video)."""
from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from spotlight_jax.models.mmdit import MMDiT, MMDiTConfig
from spotlight_jax.models.wan_transformer import WanConfig, WanTransformer
from spotlight_jax.parallel.sharding import param_specs

ModelConfig = MMDiTConfig | WanConfig


def model_class(cfg: ModelConfig):
    """The model class ``cfg`` configures."""
    if isinstance(cfg, WanConfig):
        return WanTransformer
    if isinstance(cfg, MMDiTConfig):
        return MMDiT
    raise TypeError(f"no model is configured by a {type(cfg).__name__}; give an MMDiTConfig "
                    "or a WanConfig")


def is_video(cfg: ModelConfig) -> bool:
    """Whether the model samples video latents ``[frames, H, W, C]`` (else images)."""
    return len(cfg.latent_shape) == 4


def abstract_model(cfg: ModelConfig, seed: int = 0):
    """``(graphdef, abstract_state)`` without allocating parameters."""
    cls = model_class(cfg)
    return nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(seed))))


def create_model(cfg: ModelConfig, mesh: Mesh | None = None, seed: int = 0):
    """``(graphdef, state)`` with parameters created directly in their sharded layout."""
    graphdef, abstract = abstract_model(cfg, seed)
    cls = model_class(cfg)

    def init():
        return nnx.split(cls(cfg, rngs=nnx.Rngs(seed)))[1]

    if mesh is None:
        return graphdef, jax.jit(init)()
    shardings = param_specs(abstract, mesh)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), shardings,
                             is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return graphdef, jax.jit(init, out_shardings=shardings)()
