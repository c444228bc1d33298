"""diffusers' ``ZImageTransformer2DModel`` tensors -> ``models.z_image_transformer``'s
``ZImageTransformer``.

``z_image_config(config_json)`` reads a transformer folder's ``config.json`` into a
``ZImageConfig``; ``rules(cfg)`` lists where each of our parameters comes from (``layout.Rule``:
torch ``Linear`` weights ``[out, in]`` become kernels ``[in, out]``, everything else is copied:
the patch embedding already flattens a patch ``(row, col, channel)`` as ours does); and
``z_image_model(config, tensors, ...)`` builds the model straight from them, each parameter
converted and placed on its sharding in turn. A missing, unexpected or mis-shaped tensor is a
one-line ``CheckpointError`` naming it; the omni variant (SigLIP conditioning) and multi-patch
checkpoints are refused by name.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from spotlight_jax.models.convert import layout, placement
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.z_image_transformer import ZImageConfig, ZImageTransformer

CLASS_NAME = "ZImageTransformer2DModel"
_FIELDS = {f.name for f in dataclasses.fields(ZImageConfig)}
# (our block parameter, diffusers' name inside the block) of the bias-free linears and norms
_LINEARS = (("to_q", "attention.to_q"), ("to_k", "attention.to_k"), ("to_v", "attention.to_v"),
            ("to_out", "attention.to_out.0"), ("w1", "feed_forward.w1"),
            ("w2", "feed_forward.w2"), ("w3", "feed_forward.w3"))
_NORMS = ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2")


def z_image_config(config: dict, **overrides) -> ZImageConfig:
    """The ``ZImageConfig`` of a diffusers ``config.json`` (text-to-image, one patch size)."""
    if config.get("_class_name") != CLASS_NAME:
        raise CheckpointError(f"_class_name={config.get('_class_name')!r}: not a Z-Image "
                              f"transformer ({CLASS_NAME})")
    if config.get("siglip_feat_dim") is not None:
        raise CheckpointError(f"siglip_feat_dim={config['siglip_feat_dim']!r}: the omni Z-Image "
                              "variant (SigLIP image conditioning) is not converted; convert a "
                              "text-to-image Z-Image transformer")
    for key in ("all_patch_size", "all_f_patch_size"):
        if len(config.get(key, (1,))) != 1:
            raise CheckpointError(f"{key}={config[key]!r}: a checkpoint of several patch sizes "
                                  "is not converted (Z-Image has one: [2] and [1])")
    values = {k: v for k, v in config.items() if k in _FIELDS}
    return ZImageConfig(**{**values, **overrides}).validate()


def rules(cfg: ZImageConfig) -> list[layout.Rule]:
    """Our parameter paths (looped blocks) and the diffusers tensors they come from."""
    key = f"{cfg.patch_size}-{cfg.all_f_patch_size[0]}"
    out = [
        *layout.dense(("x_embed",), f"all_x_embedder.{key}"),
        layout.Rule(("x_pad_token",), ("x_pad_token",)),
        layout.Rule(("cap_norm", "scale"), ("cap_embedder.0.weight",)),
        *layout.dense(("cap_proj",), "cap_embedder.1"),
        layout.Rule(("cap_pad_token",), ("cap_pad_token",)),
        *layout.dense(("t_fc1",), "t_embedder.mlp.0"),
        *layout.dense(("t_fc2",), "t_embedder.mlp.2"),
        *layout.dense(("final_mod",), f"all_final_layer.{key}.adaLN_modulation.1"),
        *layout.dense(("final",), f"all_final_layer.{key}.linear"),
    ]
    for group, n, modulated in _groups(cfg):
        for i in range(n):
            ours, src = (group, i), f"{group}.{i}."
            out += [layout.Rule(ours + (name, "kernel"), (f"{src}{s}.weight",), layout.Linear())
                    for name, s in _LINEARS]
            out += [layout.Rule(ours + (name, "scale"), (f"{src}{name}.weight",))
                    for name in _NORMS]
            if cfg.qk_norm:
                out += [layout.Rule(ours + (name, "scale"), (f"{src}attention.{name}.weight",))
                        for name in ("norm_q", "norm_k")]
            if modulated:
                out += layout.dense(ours + ("mod",), f"{src}adaLN_modulation.0")
    return out


def _groups(cfg: ZImageConfig):
    """``(group, blocks, modulated)`` of the model's three block stacks."""
    return (("noise_refiner", cfg.n_refiner_layers, True),
            ("context_refiner", cfg.n_refiner_layers, False),
            ("layers", cfg.n_layers, True))


def z_image_model(config: dict, tensors: dict, dtype="float32", shardings=None, *,
                  source: str = "Z-Image transformer", **overrides):
    """``(ZImageTransformer, ZImageConfig)`` from a folder's config and tensors, every
    parameter cast to ``dtype`` (the parameter and compute dtype) and placed, one at a time
    (stacked blocks: one block's tensor at a time), on ``shardings(path, shape)`` (our
    parameter path, its shape; default: the default device). ``overrides`` set other config
    fields (``scan_blocks=True, remat=True`` to train a large model); ``source`` names the
    checkpoint in errors."""
    name = np.dtype(dtype).name
    cfg = z_image_config(config, dtype=name, param_dtype=name, **overrides)
    flat = dataclasses.replace(cfg, scan_blocks=False, remat=False)
    _, abstract = nnx.split(nnx.eval_shape(lambda: ZImageTransformer(flat, rngs=nnx.Rngs(0))))
    targets = {tuple(path): tuple(var.get_value().shape)
               for path, var in nnx.to_flat_state(abstract)}
    thunks = layout.apply_rules(tensors, rules(cfg), targets, source=source, lazy=True)

    graphdef, state = nnx.split(nnx.eval_shape(lambda: ZImageTransformer(cfg, rngs=nnx.Rngs(0))))
    stacks = {g: n for g, n, _ in _groups(cfg)} if cfg.scan_blocks else {}
    placement.fill(state, placement.stack_parts(thunks, stacks), name, shardings, "Z-Image")
    return nnx.merge(graphdef, state), cfg
