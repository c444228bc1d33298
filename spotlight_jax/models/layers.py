"""Small NNX building blocks whose parameters carry logical axis names.

Every parameter is an ``nnx.Param`` with a ``logical_axes`` metadata tuple; the one rule table in
``spotlight_jax.parallel.sharding`` maps those names to mesh axes. Parameters are stored in
``param_dtype`` and cast to the compute ``dtype`` at use (mixed precision).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


def param(rngs: nnx.Rngs, init, shape, dtype, axes):
    return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=tuple(axes))


class Dense(nnx.Module):
    """``y = x @ W + b`` with named axes ``(in_axis, out_axis)``; ``zero=True`` zero-inits W."""

    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs, axes=("embed", "mlp"),
                 use_bias: bool = True, zero: bool = False, dtype=jnp.float32,
                 param_dtype=jnp.float32, scale: float = 1.0):
        init = (nnx.initializers.zeros if zero
                else nnx.initializers.variance_scaling(scale, "fan_in", "truncated_normal"))
        self.kernel = param(rngs, init, (din, dout), param_dtype, axes)
        self.bias = (param(rngs, nnx.initializers.zeros, (dout,), param_dtype, axes[1:])
                     if use_bias else None)
        self.dtype = dtype

    def __call__(self, x):
        y = jnp.einsum("...i,io->...o", x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class RMSNorm(nnx.Module):
    """RMS normalisation over the last axis (used as QK-norm per head)."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, axis_name: str = "qkv",
                 param_dtype=jnp.float32, eps: float = 1e-6):
        self.scale = param(rngs, nnx.initializers.ones, (dim,), param_dtype, (axis_name,))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def layer_norm(x, eps: float = 1e-6):
    """Parameter-free LayerNorm (adaLN supplies scale and shift), computed in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.var(x32, axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype)


def modulate(x, shift, scale):
    return x * (1 + scale[:, None, :]) + shift[:, None, :]


def timestep_embedding(t, dim: int, max_period: float = 10_000.0, scale: float = 1000.0):
    """Sinusoidal embedding of flow time ``t`` in [0, 1] (scaled by 1000 as in DiT/SD3)."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = (t.astype(jnp.float32) * scale)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def sincos_2d(grid_h: int, grid_w: int, dim: int):
    """Fixed 2-D sin/cos position table ``[grid_h*grid_w, dim]``, computed (never trained)."""
    assert dim % 4 == 0, f"position embedding width {dim} must be a multiple of 4"
    quarter = dim // 4
    omega = 1.0 / (10_000.0 ** (jnp.arange(quarter, dtype=jnp.float32) / quarter))
    ys, xs = jnp.meshgrid(jnp.arange(grid_h, dtype=jnp.float32),
                          jnp.arange(grid_w, dtype=jnp.float32), indexing="ij")
    out_y = ys.reshape(-1)[:, None] * omega[None]
    out_x = xs.reshape(-1)[:, None] * omega[None]
    return jnp.concatenate([jnp.sin(out_y), jnp.cos(out_y), jnp.sin(out_x), jnp.cos(out_x)], -1)


def sincos_1d(length: int, dim: int):
    pos = jnp.arange(length, dtype=jnp.float32)[:, None]
    half = dim // 2
    omega = 1.0 / (10_000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    return jnp.concatenate([jnp.sin(pos * omega), jnp.cos(pos * omega)], -1)
