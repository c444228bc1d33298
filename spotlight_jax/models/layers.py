"""Small NNX building blocks whose parameters carry logical axis names.

Every parameter is an ``nnx.Param`` with a ``logical_axes`` metadata tuple; the one rule table in
``spotlight_jax.parallel.sharding`` maps those names to mesh axes. Parameters are stored in
``param_dtype`` and cast to the compute ``dtype`` at use (mixed precision).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
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
        x = x.astype(self.dtype)
        w = self.kernel.get_value()
        if isinstance(w, LoRAKernel):
            y = w.apply(x, self.dtype)
        else:
            y = jnp.einsum("...i,io->...o", x, w.astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoRAKernel:
    """A frozen kernel with a low-rank update, in a ``Dense``'s kernel slot: the layer computes
    ``x @ w + scale * (x @ a) @ b`` (LoRA applied factored), so a gradient reaches ``a`` and
    ``b`` through rank-sized products and the kernel's own weight gradient (an input-by-output
    matrix per step) is never formed. Placed in a state before ``nnx.merge`` (never by
    mutating a built model, which ``nnx.remat`` refuses); stacked blocks carry stacked
    ``w``, ``a`` and ``b``, which their scan slices together."""
    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: float = dataclasses.field(metadata={"static": True})

    def apply(self, x, dtype):
        y = jnp.einsum("...i,io->...o", x, self.w.astype(dtype))
        xa = jnp.einsum("...i,ir->...r", x, self.a.astype(dtype))
        return y + self.scale * jnp.einsum("...r,ro->...o", xa, self.b.astype(dtype))


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
    """adaLN: ``x * (1 + scale) + shift`` with one (shift, scale) per row ``[B, D]`` or per
    token ``[B, N, D]`` (a token-wise modulation, as Qwen-Image-Edit-2511's reference tokens
    have)."""
    if shift.ndim == x.ndim - 1:
        shift, scale = shift[:, None, :], scale[:, None, :]
    return x * (1 + scale) + shift


def timestep_embedding(t, dim: int, max_period: float = 10_000.0, scale: float = 1000.0,
                       scale_after_freqs: bool = False, rounded_freqs: bool = False):
    """Sinusoidal embedding ``[cos, sin]`` of flow time ``t`` in [0, 1], scaled by 1000 as in
    DiT/SD3. ``scale_after_freqs`` multiplies the products ``t * freq`` by ``scale`` instead of
    ``t`` itself: Qwen-Image's order, which rounds differently in float32. ``rounded_freqs``
    takes the frequencies correctly rounded to float32 (computed in float64), as torch's exp
    gives them: ``jnp.exp`` is off by one ulp on some, which ``t * 1000`` magnifies to ~3e-5 in
    the embedding."""
    half = dim // 2
    if rounded_freqs:
        exponent = (-math.log(max_period) * np.arange(half, dtype=np.float32)) / np.float32(half)
        freqs = jnp.asarray(np.exp(exponent.astype(np.float64)).astype(np.float32))
    else:
        freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    if scale_after_freqs:
        args = (t.astype(jnp.float32)[:, None] * freqs[None]) * scale
    else:
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


def sd3_sincos_rows(rows, cols, dim: int, max_size: int, base_size: int,
                    interpolation_scale: float = 1.0) -> np.ndarray:
    """Rows ``rows x cols`` (grid indices) of SD3's stored 2-D sin-cos table, ``[len(rows) *
    len(cols), dim]`` float32, row-major: the first half of the features encodes the column
    (x), the second the row (y), each ``[sin, cos]`` over ``dim / 4`` frequencies, with grid
    coordinates ``i / (max_size / base_size) / interpolation_scale``. Recomputed (numpy, at
    trace time) instead of stored, so it is never a trainable parameter and only the crop in
    use is materialised."""
    def coord(i):
        i = np.asarray(i, np.float32)
        return i / np.float32(max_size / base_size) / np.float32(interpolation_scale)

    def embed_1d(pos, d):
        omega = np.arange(d // 2, dtype=np.float64) / (d / 2.0)
        omega = 1.0 / 10_000.0 ** omega
        out = pos.astype(np.float64)[:, None] * omega[None]
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    ys, xs = np.meshgrid(coord(rows), coord(cols), indexing="ij")
    half = dim // 2
    emb = np.concatenate([embed_1d(xs.reshape(-1), half), embed_1d(ys.reshape(-1), half)], 1)
    return emb.astype(np.float32)


def sd3_sincos_crop(grid_h: int, grid_w: int, dim: int, max_size: int, base_size: int,
                    interpolation_scale: float = 1.0) -> np.ndarray:
    """The centre crop ``[grid_h * grid_w, dim]`` of SD3's ``max_size x max_size`` table that
    diffusers' ``PatchEmbed`` adds to a ``grid_h x grid_w`` patch grid."""
    if grid_h > max_size or grid_w > max_size:
        raise ValueError(f"patch grid {grid_h}x{grid_w} exceeds pos_embed_max_size={max_size}: "
                         f"use latents of at most {max_size} patches per side")
    top, left = (max_size - grid_h) // 2, (max_size - grid_w) // 2
    return sd3_sincos_rows(np.arange(top, top + grid_h), np.arange(left, left + grid_w), dim,
                           max_size, base_size, interpolation_scale)


def rope_angles(positions: np.ndarray, axes, theta: float, dtype=np.float32) -> np.ndarray:
    """Rotary angles ``[S, sum(axes) / 2]`` for integer positions ``[S, len(axes)]``: axis
    ``a`` takes ``axes[a] / 2`` frequencies ``theta ** (-2j / axes[a])``, its angles
    ``position * frequency``, concatenated over the axes, computed in ``dtype`` (float32 as
    diffusers does for Qwen-Image, float64 for Flux)."""
    out = []
    for a, dim in enumerate(axes):
        inv = dtype(1.0) / np.power(dtype(theta), np.arange(0, dim, 2, dtype=dtype) / dtype(dim))
        out.append(positions[:, a].astype(dtype)[:, None] * inv[None].astype(dtype))
    return np.concatenate(out, axis=1).astype(dtype)


def apply_rope(x, cos, sin):
    """Rotates interleaved pairs ``(x[2i], x[2i+1])`` of ``x [B, S, H, D]`` by the angles whose
    ``cos``/``sin`` are ``[S, D/2]`` (complex multiply, as diffusers' ``use_real=False``)."""
    x32 = x.astype(jnp.float32)
    xr, xi = x32[..., 0::2], x32[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = jnp.stack([xr * c - xi * s, xr * s + xi * c], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)


def stacked_blocks(make, n: int, rngs: nnx.Rngs):
    """``n`` blocks ``make(rngs)`` with their parameters stacked on a leading axis (scanned)."""
    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=0, out_axes=0)
    def build(r):
        return make(r)

    return build(rngs)


def run_blocks(blocks, run, carry, scanned: bool):
    """``carry`` through every block of ``blocks`` (``run(block, *carry)`` for a tuple carry,
    ``run(block, carry)`` otherwise): a ``lax.scan`` over stacked blocks, else a loop."""
    call = (lambda b, c: run(b, *c)) if isinstance(carry, tuple) else run
    if scanned:
        graphdef, stacked = nnx.split(blocks)

        def body(c, block_state):
            return call(nnx.merge(graphdef, block_state), c), None

        return jax.lax.scan(body, carry, stacked)[0]
    for block in blocks:
        carry = call(block, carry)
    return carry
