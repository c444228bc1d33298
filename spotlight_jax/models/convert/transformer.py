"""``from_diffusers``: a diffusers transformer folder -> our MMDiT and its config.

The family comes from ``config.json``'s ``_class_name``; each family module maps the diffusers
config to an :class:`MMDiTConfig` and lists its conversion rules (``layout.Rule``). Weights go
straight into an abstract model (``nnx.eval_shape``): nothing is randomly initialised first.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.models.convert import (
    flux,
    flux2,
    layout,
    placement,
    qwen_image,
    sd3,
    wan,
    z_image,
)
from spotlight_jax.models.convert.diffusers_folder import CheckpointError, read_component
from spotlight_jax.models.mmdit import MMDiT, MMDiTConfig

FAMILIES = {m.CLASS_NAME: m for m in (flux, qwen_image, sd3)}
# transformers that are their own model class: (config of config.json, model of the folder)
OWN_CLASSES = {
    wan.CLASS_NAME: (lambda config, source, **o: wan.wan_config(config, **o),
                     lambda config, tensors, dtype, shardings, source, **o: wan.wan_model(
                         config, tensors, dtype, shardings, **o)),
    z_image.CLASS_NAME: (lambda config, source, **o: z_image.z_image_config(config, **o),
                         lambda config, tensors, dtype, shardings, source, **o:
                         z_image.z_image_model(config, tensors, dtype, shardings, source=source,
                                               **o)),
    flux2.CLASS_NAME: (lambda config, source, **o: flux2.flux2_config(config, source=source, **o),
                       lambda config, tensors, dtype, shardings, source, **o: flux2.flux2_model(
                           config, tensors, dtype, shardings, source=source, **o)),
}
SUPPORTED = sorted([*FAMILIES, *OWN_CLASSES])
# the top-level groups whose blocks scan_blocks stacks (one source tensor per block): the MMDiT's
# and FLUX.2's dual- and single-stream blocks, Z-Image's layers and refiners
STACKS = ("blocks", "single_blocks", "layers", "noise_refiner", "context_refiner")


def convert_tensors(config: dict, tensors: dict, *, source: str = "checkpoint",
                    lazy: bool = False, **overrides) -> tuple[MMDiTConfig, dict]:
    """``(our config, {our parameter path: numpy array})`` of a diffusers transformer's
    ``config.json`` and tensors (``lazy``: ``{path: function returning it}``, every check
    done first); ``overrides`` replace config fields (e.g. ``remat=True``)."""
    name = config.get("_class_name")
    family = FAMILIES.get(name)
    if family is None:
        raise CheckpointError(f"{source}: _class_name={name!r} is not a transformer we convert "
                              f"(supported: {SUPPORTED})")
    cfg = dataclasses.replace(family.model_config(config, tensors, source),
                              **overrides).validate()
    flat = dataclasses.replace(cfg, scan_blocks=False, remat=False)
    _, abstract = nnx.split(nnx.eval_shape(lambda: MMDiT(flat, rngs=nnx.Rngs(0))))
    targets = {tuple(path): tuple(var.get_value().shape)
               for path, var in nnx.to_flat_state(abstract)}
    arrays = layout.apply_rules(tensors, family.rules(cfg), targets, checked=family.CHECKED,
                                source=source, lazy=lazy)
    family.check(tensors, cfg, source)
    return cfg, arrays


def pipeline_class(checkpoint_dir) -> str | None:
    """The ``_class_name`` of the pipeline whose ``model_index.json`` sits beside the component
    folder (``<pipeline>/transformer``), or None: it tells Qwen-Image-Edit from Qwen-Image,
    whose transformers share a class and a config."""
    index = pathlib.Path(checkpoint_dir).resolve().parent / "model_index.json"
    try:
        return json.loads(index.read_text()).get("_class_name")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None


def _component(checkpoint_dir) -> tuple[dict, dict]:
    """``read_component`` with the pipeline's class added to the config (``_pipeline_class``)."""
    config, tensors = read_component(checkpoint_dir)
    return {**config, "_pipeline_class": pipeline_class(checkpoint_dir)}, tensors


def config_from_diffusers(checkpoint_dir, **overrides) -> MMDiTConfig:
    """Our config of a diffusers transformer folder without converting its weights (the
    tensors are only memory-mapped, for the families whose options the stored shapes decide;
    a Wan, Z-Image or FLUX.2 folder gives its own config class); ``overrides`` replace fields as in
    :func:`from_diffusers`."""
    config, tensors = _component(checkpoint_dir)
    own = OWN_CLASSES.get(config.get("_class_name"))
    if own is not None:                     # Wan (video), Z-Image, FLUX.2
        return own[0](config, str(checkpoint_dir), **overrides)
    family = FAMILIES.get(config.get("_class_name"))
    if family is None:
        raise CheckpointError(f"{checkpoint_dir}: _class_name={config.get('_class_name')!r} is "
                              f"not a transformer we convert (supported: {SUPPORTED})")
    return dataclasses.replace(family.model_config(config, tensors, str(checkpoint_dir)),
                               **overrides).validate()


def from_diffusers(checkpoint_dir, dtype=jnp.float32, *, shardings=None,
                   **overrides) -> tuple[MMDiT, MMDiTConfig]:
    """``(model, config)`` of a diffusers transformer component folder (``.../transformer``:
    ``config.json`` and one or sharded safetensors, fp32/bf16/fp16); for a Wan video
    transformer ``(models.wan_transformer.WanTransformer, WanConfig)`` (``convert.wan``, its ``x``
    ``[B, F, H, W, C]``; each parameter placed on its sharding in turn), for Z-Image
    ``(ZImageTransformer, ZImageConfig)`` and for FLUX.2 ``(Flux2Transformer, Flux2Config)``
    (``convert.z_image``, ``convert.flux2``: the same call).

    ``dtype`` is the parameter and compute dtype. The model takes unpacked latents ``x``
    ``[B, H, W, C]``, ``t`` = sigma in [0, 1], text embeddings ``[B, L, D]``, an optional bool
    text mask and, for SD3, the pooled embedding; it returns the velocity ``noise - x0``, the
    sign diffusers' flow-matching models use. ``overrides`` set other config fields, e.g.
    ``scan_blocks=True, remat=True`` for training a large model.

    The weights stream from the memory-mapped files onto the devices one parameter at a time
    (for stacked blocks, one block's tensor at a time), each straight onto its sharding:
    ``shardings(path, shape)`` (our parameter path, the stored shape) gives a
    ``jax.sharding.Sharding`` (default: the default device). The host then never holds more
    than one parameter's local shards and one source tensor (:func:`host_peak_bytes`).

    A Qwen-Image-Edit folder (its pipeline's ``model_index.json`` beside it names an edit
    pipeline) gives an editing model: call it with ``image_latents``, the input image's VAE
    latents (``MMDiTConfig.reference_images``).
    """
    config, tensors = _component(checkpoint_dir)
    own = OWN_CLASSES.get(config.get("_class_name"))
    if own is not None:                     # Wan (video), Z-Image, FLUX.2
        return own[1](config, tensors, dtype, shardings, str(checkpoint_dir), **overrides)
    dtype_name = np.dtype(dtype).name
    cfg, thunks = convert_tensors(config, tensors, source=str(checkpoint_dir), lazy=True,
                                  dtype=dtype_name, param_dtype=dtype_name, **overrides)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MMDiT(cfg, rngs=nnx.Rngs(0))))
    stacks = ({"blocks": cfg.depth, "single_blocks": cfg.single_blocks} if cfg.scan_blocks
              else {})
    placement.fill(state, placement.stack_parts(thunks, stacks), dtype, shardings)
    return nnx.merge(graphdef, state), cfg


def host_peak_bytes(cfg: MMDiTConfig, shardings, source_itemsize: int = 2) -> int:
    """Host bytes :func:`from_diffusers` holds at most while loading ``cfg``'s transformer onto
    ``shardings`` (``(path, shape) -> Sharding``): the largest parameter's distinct local
    shard buffers plus one converted source tensor (the memory-mapped files themselves are
    page cache, not counted)."""
    from spotlight_jax.models.factory import abstract_model  # noqa: PLC0415  (the family's)
    _, abstract = abstract_model(cfg)
    item = np.dtype(cfg.param_dtype).itemsize
    peak = 0
    for path, var in nnx.to_flat_state(abstract):
        shape = tuple(var.get_value().shape)
        indices = shardings(tuple(path), shape).addressable_devices_indices_map(shape)
        keys = {placement.index_key(ix, shape) for ix in indices.values()}
        local = sum(int(np.prod([b - a for a, b in k])) for k in keys) * item
        per_part = int(np.prod(shape[1:] if cfg.scan_blocks and path[0] in STACKS
                               else shape))
        peak = max(peak, local + per_part * max(source_itemsize, item))
    return peak
