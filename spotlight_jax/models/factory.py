"""Building a model from its config: abstractly (shapes only) or with parameters created
directly in their sharded layout (``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``),
never on one device first. The config's type picks the model: ``MMDiTConfig`` -> the MMDiT
(images: our model, Qwen-Image(-Edit), SD3, FLUX.1), ``WanConfig`` -> the Wan transformer
(video), ``ZImageConfig`` -> Z-Image, ``Flux2Config`` -> FLUX.2."""
from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from spotlight_jax.models.flux2_transformer import Flux2Config, Flux2Transformer
from spotlight_jax.models.mmdit import MMDiT, MMDiTConfig
from spotlight_jax.models.wan_transformer import WanConfig, WanTransformer
from spotlight_jax.models.z_image_transformer import ZImageConfig, ZImageTransformer
from spotlight_jax.parallel.sharding import param_specs

ModelConfig = MMDiTConfig | WanConfig | ZImageConfig | Flux2Config
MODEL_CLASSES = {MMDiTConfig: MMDiT, WanConfig: WanTransformer, ZImageConfig: ZImageTransformer,
                 Flux2Config: Flux2Transformer}


def model_class(cfg: ModelConfig):
    """The model class ``cfg`` configures."""
    cls = MODEL_CLASSES.get(type(cfg))
    if cls is None:
        raise TypeError(f"no model is configured by a {type(cfg).__name__}; give one of "
                        f"{[c.__name__ for c in MODEL_CLASSES]}")
    return cls


def is_video(cfg: ModelConfig) -> bool:
    """Whether the model samples video latents ``[frames, H, W, C]`` (else images)."""
    return len(cfg.latent_shape) == 4


def is_edit(cfg: ModelConfig) -> bool:
    """Whether the model edits an input image (``reference_images > 0``): its prompts carry the
    image (``diffusion.prompt.IMAGE``), and with a prompt encoder it learns the editing world."""
    return getattr(cfg, "reference_images", 0) > 0


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
