"""``from_diffusers``: a diffusers transformer folder -> our MMDiT and its config.

The family comes from ``config.json``'s ``_class_name``; each family module maps the diffusers
config to an :class:`MMDiTConfig` and lists its conversion rules (``layout.Rule``). Weights go
straight into an abstract model (``nnx.eval_shape``): nothing is randomly initialised first.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.models.convert import layout, qwen_image, sd3
from spotlight_jax.models.convert.checkpoint import CheckpointError, read_component
from spotlight_jax.models.mmdit import MMDiT, MMDiTConfig

FAMILIES = {m.CLASS_NAME: m for m in (qwen_image, sd3)}


def convert_tensors(config: dict, tensors: dict, *, source: str = "checkpoint",
                    **overrides) -> tuple[MMDiTConfig, dict]:
    """``(our config, {our parameter path: numpy array})`` of a diffusers transformer's
    ``config.json`` and tensors; ``overrides`` replace config fields (e.g. ``remat=True``)."""
    name = config.get("_class_name")
    family = FAMILIES.get(name)
    if family is None:
        raise CheckpointError(f"{source}: _class_name={name!r} is not a transformer we convert "
                              f"(supported: {sorted(FAMILIES)})")
    cfg = dataclasses.replace(family.model_config(config, tensors, source),
                              **overrides).validate()
    flat = dataclasses.replace(cfg, scan_blocks=False, remat=False)
    _, abstract = nnx.split(nnx.eval_shape(lambda: MMDiT(flat, rngs=nnx.Rngs(0))))
    targets = {tuple(path): tuple(var.get_value().shape)
               for path, var in nnx.to_flat_state(abstract)}
    arrays = layout.apply_rules(tensors, family.rules(cfg), targets, checked=family.CHECKED,
                                source=source)
    family.check(tensors, cfg, source)
    return cfg, arrays


def config_from_diffusers(checkpoint_dir, **overrides) -> MMDiTConfig:
    """Our config of a diffusers transformer folder without converting its weights (the
    tensors are only memory-mapped, for the families whose options the stored shapes decide);
    ``overrides`` replace fields as in :func:`from_diffusers`."""
    config, tensors = read_component(checkpoint_dir)
    family = FAMILIES.get(config.get("_class_name"))
    if family is None:
        raise CheckpointError(f"{checkpoint_dir}: _class_name={config.get('_class_name')!r} is "
                              f"not a transformer we convert (supported: {sorted(FAMILIES)})")
    return dataclasses.replace(family.model_config(config, tensors, str(checkpoint_dir)),
                               **overrides).validate()


def _stack_blocks(arrays: dict, depth: int) -> dict:
    """Per-block paths ``("blocks", i, ...)`` -> stacked ``("blocks", ...)`` (scan_blocks)."""
    out = {p: a for p, a in arrays.items() if p[0] != "blocks"}
    suffixes = sorted({p[2:] for p in arrays if p[0] == "blocks"}, key=str)
    for s in suffixes:
        out[("blocks",) + s] = np.stack([arrays[("blocks", i) + s] for i in range(depth)])
    return out


def from_diffusers(checkpoint_dir, dtype=jnp.float32, **overrides) -> tuple[MMDiT, MMDiTConfig]:
    """``(model, config)`` of a diffusers transformer component folder (``.../transformer``:
    ``config.json`` and one or sharded safetensors, fp32/bf16/fp16).

    ``dtype`` is the parameter and compute dtype. The model takes unpacked latents ``x``
    ``[B, H, W, C]``, ``t`` = sigma in [0, 1], text embeddings ``[B, L, D]``, an optional bool
    text mask and, for SD3, the pooled embedding; it returns the velocity ``noise - x0``, the
    sign diffusers' flow-matching models use. ``overrides`` set other config fields, e.g.
    ``scan_blocks=True, remat=True`` for training a large model.
    """
    config, tensors = read_component(checkpoint_dir)
    dtype_name = np.dtype(dtype).name
    cfg, arrays = convert_tensors(config, tensors, source=str(checkpoint_dir),
                                  dtype=dtype_name, param_dtype=dtype_name, **overrides)
    if cfg.scan_blocks:
        arrays = _stack_blocks(arrays, cfg.depth)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MMDiT(cfg, rngs=nnx.Rngs(0))))
    pure = nnx.to_pure_dict(state)
    for path, a in arrays.items():
        node = pure
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = jnp.asarray(np.asarray(a), dtype=dtype)
    leftover = [p for p, v in jax.tree_util.tree_leaves_with_path(pure)
                if isinstance(v, jax.ShapeDtypeStruct)]
    if leftover:
        raise ValueError(f"parameters left unconverted: {leftover[:3]}")
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state), cfg
