"""MMDiT: a dual-stream Diffusion Transformer (SD3 / Flux / Qwen-Image style) in Flax NNX.

Text tokens and image patches keep separate weights (projections, MLPs, adaLN modulation) but
attend jointly over the concatenated sequence ``[text; image]``. Every block is modulated
(adaLN-Zero) by ``c = silu(temb(t) + W pooled_text)``. The model predicts the flow-matching
velocity ``v = noise - x0`` for images in [-1, 1].

Attention goes through ``spotlight_jax.parallel.attention`` so the same model runs dense on one
device or sequence-parallel (ulysses / ring / usp) on a mesh: the caller passes an
``AttentionSpec`` at call time, so one set of weights serves any mesh.

Pixel-space extras for the tiny CPU model: an optional 3x3 conv stem before patchify and a 3x3
conv refinement after unpatchify (zero-initialised residual) let neighbouring patches agree on
object edges instead of each patch sharpening its own noise. ``pixel_head = F`` adds a small
full-resolution decoder: the final layer also emits F features per pixel, and three 3x3 convs
over [features, x_t] add a zero-initialised correction to the velocity. It renders shapes at
sub-patch precision (a 4x4 patch cannot place a triangle's edge by itself) for ~30% more FLOPs
at 32x32, and since it starts at zero a model without it can be grown into one with it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from spotlight_jax import parallel
from spotlight_jax.models.layers import (
    Dense,
    RMSNorm,
    layer_norm,
    modulate,
    param,
    sincos_1d,
    sincos_2d,
    timestep_embedding,
)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def as_dtype(name):
    if not isinstance(name, str):
        return name
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


@dataclasses.dataclass(frozen=True)
class MMDiTConfig:
    """Shape and numerics of the MMDiT and its prompt encoder."""

    image_size: int = 32          # pixels (or latent cells when latent_channels is set)
    channels: int = 3             # image (or VAE latent) channels
    patch_size: int = 4
    width: int = 128
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0
    qk_norm: bool = True
    # Prompt encoder (synthetic vocabulary); text_width == 0 means precomputed embeddings of
    # width `text_embed_dim` are fed directly (a real text encoder run offline).
    vocab_size: int = 64
    text_len: int = 16
    text_width: int = 128
    text_layers: int = 2
    text_heads: int = 4
    text_embed_dim: int = 0
    conv_stem: int = 0            # channels of a 3x3 conv before patchify (0 = off)
    conv_head: bool = False       # 3x3 conv refinement after unpatchify
    pixel_head: int = 0           # channels of the full-resolution conv decoder (0 = off)
    dtype: str = "float32"        # compute dtype
    param_dtype: str = "float32"
    remat: bool = False           # jax.checkpoint each block
    scan_blocks: bool = False     # lax.scan over stacked blocks (large depths compile once)

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def validate(self) -> MMDiTConfig:
        """Returns self, or raises a one-line ValueError naming the bad field (``name=value:``),
        what it must be and an example fix."""
        def bad(name, why):
            raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

        for name in ("image_size", "channels", "patch_size", "width", "depth", "num_heads",
                     "vocab_size", "text_len", "text_heads"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        for name in ("text_width", "text_layers", "text_embed_dim", "conv_stem", "pixel_head"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0 (0 = off)")
        if not self.mlp_ratio > 0:
            bad("mlp_ratio", "must be > 0 (e.g. mlp_ratio=4.0)")
        if self.width % self.num_heads:
            bad("num_heads", f"must divide width={self.width} (e.g. num_heads="
                             f"{_divisor_near(self.width, self.num_heads)})")
        if self.image_size % self.patch_size:
            bad("patch_size", f"must divide image_size={self.image_size} (e.g. patch_size="
                              f"{_divisor_near(self.image_size, self.patch_size)})")
        if (self.width // self.num_heads) % 2:
            bad("num_heads", f"gives an odd head_dim={self.width // self.num_heads} "
                             "(width / num_heads); head_dim must be even")
        if self.text_width == 0 and self.text_embed_dim == 0:
            bad("text_embed_dim", "must be > 0 when text_width=0 (the width of the precomputed "
                                  "text embeddings), or set text_width > 0")
        if self.text_width and self.text_width % self.text_heads:
            bad("text_heads", f"must divide text_width={self.text_width}")
        for name in ("dtype", "param_dtype"):
            if isinstance(getattr(self, name), str) and getattr(self, name) not in _DTYPES:
                bad(name, f"choose one of {sorted(_DTYPES)}")
        return self


def _divisor_near(n: int, k: int) -> int:
    """The divisor of ``n`` closest to ``k`` (for an error message's example fix)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - k), d))


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """How attention runs: dense on one device, or sequence-parallel over ``mesh[axis]``."""

    mesh: Any = None
    strategy: str = "dense"
    axis: Any = "sp"


class SelfAttentionLayer(nnx.Module):
    """Pre-LN transformer layer for the prompt encoder."""

    def __init__(self, width, heads, *, rngs, dtype, param_dtype):
        self.heads = heads
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.qkv = Dense(width, 3 * width, axes=("embed", "qkv"), **kw)
        self.out = Dense(width, width, axes=("qkv", "embed"), **kw)
        self.fc1 = Dense(width, 4 * width, axes=("embed", "mlp"), **kw)
        self.fc2 = Dense(4 * width, width, axes=("mlp", "embed"), **kw)

    def __call__(self, x, mask):
        b, n, d = x.shape
        q, k, v = jnp.split(self.qkv(layer_norm(x)).reshape(b, n, 3, self.heads, -1), 3, axis=2)
        a = jax.nn.dot_product_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0],
                                         mask=mask[:, None, None, :])
        x = x + self.out(a.reshape(b, n, d))
        return x + self.fc2(jax.nn.gelu(self.fc1(layer_norm(x))))


class PromptEncoder(nnx.Module):
    """Token embedding + a few transformer layers over the synthetic world's vocabulary.

    Returns per-token features ``[B, L, text_width]`` and a masked-mean pooled vector. A real
    text encoder's precomputed embeddings can replace it (``text_width == 0`` in the config).
    """

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs):
        dt, pdt = as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        self.embed = param(rngs, nnx.initializers.normal(0.02), (cfg.vocab_size, cfg.text_width),
                           pdt, ("vocab", "embed"))
        self.layers = nnx.List([SelfAttentionLayer(cfg.text_width, cfg.text_heads, rngs=rngs,
                                                   dtype=dt, param_dtype=pdt)
                                for _ in range(cfg.text_layers)])
        self.dtype = dt

    def __call__(self, tokens, mask):
        x = jnp.take(self.embed[...], tokens, axis=0).astype(self.dtype)
        x = x + sincos_1d(tokens.shape[1], x.shape[-1]).astype(self.dtype)[None]
        for layer in self.layers:
            x = layer(x, mask)
        x = layer_norm(x)
        m = mask[..., None].astype(x.dtype)
        pooled = (x * m).sum(1) / jnp.maximum(m.sum(1), 1)
        return x, pooled


class StreamParams(nnx.Module):
    """The weights one stream (text or image) owns inside a dual-stream block."""

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs):
        d, dt, pdt = cfg.width, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        hidden = int(cfg.width * cfg.mlp_ratio)
        self.mod = Dense(d, 6 * d, axes=("cond", "embed"), zero=True, **kw)
        self.qkv = Dense(d, 3 * d, axes=("embed", "qkv"), **kw)
        self.out = Dense(d, d, axes=("qkv", "embed"), **kw)
        self.fc1 = Dense(d, hidden, axes=("embed", "mlp"), **kw)
        self.fc2 = Dense(hidden, d, axes=("mlp", "embed"), **kw)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
            self.k_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
        else:
            self.q_norm = self.k_norm = None

    def pre_attention(self, x, c, heads):
        shift1, scale1, gate1, shift2, scale2, gate2 = jnp.split(self.mod(c), 6, axis=-1)
        b, n, d = x.shape
        qkv = self.qkv(modulate(layer_norm(x), shift1, scale1)).reshape(b, n, 3, heads, d // heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return (q, k, v), (gate1, shift2, scale2, gate2)

    def post_attention(self, x, attn, mods):
        gate1, shift2, scale2, gate2 = mods
        x = x + gate1[:, None] * self.out(attn)
        h = self.fc2(jax.nn.gelu(self.fc1(modulate(layer_norm(x), shift2, scale2))))
        return x + gate2[:, None] * h


class MMDiTBlock(nnx.Module):
    """Dual-stream block: separate weights per stream, joint attention over [text; image]."""

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs):
        self.txt = StreamParams(cfg, rngs=rngs)
        self.img = StreamParams(cfg, rngs=rngs)
        self.heads = cfg.num_heads

    def __call__(self, txt, img, c, kv_mask, attn: AttentionSpec):
        (tq, tk, tv), tmods = self.txt.pre_attention(txt, c, self.heads)
        (iq, ik, iv), imods = self.img.pre_attention(img, c, self.heads)
        q = jnp.concatenate([tq, iq], axis=1)
        k = jnp.concatenate([tk, ik], axis=1)
        v = jnp.concatenate([tv, iv], axis=1)
        o = parallel.attention(q, k, v, mesh=attn.mesh, strategy=attn.strategy, axis=attn.axis,
                               kv_mask=kv_mask)
        b, n, h, hd = o.shape
        o = o.reshape(b, n, h * hd)
        lt = txt.shape[1]
        return (self.txt.post_attention(txt, o[:, :lt], tmods),
                self.img.post_attention(img, o[:, lt:], imods))


class Conv3x3(nnx.Module):
    def __init__(self, cin, cout, *, rngs, zero=False, param_dtype=jnp.float32,
                 dtype=jnp.float32):
        init = (nnx.initializers.zeros if zero
                else nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal"))
        self.kernel = param(rngs, init, (3, 3, cin, cout), param_dtype,
                            (None, None, "patch", "patch"))
        self.bias = param(rngs, nnx.initializers.zeros, (cout,), param_dtype, ("patch",))
        self.dtype = dtype

    def __call__(self, x):
        y = jax.lax.conv_general_dilated(
            x.astype(self.dtype), self.kernel[...].astype(self.dtype), (1, 1), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + self.bias[...].astype(self.dtype)


def patchify(x, p):
    b, h, w, c = x.shape
    x = x.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


def unpatchify(x, p, h, w, c):
    b = x.shape[0]
    x = x.reshape(b, h // p, w // p, p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


class MMDiT(nnx.Module):
    """Velocity model ``v(x_t, t, prompt)`` for flow matching.

    Call: ``model(x, t, tokens, token_mask, attn=AttentionSpec())`` with x ``[B,H,W,C]``,
    t ``[B]`` in [0, 1] (1 = noise), tokens int ``[B, L]`` (or float embeddings
    ``[B, L, text_embed_dim]`` when the config has no prompt encoder), token_mask bool ``[B, L]``.
    """

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs):
        cfg = cfg.validate()
        self.cfg = cfg
        d, dt, pdt = cfg.width, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        if cfg.text_width:
            self.encoder = PromptEncoder(cfg, rngs=rngs)
            tdim = cfg.text_width
        else:
            self.encoder = None
            tdim = cfg.text_embed_dim
        pin = cfg.patch_size ** 2 * (cfg.conv_stem or cfg.channels)
        self.stem = Conv3x3(cfg.channels, cfg.conv_stem, **kw) if cfg.conv_stem else None
        self.patch_embed = Dense(pin, d, axes=("patch", "embed"), **kw)
        self.text_proj = Dense(tdim, d, axes=("cond", "embed"), **kw)
        self.t_fc1 = Dense(256, d, axes=("cond", "embed"), **kw)
        self.t_fc2 = Dense(d, d, axes=("embed", "cond"), **kw)
        self.pool_proj = Dense(tdim, d, axes=("cond", "embed"), **kw)
        if cfg.scan_blocks:
            @nnx.split_rngs(splits=cfg.depth)
            @nnx.vmap(in_axes=0, out_axes=0)
            def make(r):
                return MMDiTBlock(cfg, rngs=r)

            self.blocks = make(rngs)
        else:
            self.blocks = nnx.List([MMDiTBlock(cfg, rngs=rngs) for _ in range(cfg.depth)])
        self.final_mod = Dense(d, 2 * d, axes=("cond", "embed"), zero=True, **kw)
        self.final = Dense(d, cfg.patch_size ** 2 * cfg.channels, axes=("embed", "patch"),
                           zero=True, **kw)
        self.head = (Conv3x3(cfg.channels, cfg.channels, zero=True, **kw)
                     if cfg.conv_head else None)
        if cfg.pixel_head:
            f = cfg.pixel_head
            self.pixel_feat = Dense(d, cfg.patch_size ** 2 * f, axes=("embed", "patch"), **kw)
            self.pixel_convs = nnx.List([Conv3x3(f + cfg.channels, f, **kw), Conv3x3(f, f, **kw),
                                         Conv3x3(f, cfg.channels, zero=True, **kw)])

    def encode(self, tokens, token_mask):
        """The prompt's timestep-independent part: ``(text features [B, L, width], pooled
        conditioning [B, width])`` after their projections. A sampler encodes a prompt once per
        rollout and a trainer once per train step, then passes it as ``context``."""
        dt = as_dtype(self.cfg.dtype)
        token_mask = token_mask.astype(bool)
        if self.encoder is not None:
            txt, pooled = self.encoder(tokens, token_mask)
        else:
            txt = tokens.astype(dt)
            m = token_mask[..., None].astype(dt)
            pooled = (txt * m).sum(1) / jnp.maximum(m.sum(1), 1)
        return self.text_proj(txt), self.pool_proj(pooled)

    def __call__(self, x, t, tokens, token_mask, attn: AttentionSpec = AttentionSpec(),
                 context=None):
        """``context``: ``encode(tokens, token_mask)`` computed once by the caller (the same
        result as leaving it None, which encodes here)."""
        cfg = self.cfg
        dt = as_dtype(cfg.dtype)
        b, h, w, ch = x.shape
        token_mask = token_mask.astype(bool)
        txt, pooled = self.encode(tokens, token_mask) if context is None else context
        xin = x.astype(dt)
        if self.stem is not None:
            xin = jax.nn.gelu(self.stem(xin))
        img = self.patch_embed(patchify(xin, cfg.patch_size))
        gh, gw = h // cfg.patch_size, w // cfg.patch_size
        img = img + sincos_2d(gh, gw, cfg.width).astype(dt)[None]
        temb = self.t_fc2(jax.nn.silu(self.t_fc1(timestep_embedding(t, 256).astype(dt))))
        c = jax.nn.silu(temb + pooled)
        kv_mask = jnp.concatenate([token_mask, jnp.ones((b, img.shape[1]), bool)], axis=1)

        def run_block(block, txt, img):
            return block(txt, img, c, kv_mask, attn)

        if cfg.remat:
            run_block = nnx.remat(run_block)
        if cfg.scan_blocks:
            graphdef, stacked = nnx.split(self.blocks)

            def body(carry, block_state):
                block = nnx.merge(graphdef, block_state)
                return run_block(block, *carry), None

            (txt, img), _ = jax.lax.scan(body, (txt, img), stacked)
        else:
            for block in self.blocks:
                txt, img = run_block(block, txt, img)
        shift, scale = jnp.split(self.final_mod(c), 2, axis=-1)
        feats = modulate(layer_norm(img), shift, scale)
        out = unpatchify(self.final(feats), cfg.patch_size, h, w, ch)
        if self.head is not None:
            out = out + self.head(out)
        if cfg.pixel_head:
            z = unpatchify(self.pixel_feat(feats), cfg.patch_size, h, w, cfg.pixel_head)
            z = jnp.concatenate([z, x.astype(dt)], axis=-1)
            conv1, conv2, conv3 = self.pixel_convs
            out = out + conv3(jax.nn.gelu(conv2(jax.nn.gelu(conv1(z)))))
        return out.astype(jnp.float32)


def count_params(state) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(state))
