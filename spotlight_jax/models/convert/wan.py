"""diffusers' ``WanTransformer3DModel`` tensors -> ``models.wan_transformer.WanTransformer``
parameters.

``wan_config(config_json)`` reads a transformer folder's ``config.json`` into a ``WanConfig``;
``wan_params(tensors, cfg)`` maps its state dict (name -> array) onto the model's pure-dict
state: torch ``Linear`` weights ``[out, in]`` become kernels ``[in, out]``, the Conv3d patch
embedding ``[dim, C, pt, ph, pw]`` the patch matmul's ``[pt * ph * pw * C, dim]`` (the order
``WanTransformer`` flattens a patch in). A tensor missing or of another shape is a one-line
``CheckpointError`` naming it.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.models.convert import placement
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.wan_transformer import WanConfig, WanTransformer

CLASS_NAME = "WanTransformer3DModel"
_FIELDS = {f.name for f in dataclasses.fields(WanConfig)}


def wan_config(config: dict, **overrides) -> WanConfig:
    """The ``WanConfig`` of a diffusers ``config.json`` (T2V: no image embedder)."""
    if config.get("_class_name") != CLASS_NAME:
        raise CheckpointError(f"_class_name={config.get('_class_name')!r}: not a Wan transformer "
                              f"({CLASS_NAME})")
    if config.get("image_dim") or config.get("added_kv_proj_dim"):
        raise CheckpointError("an image-to-video Wan transformer (image_dim / added_kv_proj_dim "
                              "set): only text-to-video is converted")
    values = {k: v for k, v in config.items() if k in _FIELDS}
    values["patch_size"] = tuple(values.get("patch_size", (1, 2, 2)))
    return WanConfig(**{**values, **overrides}).validate()


def _linear(tensors, name):
    return {"kernel": np.asarray(tensors[f"{name}.weight"]).T,
            "bias": np.asarray(tensors[f"{name}.bias"])}


def wan_params(tensors: dict, cfg: WanConfig) -> dict:
    """The model's pure-dict parameters from diffusers' tensors (numpy arrays)."""
    try:
        w = np.asarray(tensors["patch_embedding.weight"])          # [dim, C, pt, ph, pw]
        out = {
            "patch_embed": {"kernel": w.transpose(2, 3, 4, 1, 0).reshape(-1, w.shape[0]),
                            "bias": np.asarray(tensors["patch_embedding.bias"])},
            "time_1": _linear(tensors, "condition_embedder.time_embedder.linear_1"),
            "time_2": _linear(tensors, "condition_embedder.time_embedder.linear_2"),
            "time_proj": _linear(tensors, "condition_embedder.time_proj"),
            "text_1": _linear(tensors, "condition_embedder.text_embedder.linear_1"),
            "text_2": _linear(tensors, "condition_embedder.text_embedder.linear_2"),
            "proj_out": _linear(tensors, "proj_out"),
            "scale_shift_table": np.asarray(tensors["scale_shift_table"]),
            "blocks": {},
        }
        for i in range(cfg.num_layers):
            p = f"blocks.{i}."
            block = {"scale_shift_table": np.asarray(tensors[p + "scale_shift_table"]),
                     "ffn_in": _linear(tensors, p + "ffn.net.0.proj"),
                     "ffn_out": _linear(tensors, p + "ffn.net.2")}
            for a in ("attn1", "attn2"):
                block[a] = {n: _linear(tensors, f"{p}{a}.{src}") for n, src in
                            (("to_q", "to_q"), ("to_k", "to_k"), ("to_v", "to_v"),
                             ("to_out", "to_out.0"))}
                block[a]["norm_q"] = {"scale": np.asarray(tensors[f"{p}{a}.norm_q.weight"])}
                block[a]["norm_k"] = {"scale": np.asarray(tensors[f"{p}{a}.norm_k.weight"])}
            if cfg.cross_attn_norm:
                block["norm2"] = {"weight": np.asarray(tensors[p + "norm2.weight"]),
                                  "bias": np.asarray(tensors[p + "norm2.bias"])}
            out["blocks"][i] = block
    except KeyError as e:
        raise CheckpointError(f"Wan transformer: tensor {e.args[0]!r} is missing") from None
    return out


def wan_model(config: dict, tensors: dict, dtype="float32", shardings=None, **overrides):
    """``(WanTransformer, WanConfig)`` from a folder's config and tensors, every parameter cast
    to ``dtype`` (the parameter and compute dtype) and placed, one at a time, on
    ``shardings(path, shape)`` (our parameter path, its shape; default: the default device)."""
    name = np.dtype(dtype).name
    cfg = wan_config(config, dtype=name, param_dtype=name, **overrides)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: WanTransformer(cfg, rngs=nnx.Rngs(0))))
    shapes = nnx.to_pure_dict(state)
    params = wan_params(tensors, cfg)

    place = shardings or (lambda path, shape: None)

    def cast(path, want, got):
        keys = tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)
        return jax.device_put(_checked(path, want, got).astype(name),
                              place(keys, tuple(want.shape)))

    if cfg.scan_blocks:     # stacked blocks: each filled one block's tensor at a time
        per_block = params.pop("blocks")
        stacked = shapes.pop("blocks")

        def stack(path, want):
            keys = ("blocks",) + tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)
            one = jax.ShapeDtypeStruct(tuple(want.shape[1:]), want.dtype)

            def part(i):
                got = per_block[i]
                for k in keys[1:]:
                    got = got[k]
                return _checked(("blocks", i, *keys[1:]), one, got).astype(name)

            return placement.assemble([lambda i=i: part(i) for i in range(cfg.num_layers)],
                                      tuple(want.shape), jnp.dtype(name),
                                      place(keys, tuple(want.shape)))

        blocks = jax.tree_util.tree_map_with_path(stack, stacked)
    pure = jax.tree_util.tree_map_with_path(cast, shapes, params)
    if cfg.scan_blocks:
        pure["blocks"] = blocks
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state), cfg


def _checked(path, want, got) -> np.ndarray:
    """``got`` as a numpy array, or a one-line CheckpointError when its shape is not ``want``'s
    (``path``: the parameter's key path, named in the error)."""
    if tuple(got.shape) != tuple(want.shape):
        where = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        raise CheckpointError(f"Wan transformer: {where} has shape {tuple(got.shape)}, the "
                              f"config gives {tuple(want.shape)}")
    return np.asarray(got)
