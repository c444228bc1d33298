"""SD3's (and SD1/SDXL's) ``AutoencoderKL`` in Flax NNX, NHWC, for decode and encode; also the
network of FLUX.2's ``AutoencoderKLFlux2`` (the same blocks, with a decoder that may be narrower
than the encoder: ``decoder_block_out_channels``; its batch-norm latent statistics are a latent
normalisation, ``models.vae.flux2_vae``).

The layout mirrors diffusers' module tree (``encoder.down_blocks.0.resnets.0.conv1``, ...) so the
converter maps parameter paths to diffusers keys by rule. Images here are in diffusers' [-1, 1]
space and latents are raw (before SD3's scaling and shift): the DiT-facing normalisation lives in
``models.vae.latent_vae``. The math, per block:

- ``ResnetBlock``: GroupNorm -> SiLU -> 3x3 conv -> GroupNorm -> SiLU -> 3x3 conv, plus the input
  (through a 1x1 conv when the channel count changes).
- ``MidAttention``: GroupNorm, one head as wide as the block over all pixels, output projection,
  residual.
- downsampling: zero-pad bottom/right by one, 3x3 stride-2 conv; upsampling: nearest 2x, 3x3 conv.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from spotlight_jax.models.vae.ops import (
    DOWNSAMPLE_PADDING,
    Conv2d,
    GroupNorm,
    Linear,
    single_head_attention,
    upsample_nearest_2x,
)


@dataclasses.dataclass(frozen=True)
class AutoencoderKLConfig:
    """The architecture fields of a diffusers ``AutoencoderKL`` config (SD3: 16 latent channels,
    no quant convs) or ``AutoencoderKLFlux2`` config (32 latent channels, quant convs; its
    ``decoder_block_out_channels``, None: the encoder's)."""
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_block_out_channels: tuple[int, ...] | None = None
    layers_per_block: int = 2
    latent_channels: int = 16
    norm_num_groups: int = 32
    in_channels: int = 3
    out_channels: int = 3
    use_quant_conv: bool = False
    use_post_quant_conv: bool = False
    mid_block_add_attention: bool = True

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def decoder_channels(self) -> tuple[int, ...]:
        """The decoder's block widths, shallowest first (reversed inside the decoder)."""
        return self.decoder_block_out_channels or self.block_out_channels


class ResnetBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, groups: int, *, rngs: nnx.Rngs | None, dtype,
                 param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm1 = GroupNorm(cin, groups, rngs=rngs, param_dtype=param_dtype)
        self.conv1 = Conv2d(cin, cout, 3, **kw)
        self.norm2 = GroupNorm(cout, groups, rngs=rngs, param_dtype=param_dtype)
        self.conv2 = Conv2d(cout, cout, 3, **kw)
        self.conv_shortcut = Conv2d(cin, cout, 1, **kw) if cin != cout else None

    def __call__(self, x):
        h = self.conv1(jax.nn.silu(self.norm1(x)))
        h = self.conv2(jax.nn.silu(self.norm2(h)))
        skip = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        return skip + h


class MidAttention(nnx.Module):
    """diffusers' ``Attention`` as the mid block builds it (``_from_deprecated_attn_block``):
    group norm, one head, biased projections, residual connection."""

    def __init__(self, channels: int, groups: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.group_norm = GroupNorm(channels, groups, rngs=rngs, param_dtype=param_dtype)
        self.to_q = Linear(channels, channels, **kw)
        self.to_k = Linear(channels, channels, **kw)
        self.to_v = Linear(channels, channels, **kw)
        self.to_out = Linear(channels, channels, **kw)

    def __call__(self, x):
        b, h, w, c = x.shape
        t = self.group_norm(x).reshape(b, h * w, c)
        o = single_head_attention(self.to_q(t), self.to_k(t), self.to_v(t))
        return x + self.to_out(o).reshape(b, h, w, c).astype(x.dtype)


class MidBlock(nnx.Module):
    def __init__(self, channels: int, groups: int, attention: bool, *, rngs: nnx.Rngs | None, dtype,
                 param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResnetBlock(channels, channels, groups, **kw) for _ in range(2)])
        self.attentions = nnx.List([MidAttention(channels, groups, **kw)] if attention else [])

    def __call__(self, x):
        x = self.resnets[0](x)
        if len(self.attentions):
            x = self.attentions[0](x)
        return self.resnets[1](x)


class Downsampler(nnx.Module):
    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        self.conv = Conv2d(channels, channels, 3, stride=2, padding=DOWNSAMPLE_PADDING, rngs=rngs,
                           dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x):
        return self.conv(x)


class Upsampler(nnx.Module):
    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        self.conv = Conv2d(channels, channels, 3, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def __call__(self, x):
        return self.conv(upsample_nearest_2x(x))


class EncoderBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, layers: int, groups: int, downsample: bool, *,
                 rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResnetBlock(cin if i == 0 else cout, cout, groups, **kw)
                                 for i in range(layers)])
        self.downsamplers = nnx.List([Downsampler(cout, **kw)] if downsample else [])

    def __call__(self, x):
        for r in self.resnets:
            x = r(x)
        for d in self.downsamplers:
            x = d(x)
        return x


class DecoderBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, layers: int, groups: int, upsample: bool, *,
                 rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResnetBlock(cin if i == 0 else cout, cout, groups, **kw)
                                 for i in range(layers)])
        self.upsamplers = nnx.List([Upsampler(cout, **kw)] if upsample else [])

    def __call__(self, x):
        for r in self.resnets:
            x = r(x)
        for u in self.upsamplers:
            x = u(x)
        return x


class Encoder(nnx.Module):
    """Images ``[B, H, W, in_channels]`` -> the posterior's (mean, logvar) ``[B, h, w, 2c]``."""

    def __init__(self, cfg: AutoencoderKLConfig, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        ch, g = cfg.block_out_channels, cfg.norm_num_groups
        self.conv_in = Conv2d(cfg.in_channels, ch[0], 3, **kw)
        self.down_blocks = nnx.List([
            EncoderBlock(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block, g, i < len(ch) - 1, **kw)
            for i in range(len(ch))])
        self.mid_block = MidBlock(ch[-1], g, cfg.mid_block_add_attention, **kw)
        self.conv_norm_out = GroupNorm(ch[-1], g, rngs=rngs, param_dtype=param_dtype)
        self.conv_out = Conv2d(ch[-1], 2 * cfg.latent_channels, 3, **kw)

    def __call__(self, x):
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(jax.nn.silu(self.conv_norm_out(x)))


class Decoder(nnx.Module):
    """Raw latents ``[B, h, w, c]`` -> images ``[B, H, W, out_channels]`` in about [-1, 1]."""

    def __init__(self, cfg: AutoencoderKLConfig, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        ch, g = cfg.decoder_channels[::-1], cfg.norm_num_groups
        self.conv_in = Conv2d(cfg.latent_channels, ch[0], 3, **kw)
        self.mid_block = MidBlock(ch[0], g, cfg.mid_block_add_attention, **kw)
        self.up_blocks = nnx.List([
            DecoderBlock(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block + 1, g, i < len(ch) - 1,
                         **kw)
            for i in range(len(ch))])
        self.conv_norm_out = GroupNorm(ch[-1], g, rngs=rngs, param_dtype=param_dtype)
        self.conv_out = Conv2d(ch[-1], cfg.out_channels, 3, **kw)

    def __call__(self, z):
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(jax.nn.silu(self.conv_norm_out(x)))


class AutoencoderKL(nnx.Module):
    """``encode`` gives the posterior mean (raw latents), ``decode`` the image in [-1, 1] space
    (unclipped, as diffusers' ``decode``). ``rngs=None`` builds shape-only parameters for a
    converter to fill (``models.convert.vae``); ``rngs`` a random init."""

    def __init__(self, cfg: AutoencoderKLConfig, *, rngs: nnx.Rngs | None, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        c = cfg.latent_channels
        self.config = cfg
        self.encoder = Encoder(cfg, **kw)
        self.decoder = Decoder(cfg, **kw)
        self.quant_conv = Conv2d(2 * c, 2 * c, 1, **kw) if cfg.use_quant_conv else None
        self.post_quant_conv = Conv2d(c, c, 1, **kw) if cfg.use_post_quant_conv else None

    def encode(self, images):
        moments = self.encoder(images)
        if self.quant_conv is not None:
            moments = self.quant_conv(moments)
        return moments[..., :self.config.latent_channels]

    def decode(self, z):
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)
