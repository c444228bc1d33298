"""The pieces both VAE families are built from, channels-last (NHWC) throughout.

Each layer names its parameters after the diffusers module it mirrors (``kernel``/``bias`` of a
conv or linear, ``scale``/``bias`` of a GroupNorm, ``gamma`` of Qwen-Image's RMS norm), so the
converter (``models.convert.vae``) maps a parameter's path to its diffusers key by rule rather
than by a hand-written table. Parameters are ``nnx.Param`` with logical axes all ``None``
(replicated on any mesh): a VAE is small and frozen, so nothing is gained by sharding it.
Parameters are stored in ``param_dtype``; convolutions and matmuls run in ``dtype``;
normalisation statistics and the softmax are computed in float32 (or wider: float64 inputs stay
float64, so a float64 run checks a port's structure free of rounding).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from spotlight_jax.models.layers import param


def vae_param(rngs: nnx.Rngs | None, init, shape, dtype) -> nnx.Param:
    """A replicated parameter: randomly initialised from ``rngs``, or, with ``rngs=None`` (how
    the converter builds a VAE it is about to fill from a checkpoint), a shape-only placeholder
    (``jax.ShapeDtypeStruct``), which skips tracing an initialiser per parameter."""
    axes = (None,) * len(shape)
    if rngs is None:
        return nnx.Param(jax.ShapeDtypeStruct(tuple(shape), dtype), logical_axes=axes)
    return param(rngs, init, shape, dtype, axes)


class Conv2d(nnx.Module):
    """A 2-D convolution on NHWC input with an HWIO ``kernel``; ``padding`` is
    ``((top, bottom), (left, right))`` so the downsamplers' asymmetric (0, 1) padding is one
    call, not a separate pad."""

    def __init__(self, cin: int, cout: int, kernel_size: int, *, rngs: nnx.Rngs | None,
                 stride: int = 1, padding=None, dtype=jnp.float32, param_dtype=jnp.float32):
        k = kernel_size
        self.kernel = vae_param(rngs, nnx.initializers.lecun_normal(), (k, k, cin, cout),
                                param_dtype)
        self.bias = vae_param(rngs, nnx.initializers.zeros, (cout,), param_dtype)
        if padding is None:
            padding = ((k // 2, k // 2), (k // 2, k // 2))
        self.padding = tuple(tuple(int(p) for p in pair) for pair in padding)
        self.stride = int(stride)
        self.dtype = dtype

    def __call__(self, x):
        y = jax.lax.conv_general_dilated(
            x.astype(self.dtype), self.kernel[...].astype(self.dtype),
            window_strides=(self.stride, self.stride), padding=self.padding,
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + self.bias[...].astype(self.dtype)


class Linear(nnx.Module):
    """``y = x @ kernel + bias`` with ``kernel`` ``[in, out]`` (torch's Linear transposed)."""

    def __init__(self, din: int, dout: int, *, rngs: nnx.Rngs | None, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        self.kernel = vae_param(rngs, nnx.initializers.lecun_normal(), (din, dout), param_dtype)
        self.bias = vae_param(rngs, nnx.initializers.zeros, (dout,), param_dtype)
        self.dtype = dtype

    def __call__(self, x):
        y = jnp.einsum("...i,io->...o", x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        return y + self.bias[...].astype(self.dtype)


class GroupNorm(nnx.Module):
    """torch's ``GroupNorm`` on NHWC: statistics over (H, W, channels of the group), biased
    variance, then a per-channel affine."""

    def __init__(self, channels: int, groups: int, *, rngs: nnx.Rngs | None, eps: float = 1e-6,
                 param_dtype=jnp.float32):
        if channels % groups:
            raise ValueError(f"norm_num_groups={groups}: must divide every block's channel "
                             f"count, not {channels} (e.g. 32 for block_out_channels of 128..512)")
        self.scale = vae_param(rngs, nnx.initializers.ones, (channels,), param_dtype)
        self.bias = vae_param(rngs, nnx.initializers.zeros, (channels,), param_dtype)
        self.groups = groups
        self.eps = eps

    def __call__(self, x):
        b, h, w, c = x.shape
        f = stats_dtype(x)
        g = x.astype(f).reshape(b, h, w, self.groups, c // self.groups)
        mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
        var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 4), keepdims=True)
        y = ((g - mean) * jax.lax.rsqrt(var + self.eps)).reshape(b, h, w, c)
        y = y * self.scale[...].astype(f) + self.bias[...].astype(f)
        return y.astype(x.dtype)


def stats_dtype(x):
    """Normalisation statistics' dtype: float32, or the input's when wider (float64)."""
    return jnp.promote_types(x.dtype, jnp.float32)


class ChannelRMSNorm(nnx.Module):
    """Qwen-Image's (Wan's) RMS norm: ``x / max(||x||_2, 1e-12) * sqrt(C) * gamma`` over the
    channel axis (an L2 normalisation, not a mean of squares plus eps), without a bias."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, param_dtype=jnp.float32):
        self.gamma = vae_param(rngs, nnx.initializers.ones, (channels,), param_dtype)
        self.scale = math.sqrt(channels)

    def __call__(self, x):
        f = stats_dtype(x)
        xf = x.astype(f)
        norm = jnp.sqrt(jnp.sum(jnp.square(xf), axis=-1, keepdims=True))
        y = xf / jnp.maximum(norm, 1e-12) * self.scale * self.gamma[...].astype(f)
        return y.astype(x.dtype)


def single_head_attention(q, k, v):
    """Softmax attention of one head over all pixels: q, k, v ``[B, N, C]`` -> ``[B, N, C]``,
    scale ``1/sqrt(C)`` (both families' mid-block attention has one head as wide as the
    block). Through ``jax.nn.dot_product_attention`` so an accelerator may use its fused
    kernel; the logits are float32 for float32 inputs. Float64 inputs (a port's structure
    checked free of rounding) take the plain softmax, which keeps float64 throughout."""
    if q.dtype == jnp.float64:
        logits = jnp.einsum("bqc,bkc->bqk", q, k) / math.sqrt(q.shape[-1])
        return jnp.einsum("bqk,bkc->bqc", jax.nn.softmax(logits, axis=-1), v)
    return jax.nn.dot_product_attention(q[:, :, None, :], k[:, :, None, :],
                                        v[:, :, None, :])[:, :, 0, :]


def upsample_nearest_2x(x):
    """Nearest-neighbour 2x upsampling of NHWC (torch's ``nearest`` and ``nearest-exact`` agree
    at an integer factor of 2: output pixel i reads input pixel i // 2)."""
    return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)


DOWNSAMPLE_PADDING = ((0, 1), (0, 1))
"""Both families downsample with a 3x3 stride-2 conv after zero-padding only the bottom and
right by one pixel (diffusers' ``F.pad(x, (0, 1, 0, 1))``)."""
