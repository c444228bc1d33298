"""Wan's causal 3-D VAE (diffusers ``AutoencoderKLWan``, Wan 2.1; Qwen-Image's
``AutoencoderKLQwenImage`` is the same network, used on one frame) in Flax NNX, channels-last:
clips ``[B, T, H, W, C]``, images ``[B, H, W, C]`` (one frame).

**Causality, and why decoding in chunks is exact.** Every temporal convolution sees only the
current and earlier frames: before the first frame its ``kt - 1`` frames of history are zeros.
So a clip can be run chunk by chunk, each causal conv carrying the last ``kt - 1`` frames of its
input into the next chunk (:class:`History`), with the result of running it whole. ``decode``
goes one latent frame per chunk by default, as diffusers does, so activation memory is one
chunk's whatever the clip's length; the chunks after the first run under ``lax.scan`` (one
compiled body, whatever the frame count).

**The first chunk is one frame, and special**: the first latent frame decodes to one frame and
the first frame encodes alone. On it the temporal resamplers do nothing: the decoder's
``upsample3d`` passes the frame on without its temporal conv (whose history stays zeros) and
the encoder's ``downsample3d`` only remembers it. With the two temporal halvings of Wan 2.1,
``1 + 4k`` frames <-> ``1 + k`` latent frames. On the first chunk every causal conv's history is
zeros, so only its last temporal tap meets data and it runs as a 2-D conv of that tap: an image
through this VAE costs what a 2-D VAE would.

Blocks: ``ResidualBlock`` = RMS norm -> SiLU -> causal 3x3x3 conv -> RMS norm -> SiLU -> causal
3x3x3 conv, plus the input (a 1x1x1 conv when channels change); ``AttentionBlock`` = per frame,
one head over its pixels; ``Resample`` = (up) temporal conv doubling the frames (``upsample3d``),
nearest 2x, 3x3 conv halving the channels, or (down) bottom/right zero pad and 3x3 stride-2 conv,
then a stride-2 temporal conv (``downsample3d``). Clips are in [-1, 1]; latents are raw (before
``latents_mean``/``latents_std``, which ``models.vae.latent_vae`` applies); ``decode`` clamps to
[-1, 1] as diffusers' does. Parameters are named after diffusers' modules (the converter maps
them by rule, ``models.convert.vae``).
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
    vae_param,
)


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
    """The architecture fields of a diffusers ``AutoencoderKLWan`` (2.1, or 2.2 with
    ``is_residual``) or ``AutoencoderKLQwenImage`` config. ``input_channels`` is what the
    encoder's first conv takes: RGB times ``patch_size ** 2`` (Wan 2.2 folds 2 x 2 pixels into
    12 channels before the encoder and unfolds them after the decoder)."""
    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    input_channels: int = 3
    decoder_base_dim: int = 0     # 0: base_dim
    is_residual: bool = False     # Wan 2.2: averaged / duplicated shortcuts around each level
    patch_size: int = 1

    @property
    def downsample_factor(self) -> int:
        """Pixels per latent cell along H and W."""
        return 2 ** (len(self.dim_mult) - 1) * self.patch_size

    @property
    def temporal_factor(self) -> int:
        """Frames per latent frame after the first (``T = 1 + factor * (t - 1)``)."""
        return 2 ** sum(bool(t) for t in self.temperal_downsample)


# The released VAEs (diffusers' config.json fields): Wan 2.1's, 16 latent channels (also Wan
# 2.2 A14B's and Qwen-Image's), and Wan 2.2 TI2V 5B's, 48 channels at 16x spatial compression.
WAN21_VAE = WanVAEConfig()
WAN22_VAE = WanVAEConfig(base_dim=160, z_dim=48, decoder_base_dim=256, is_residual=True,
                         patch_size=2, input_channels=12)


def released_vae(latent_channels: int) -> WanVAEConfig:
    """The released Wan VAE whose latents have ``latent_channels`` channels."""
    for cfg in (WAN21_VAE, WAN22_VAE):
        if cfg.z_dim == latent_channels:
            return cfg
    raise ValueError(f"latent channels={latent_channels}: no released Wan VAE has them (16: "
                     "Wan 2.1, 48: Wan 2.2 TI2V)")


class History:
    """The causal convs' input histories for one chunk, in call order: ``previous`` is the list
    the last chunk wrote (``None`` on the first chunk: zeros everywhere), ``written`` the list
    this chunk writes. The network calls its convs in a fixed order, so position ``i`` is always
    the same conv and the lists are a ``lax.scan`` carry."""

    def __init__(self, previous: list | None = None):
        self.previous, self.written = previous, []

    def read(self):
        """The next conv's history (``None``: zeros)."""
        return None if self.previous is None else self.previous[len(self.written)]

    def write(self, frames):
        self.written.append(frames)


def _conv3d(x, kernel, bias, *, stride_t: int, dtype):
    """A conv over ``[B, T, H, W, C]`` with a ``[kt, kh, kw, in, out]`` kernel: valid in time
    (the caller prepends the history), same-padded in space."""
    kt, kh, kw = kernel.shape[:3]
    y = jax.lax.conv_general_dilated(
        x.astype(dtype), kernel.astype(dtype), window_strides=(stride_t, 1, 1),
        padding=((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2)),
        dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
    return y + bias.astype(dtype)


class CausalConv3d(nnx.Module):
    """diffusers' ``WanCausalConv3d`` (stride 1): ``kt - 1`` frames of history (zeros before
    the clip) then the chunk's frames, valid in time; the history it passes on is the last
    ``kt - 1`` frames of that sequence."""

    def __init__(self, cin: int, cout: int, kernel=(3, 3, 3), *, rngs: nnx.Rngs | None,
                 dtype, param_dtype):
        kernel = (kernel,) * 3 if isinstance(kernel, int) else tuple(kernel)
        self.kernel = vae_param(rngs, nnx.initializers.lecun_normal(), (*kernel, cin, cout),
                                param_dtype)
        self.bias = vae_param(rngs, nnx.initializers.zeros, (cout,), param_dtype)
        self.dtype = dtype

    def __call__(self, x, history: History | None = None):
        kernel, bias = self.kernel[...], self.bias[...]
        keep = kernel.shape[0] - 1
        if keep == 0:
            return _conv3d(x, kernel, bias, stride_t=1, dtype=self.dtype)
        prev = history.read() if history is not None else None
        if prev is None and x.shape[1] == 1:   # zeros before one frame: only the last tap counts
            y = _conv3d(x, kernel[-1:], bias, stride_t=1, dtype=self.dtype)
            prev = jnp.zeros((x.shape[0], keep, *x.shape[2:]), x.dtype)
            seq = jnp.concatenate([prev, x], axis=1)
        else:
            if prev is None:
                prev = jnp.zeros((x.shape[0], keep, *x.shape[2:]), x.dtype)
            seq = jnp.concatenate([prev.astype(x.dtype), x], axis=1)
            y = _conv3d(seq, kernel, bias, stride_t=1, dtype=self.dtype)
        if history is not None:
            history.write(seq[:, -keep:])
        return y


class TemporalDownConv(nnx.Module):
    """The ``downsample3d`` temporal conv: kernel 3 over (the previous chunk's last frame, the
    chunk's frames), stride 2, valid; ``4m`` frames in, ``2m`` out."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        self.kernel = vae_param(rngs, nnx.initializers.lecun_normal(),
                                (3, 1, 1, channels, channels), param_dtype)
        self.bias = vae_param(rngs, nnx.initializers.zeros, (channels,), param_dtype)
        self.dtype = dtype

    def __call__(self, x, last_frame):
        seq = jnp.concatenate([last_frame.astype(x.dtype), x], axis=1)
        return _conv3d(seq, self.kernel[...], self.bias[...], stride_t=2, dtype=self.dtype)


def per_frame(fn, x):
    """``fn`` of ``[N, H, W, C]`` applied to every frame of ``[B, T, H, W, C]``."""
    b, t = x.shape[:2]
    y = fn(x.reshape(b * t, *x.shape[2:]))
    return y.reshape(b, t, *y.shape[1:])


class ResidualBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm1 = ChannelRMSNorm(cin, rngs=rngs, param_dtype=param_dtype)
        self.conv1 = CausalConv3d(cin, cout, 3, **kw)
        self.norm2 = ChannelRMSNorm(cout, rngs=rngs, param_dtype=param_dtype)
        self.conv2 = CausalConv3d(cout, cout, 3, **kw)
        self.conv_shortcut = CausalConv3d(cin, cout, 1, **kw) if cin != cout else None

    def __call__(self, x, history: History):
        skip = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        h = self.conv1(jax.nn.silu(self.norm1(x)), history)
        h = self.conv2(jax.nn.silu(self.norm2(h)), history)
        return h + skip


class AttentionBlock(nnx.Module):
    """One head over each frame's pixels (frames do not attend to each other)."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.norm = ChannelRMSNorm(channels, rngs=rngs, param_dtype=param_dtype)
        self.to_qkv = Conv2d(channels, 3 * channels, 1, **kw)
        self.proj = Conv2d(channels, channels, 1, **kw)

    def __call__(self, x):
        def one_frame(f):
            n, h, w, c = f.shape
            qkv = self.to_qkv(self.norm(f)).reshape(n, h * w, 3 * c)
            q, k, v = jnp.split(qkv, 3, axis=-1)
            o = single_head_attention(q, k, v).reshape(n, h, w, c)
            return f + self.proj(o).astype(f.dtype)
        return per_frame(one_frame, x)


class Resample(nnx.Module):
    """``mode`` in ``upsample2d|upsample3d|downsample2d|downsample3d`` (see the module doc);
    an upsampler's conv gives ``up_channels`` (Wan 2.1: half its input; 2.2: all of it)."""

    def __init__(self, channels: int, mode: str, *, rngs: nnx.Rngs | None, dtype, param_dtype,
                 up_channels: int | None = None):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.mode = mode
        if mode.startswith("upsample"):
            up = channels // 2 if up_channels is None else up_channels
            self.resample = Conv2d(channels, up, 3, **kw)
        else:
            self.resample = Conv2d(channels, channels, 3, stride=2, padding=DOWNSAMPLE_PADDING,
                                   **kw)
        self.time_conv = (CausalConv3d(channels, 2 * channels, (3, 1, 1), **kw)
                          if mode == "upsample3d" else
                          TemporalDownConv(channels, **kw) if mode == "downsample3d" else None)

    def __call__(self, x, history: History, first: bool):
        if self.mode == "upsample3d":
            if first:       # the first frame is not doubled; the temporal conv starts after it
                b, _, h, w, c = x.shape
                history.write(jnp.zeros((b, 2, h, w, c), x.dtype))
            else:           # 2C channels per frame = two frames, interleaved
                y = self.time_conv(x, history)
                b, t, h, w, _ = y.shape
                x = y.reshape(b, t, h, w, 2, -1).transpose(0, 1, 4, 2, 3, 5)
                x = x.reshape(b, 2 * t, h, w, -1)
        if self.mode.startswith("upsample"):
            return per_frame(lambda f: self.resample(upsample_nearest_2x(f)), x)
        x = per_frame(self.resample, x)
        if self.mode == "downsample3d":
            if first:
                history.write(x[:, -1:])
            else:
                last = history.read()
                history.write(x[:, -1:])
                x = self.time_conv(x, last)
        return x


class MidBlock(nnx.Module):
    def __init__(self, channels: int, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResidualBlock(channels, channels, **kw) for _ in range(2)])
        self.attentions = nnx.List([AttentionBlock(channels, **kw)])

    def __call__(self, x, history: History):
        x = self.attentions[0](self.resnets[0](x, history))
        return self.resnets[1](x, history)


class UpBlock(nnx.Module):
    def __init__(self, cin: int, cout: int, num_res_blocks: int, mode: str | None, *,
                 rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.resnets = nnx.List([ResidualBlock(cin if i == 0 else cout, cout, **kw)
                                 for i in range(num_res_blocks + 1)])
        self.upsamplers = nnx.List([Resample(cout, mode, **kw)] if mode else [])

    def __call__(self, x, history: History, first: bool):
        for r in self.resnets:
            x = r(x, history)
        for u in self.upsamplers:
            x = u(x, history, first)
        return x


def avg_down(x, cout: int, factor_t: int, factor_s: int):
    """Wan 2.2's encoder shortcut: ``[B, T, H, W, C]`` -> ``[B, T / ft, H / fs, W / fs, cout]``,
    each output channel the mean of a group of the input's (channel, time, row, column)
    sub-cells; ``T`` zero-padded in front to a multiple of ``ft`` (one frame: ``(0 + x) / 2``)."""
    pad = -x.shape[1] % factor_t
    if pad:
        x = jnp.concatenate([jnp.zeros((x.shape[0], pad, *x.shape[2:]), x.dtype), x], axis=1)
    b, t, h, w, c = x.shape
    x = x.reshape(b, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s, c)
    # torch's channel-first flattening: (channel, time, row, column) sub-cell, channel slowest
    x = x.transpose(0, 1, 3, 5, 7, 2, 4, 6).reshape(b, t // factor_t, h // factor_s,
                                                    w // factor_s, -1)
    return x.reshape(*x.shape[:-1], cout, -1).mean(axis=-1)


def dup_up(x, cout: int, factor_t: int, factor_s: int, first: bool):
    """Wan 2.2's decoder shortcut, :func:`avg_down`'s transpose: each channel repeated into a
    group of (channel, time, row, column) sub-cells; on the first chunk only the last of its
    ``ft`` frames is kept (one frame in, one out)."""
    b, t, h, w, c = x.shape
    factor = factor_t * factor_s * factor_s
    x = jnp.repeat(x, cout * factor // c, axis=-1)
    x = x.reshape(b, t, h, w, cout, factor_t, factor_s, factor_s)
    x = x.transpose(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, t * factor_t, h * factor_s,
                                                    w * factor_s, cout)
    return x[:, factor_t - 1:] if first else x


class ResidualDownBlock(nnx.Module):
    """Wan 2.2's encoder level: residual blocks, the downsampler, plus :func:`avg_down` of the
    level's input."""

    def __init__(self, cin: int, cout: int, num_res_blocks: int, temporal: bool, down: bool, *,
                 rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.cout, self.factor_t, self.factor_s = cout, 2 if temporal else 1, 2 if down else 1
        self.resnets = nnx.List([ResidualBlock(cin if i == 0 else cout, cout, **kw)
                                 for i in range(num_res_blocks)])
        mode = ("downsample3d" if temporal else "downsample2d") if down else None
        self.downsampler = Resample(cout, mode, **kw) if mode else None

    def __call__(self, x, history: History, first: bool):
        skip = avg_down(x, self.cout, self.factor_t, self.factor_s)
        for r in self.resnets:
            x = r(x, history)
        if self.downsampler is not None:
            x = self.downsampler(x, history, first)
        return x + skip.astype(x.dtype)


class ResidualUpBlock(nnx.Module):
    """Wan 2.2's decoder level: residual blocks, the upsampler (keeping its channels), plus
    :func:`dup_up` of the level's input."""

    def __init__(self, cin: int, cout: int, num_res_blocks: int, temporal: bool, up: bool, *,
                 rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.cout, self.factor_t, self.up = cout, 2 if temporal else 1, up
        self.resnets = nnx.List([ResidualBlock(cin if i == 0 else cout, cout, **kw)
                                 for i in range(num_res_blocks + 1)])
        mode = ("upsample3d" if temporal else "upsample2d") if up else None
        self.upsampler = Resample(cout, mode, up_channels=cout, **kw) if mode else None

    def __call__(self, x, history: History, first: bool):
        skip = dup_up(x, self.cout, self.factor_t, 2, first) if self.up else None
        for r in self.resnets:
            x = r(x, history)
        if self.upsampler is not None:
            x = self.upsampler(x, history, first)
        return x if skip is None else x + skip.astype(x.dtype)


class Encoder(nnx.Module):
    """Clips ``[B, T, H, W, 3]`` -> (mean, logvar) ``[B, t, h, w, 2 z]`` (before quant_conv).
    ``down_blocks`` is one flat list of residual blocks and resamplers, as in diffusers."""

    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        self.conv_in = CausalConv3d(cfg.input_channels, dims[0], 3, **kw)
        layers, last = [], len(cfg.dim_mult) - 1
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            if cfg.is_residual:
                layers.append(ResidualDownBlock(
                    cin, cout, cfg.num_res_blocks, i != last and cfg.temperal_downsample[i],
                    i != last, **kw))
                continue
            for _ in range(cfg.num_res_blocks):
                layers.append(ResidualBlock(cin, cout, **kw))
                cin = cout
            if i != last:
                mode = "downsample3d" if cfg.temperal_downsample[i] else "downsample2d"
                layers.append(Resample(cout, mode, **kw))
        self.down_blocks = nnx.List(layers)
        self.mid_block = MidBlock(dims[-1], **kw)
        self.norm_out = ChannelRMSNorm(dims[-1], rngs=rngs, param_dtype=param_dtype)
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, 3, **kw)

    def __call__(self, x, history: History, first: bool):
        x = self.conv_in(x, history)
        for layer in self.down_blocks:
            x = (layer(x, history) if isinstance(layer, ResidualBlock)
                 else layer(x, history, first))
        x = self.mid_block(x, history)
        return self.conv_out(jax.nn.silu(self.norm_out(x)), history)


class Decoder(nnx.Module):
    """Raw latents ``[B, t, h, w, z]`` (after post_quant_conv) -> clips ``[B, T, H, W, 3]``."""

    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs | None, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        mult = cfg.dim_mult
        base = cfg.decoder_base_dim or cfg.base_dim
        dims = [base * m for m in (mult[-1], *mult[::-1])]
        temperal_upsample = cfg.temperal_downsample[::-1]
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, **kw)
        self.mid_block = MidBlock(dims[0], **kw)
        blocks, last = [], len(mult) - 1
        for i, (cin, cout) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            if cfg.is_residual:
                blocks.append(ResidualUpBlock(cin, cout, cfg.num_res_blocks,
                                              i != last and temperal_upsample[i], i != last, **kw))
                continue
            cin = cin // 2 if i > 0 else cin  # the previous block's upsampler halved it
            mode = None
            if i != last:
                mode = "upsample3d" if temperal_upsample[i] else "upsample2d"
            blocks.append(UpBlock(cin, cout, cfg.num_res_blocks, mode, **kw))
        self.up_blocks = nnx.List(blocks)
        self.norm_out = ChannelRMSNorm(dims[-1], rngs=rngs, param_dtype=param_dtype)
        self.conv_out = CausalConv3d(dims[-1], cfg.input_channels, 3, **kw)

    def __call__(self, z, history: History, first: bool):
        x = self.mid_block(self.conv_in(z, history), history)
        for block in self.up_blocks:
            x = block(x, history, first)
        return self.conv_out(jax.nn.silu(self.norm_out(x)), history)


def fold_pixels(x, p: int):
    """Wan 2.2's patchify: ``p x p`` pixels into channels, ``[B, T, H, W, C]`` ->
    ``[B, T, H / p, W / p, C p p]``, channel order (channel, column offset, row offset) as
    diffusers'."""
    if p == 1:
        return x
    b, t, h, w, c = x.shape
    x = x.reshape(b, t, h // p, p, w // p, p, c)             # ..., hh, ph, ww, pw, c
    return x.transpose(0, 1, 2, 4, 6, 5, 3).reshape(b, t, h // p, w // p, c * p * p)


def unfold_pixels(x, p: int):
    """:func:`fold_pixels`' inverse."""
    if p == 1:
        return x
    b, t, h, w, cpp = x.shape
    x = x.reshape(b, t, h, w, cpp // (p * p), p, p)            # ..., c, pw, ph
    return x.transpose(0, 1, 2, 6, 3, 5, 4).reshape(b, t, h * p, w * p, cpp // (p * p))


def _in_chunks(step, x, chunk: int | None):
    """``step(frames, history, first) -> out`` over ``x`` ``[B, T, ...]``: the first frame, then
    the rest in chunks of ``chunk`` frames (``None``: one chunk) under ``lax.scan``, each
    chunk's histories carried into the next; the outputs joined along frames."""
    rest = x[:, 1:]
    n = rest.shape[1]
    chunk = max(n, 1) if chunk is None else int(chunk)
    if chunk < 1 or n % chunk:
        raise ValueError(f"chunk={chunk}: must divide the {n} frames after the first (1 decodes "
                         f"one latent frame at a time; None all at once)")
    first = History()
    out = step(x[:, :1], first, True)
    if n == 0:
        return out
    b = rest.shape[0]
    xs = rest.reshape(b, n // chunk, chunk, *rest.shape[2:]).swapaxes(0, 1)

    def body(previous, frames):
        h = History(previous)
        y = step(frames, h, False)
        return h.written, y

    _, ys = jax.lax.scan(body, first.written, xs)
    ys = ys.swapaxes(0, 1)
    ys = ys.reshape(b, ys.shape[1] * ys.shape[2], *ys.shape[3:])
    return jnp.concatenate([out, ys.astype(out.dtype)], axis=1)


class WanVAE(nnx.Module):
    """``encode`` gives the posterior mean (raw latents), ``decode`` the clip in [-1, 1]
    (clamped, as diffusers'). Both take a clip ``[B, T, ...]`` or an image ``[B, H, W, C]`` (one
    frame). ``rngs=None`` builds shape-only parameters for a converter to fill
    (``models.convert.vae``); ``rngs`` a random init."""

    def __init__(self, cfg: WanVAEConfig, *, rngs: nnx.Rngs | None, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        if len(cfg.temperal_downsample) != len(cfg.dim_mult) - 1:
            raise ValueError(f"temperal_downsample={list(cfg.temperal_downsample)}: needs one "
                             f"entry per downsampling, len(dim_mult) - 1 = "
                             f"{len(cfg.dim_mult) - 1} (e.g. [False, True, True] for 4 levels)")
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        z = cfg.z_dim
        self.config = cfg
        self.encoder = Encoder(cfg, **kw)
        self.quant_conv = CausalConv3d(2 * z, 2 * z, 1, **kw)
        self.post_quant_conv = CausalConv3d(z, z, 1, **kw)
        self.decoder = Decoder(cfg, **kw)

    def encode(self, x, chunk: int | None = None):
        """Clip ``[B, T, H, W, C]`` in [-1, 1], ``T = 1 + 4k`` (the temporal factor) -> raw
        posterior mean ``[B, 1 + k, h, w, z]``; ``chunk`` frames per chunk after the first (a
        multiple of the temporal factor; ``None`` all at once). An image gives ``[B, h, w, z]``."""
        if x.ndim == 4:
            return self.encode(x[:, None], chunk)[:, 0]
        f = self.config.temporal_factor
        if (x.shape[1] - 1) % f:
            raise ValueError(f"frames={x.shape[1]}: this VAE takes {f}k + 1 frames (e.g. "
                             f"{f * ((x.shape[1] - 1) // f) + 1} or "
                             f"{f * ((x.shape[1] - 1) // f + 1) + 1})")
        if chunk is not None and (chunk < 1 or chunk % f):
            raise ValueError(f"chunk={chunk}: encodes a multiple of {f} frames per chunk after "
                             f"the first (e.g. {f}; None all at once)")
        h = _in_chunks(self.encoder, fold_pixels(x, self.config.patch_size), chunk)
        return self.quant_conv(h)[..., :self.config.z_dim]

    def decode(self, z, chunk: int | None = 1):
        """Raw latents ``[B, t, h, w, z]`` -> the clip ``[B, 1 + 4 (t - 1), H, W, C]`` in
        [-1, 1]; ``chunk`` latent frames per chunk after the first (1, the default, bounds
        memory by one latent frame's activations; ``None`` all at once). An image's latents
        ``[B, h, w, z]`` give ``[B, H, W, C]``."""
        if z.ndim == 4:
            return self.decode(z[:, None], chunk)[:, 0]
        x = _in_chunks(self.decoder, self.post_quant_conv(z), chunk)
        return jnp.clip(unfold_pixels(x, self.config.patch_size), -1.0, 1.0)
