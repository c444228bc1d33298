"""LoRA on the attention projections of every transformer block: the fused ``qkv`` and ``out`` of
each MMDiT and FLUX.2 block (dual-stream, and the single-stream ones, whose ``out`` projects
[attention; MLP]); ``to_q/to_k/to_v/to_out`` of the Wan transformer's self- and cross-attention
and of Z-Image's main ``layers`` and image ``noise_refiner`` (not its ``context_refiner``:
see ``Z_IMAGE_STACKS``).

Functional: the adapters are a separate pytree ``{path: {"a": [in, r], "b": [r, out]}}``.
Two ways to apply them, equal up to rounding:
- ``merge(base, lora, scale)``: the base state with ``W + scale * a @ b`` on the adapted kernels,
  for sampling (one merge per set of weights, then forwards at the base's cost);
- ``adapted_model(graphdef, base, lora, scale)``: the base model with each adapted layer computing
  ``x @ W + scale * (x @ a) @ b``, for the train step: the gradient reaches the factors through
  rank-sized products, and the frozen kernels' weight gradients (as large as a full fine-tuning
  step's for those layers) are never formed.
The reference policy is the base (LoRA off) for free, and the optimizer only sees the adapters.
``b`` starts at zero, so the initial policy equals the base model exactly.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from spotlight_jax.models.layers import LoRAKernel

# the MMDiT's and FLUX.2's fused qkv and out projections; the Wan transformer's
# to_q/to_k/to_v/to_out (of its self- and cross-attention)
TARGETS = ("qkv", "out", "to_q", "to_k", "to_v", "to_out")
# Z-Image's block stacks whose attention (to_q/to_k/to_v/to_out) is adapted: the joint main
# blocks and the image tokens' refiner. Not the caption's ``context_refiner``: it runs in the
# model's ``encode``, which the LoRA train step computes once, with the policy, and shares
# with the old policy and the reference (``rl.nft``: LoRA leaves the prompt encoding alone),
# so an adapter there would hand those two the policy's encoding instead of their own.
Z_IMAGE_STACKS = ("layers", "noise_refiner")
Z_IMAGE_TARGETS = ("to_q", "to_k", "to_v", "to_out")


def is_target(path) -> bool:
    """Whether a parameter path is a LoRA target (a block's attention projection kernel): a
    ``TARGETS`` kernel anywhere under ``blocks`` / ``single_blocks`` (MMDiT, FLUX.2, Wan), or a
    Z-Image projection right under a block of ``Z_IMAGE_STACKS`` (``layers[i].to_q`` looped,
    ``layers.to_q`` stacked; never the MMDiT prompt encoder's ``layers[i].qkv``)."""
    keys = [str(getattr(p, "key", p)) for p in path]
    if len(keys) < 3 or keys[-1] != "kernel":
        return False
    if keys[-2] in TARGETS and ("blocks" in keys or "single_blocks" in keys):
        return True
    stack = keys[-4] if len(keys) >= 4 and keys[-3].isdigit() else keys[-3]
    return keys[-2] in Z_IMAGE_TARGETS and stack in Z_IMAGE_STACKS


def init_lora(base_state, rank: int, key):
    pure = nnx.to_pure_dict(base_state)
    out = {}
    for i, (path, w) in enumerate(jax.tree_util.tree_leaves_with_path(pure)):
        if is_target(path):
            din, dout = w.shape[-2], w.shape[-1]
            lead = w.shape[:-2]
            a = jax.random.normal(jax.random.fold_in(key, i), lead + (din, rank), jnp.float32)
            out[jax.tree_util.keystr(path)] = {"a": a / jnp.sqrt(din),
                                               "b": jnp.zeros(lead + (rank, dout), jnp.float32)}
    if not out:
        raise ValueError("LoRA found no attention projections (qkv/out or to_q/to_k/to_v/to_out "
                         "kernels) to adapt")
    return out


def merge(base_state, lora, scale: float):
    """``base_state`` with ``scale * a @ b`` added to each adapted kernel, as one compiled
    program (merged eagerly, every leaf would be its own dispatch and take ``scale`` from the
    host)."""
    merged = _merged_weights(nnx.to_pure_dict(base_state), lora, float(scale))
    state = jax.tree.map(lambda x: x, base_state)
    nnx.replace_by_pure_dict(state, merged)
    return state


@functools.partial(jax.jit, static_argnums=2)
def _merged_weights(pure: dict, lora: dict, scale: float) -> dict:
    def add(path, w):
        ad = lora.get(jax.tree_util.keystr(path))
        if ad is None:
            return w
        return w + (scale * jnp.einsum("...ir,...ro->...io", ad["a"], ad["b"])).astype(w.dtype)

    return jax.tree_util.tree_map_with_path(add, pure)


def adapted_model(graphdef, base_state, lora, scale: float):
    """The NNX model of ``base_state`` with ``lora`` applied factored: each adapted kernel's
    slot holds a ``LoRAKernel`` (the frozen kernel and its factors); the model to differentiate
    with respect to ``lora``."""
    pure = nnx.to_pure_dict(base_state)
    kernels = {jax.tree_util.keystr(path) for path, _ in
               jax.tree_util.tree_leaves_with_path(pure) if is_target(path)}
    for key in lora:
        if key not in kernels:
            raise ValueError(f"LoRA adapter {key} names no adapted kernel of this model "
                             "(adapters of another model?)")

    def adapt(path, w):
        ad = lora.get(jax.tree_util.keystr(path))
        return w if ad is None else LoRAKernel(w, ad["a"], ad["b"], float(scale))

    state = jax.tree.map(lambda x: x, base_state)
    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(adapt, pure))
    return nnx.merge(graphdef, state)
