"""Qwen-Image's ``AutoencoderKLQwenImage`` (a Wan-2.1-style causal 3-D VAE) in Flax NNX, for a
single frame (T = 1), NHWC.

For one frame the video machinery collapses to 2-D: a causal 3-D conv pads time with
``2 * pad`` zeros in front, so on the first frame only its last temporal tap sees data, and the
converter keeps that tap as a 2-D kernel; the ``Resample`` blocks' temporal convs
(``time_conv``) are skipped on the first frame (diffusers' feature cache marks it and moves on),
so their weights are not loaded. Images are in [-1, 1] space and latents are raw (before
``latents_mean``/``latents_std``; that normalisation lives in ``models.vae.latent_vae``).
The decoder's output is clamped to [-1, 1] as diffusers' ``decode`` does.

Per block: ``ResidualBlock`` = RMS norm -> SiLU -> 3x3 conv -> RMS norm -> SiLU -> 3x3 conv, plus
the input (1x1 conv when channels change, applied before any norm); ``AttentionBlock`` = RMS norm,
a 1x1 conv to q|k|v, one head over all pixels, 1x1 projection, residual; ``Resample`` = nearest
2x + 3x3 conv halving the channels (up) or bottom/right zero pad + 3x3 stride-2 conv (down).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from spotlight_jax.models.vae.ops import (
    DOWNSAMPLE_PADDING,
    ChannelRMSNorm,
    Conv2d,
    single_head_attention,
    upsample_nearest_2x,
)


@dataclasses.dataclass(frozen=True)
class QwenImageVAEConfig:
    """The architecture fields of a diffusers ``AutoencoderKLQwenImage`` config."""
    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    input_channels: int = 3

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)


class ResidualBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm1 = ChannelRMSNorm(cin, rngs=rngs, param_dtype=param_dtype)
        self.conv1 = Conv2d(cin, cout, 3, **kw)
        self.norm2 = ChannelRMSNorm(cout, rngs=rngs, param_dtype=param_dtype)
        self.conv2 = Conv2d(cout, cout, 3, **kw)
        self.conv_shortcut = Conv2d(cin, cout, 1, **kw) if cin != cout else None

    def __call__(self, x):
        skip = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        return h + skip


class AttentionBlock(nnx.Module):
    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm = ChannelRMSNorm(channels, rngs=rngs, param_dtype=param_dtype)
        self.to_qkv = Conv2d(channels, 3 * channels, 1, **kw)
        self.proj = Conv2d(channels, channels, 1, **kw)

    def __call__(self, x):
        b, h, w, c = x.shape
        qkv = self.to_qkv(self.norm(x)).reshape(b, h * w, 3 * c)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        o = single_head_attention(q, k, v).reshape(b, h, w, c)
        return x + self.proj(o).astype(x.dtype)


class Resample(nnx.Module):
    """``mode`` in ``upsample2d|upsample3d|downsample2d|downsample3d``; the 3d modes differ
    from the 2d ones only by a temporal conv that a single frame never runs."""

    def __init__(self, channels: int, mode: str, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.up = mode.startswith("upsample")
        if self.up:
            self.resample = Conv2d(channels, channels // 2, 3, **kw)
        else:
            self.resample = Conv2d(channels, channels, 3, stride=2, padding=DOWNSAMPLE_PADDING,
                                   **kw)

    def __call__(self, x):
        return self.resample(upsample_nearest_2x(x) if self.up else x)


class MidBlock(nnx.Module):
    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResidualBlock(channels, channels, **kw) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(channels, **kw)])

    def __call__(self, x):
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class UpBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, num_res_blocks: int, mode: str | None, *,
                 rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResidualBlock(cin if i == 0 else cout, cout, **kw)
                                 for i in range(num_res_blocks + 1)])
        self.upsamplers = nnx.List([Resample(cout, mode, **kw)] if mode else [])

    def __call__(self, x):
        for r in self.resnets:
            x = r(x)
        for u in self.upsamplers:
            x = u(x)
        return x


class Encoder(nnx.Module):
    """Images ``[B, H, W, 3]`` -> (mean, logvar) ``[B, h, w, 2 * z_dim]`` (before quant_conv).
    ``down_blocks`` is one flat list of residual blocks and resamplers, as in diffusers."""

    def __init__(self, cfg: QwenImageVAEConfig, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        self.conv_in = Conv2d(cfg.input_channels, dims[0], 3, **kw)
        layers = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            for _ in range(cfg.num_res_blocks):
                layers.append(ResidualBlock(cin, cout, **kw))
                cin = cout
            if i != len(cfg.dim_mult) - 1:
                mode = "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"
                layers.append(Resample(cout, mode, **kw))
        self.down_blocks = nnx.List(layers)
        self.mid_block = MidBlock(dims[-1], **kw)
        self.norm_out = ChannelRMSNorm(dims[-1], rngs=rngs, param_dtype=param_dtype)
        self.conv_out = Conv2d(dims[-1], 2 * cfg.z_dim, 3, **kw)

    def __call__(self, x):
        x = self.conv_in(x)
        for layer in self.down_blocks:
            x = layer(x)
        x = self.mid_block(x)
        return self.conv_out(jax.nn.silu(self.norm_out(x)))


class Decoder(nnx.Module):
    """Raw latents ``[B, h, w, z_dim]`` (after post_quant_conv) -> images ``[B, H, W, 3]``."""

    def __init__(self, cfg: QwenImageVAEConfig, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        mult = cfg.dim_mult
        dims = [cfg.base_dim * m for m in (mult[-1], *mult[::-1])]
        temperal_upsample = cfg.temperal_downsample[::-1]
        self.conv_in = Conv2d(cfg.z_dim, dims[0], 3, **kw)
        self.mid_block = MidBlock(dims[0], **kw)
        blocks = []
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            cin = cin // 2 if i > 0 else cin  # the previous block's upsampler halved it
            mode = None
            if i != len(mult) - 1:
                mode = "upsample3d" if temperal_upsample[i] else "upsample2d"
            blocks.append(UpBlock(cin, cout, cfg.num_res_blocks, mode, **kw))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = ChannelRMSNorm(dims[-1], rngs=rngs, param_dtype=param_dtype)
        self.conv_out = Conv2d(dims[-1], cfg.input_channels, 3, **kw)

    def __call__(self, z):
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(jax.nn.silu(self.norm_out(x)))


class QwenImageVAE(nnx.Module):
    """``encode`` gives the posterior mean (raw latents) of one frame, ``decode`` the frame in
    [-1, 1] (clamped, as diffusers' ``decode``). ``rngs=None`` builds shape-only parameters for a
    converter to fill (``models.convert.vae``); ``rngs`` a random init."""

    def __init__(self, cfg: QwenImageVAEConfig, *, rngs: nnx.Rngs | None, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        if len(cfg.temperal_downsample) != len(cfg.dim_mult) - 1:
            raise ValueError(f"temperal_downsample={list(cfg.temperal_downsample)}: needs one "
                             f"entry per downsampling, len(dim_mult) - 1 = "
                             f"{len(cfg.dim_mult) - 1} (e.g. [False, True, True] for 4 levels)")
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        z = cfg.z_dim
        self.config = cfg
        self.encoder = Encoder(cfg, **kw)
        self.quant_conv = Conv2d(2 * z, 2 * z, 1, **kw)
        self.post_quant_conv = Conv2d(z, z, 1, **kw)
        self.decoder = Decoder(cfg, **kw)

    def encode(self, images):
        return self.quant_conv(self.encoder(images))[..., :self.config.z_dim]

    def decode(self, z):
        return jnp.clip(self.decoder(self.post_quant_conv(z)), -1.0, 1.0)
