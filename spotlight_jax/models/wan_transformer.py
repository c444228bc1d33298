"""The Wan 2.x video transformer in Flax NNX (diffusers' ``WanTransformer3DModel``, text-to-video).

``model(x [B, F, H, W, C], t [B] in [0, 1], text_embeds [B, L, D], text_mask=None)`` returns the
flow-matching velocity with x's shape (``F`` latent frames; diffusers' timestep is ``1000 t``).
The architecture, as diffusers builds it: a 3-D patch embedding (``patch_size`` frames x rows x
columns, a strided Conv3d, here patchify + one matmul), 3-D rotary positions over (frame, row,
column) splitting each head's dims ``(d - 4 (d // 6), 2 (d // 6), 2 (d // 6))``; per block,
self-attention with QK RMSNorm across all heads and the rotation, cross-attention to the text
states (its own QK-norm, an affine LayerNorm before it), a tanh-GELU MLP, and the per-block
modulation: a learned ``[6, dim]`` table plus the time embedding's projection (shift, scale,
gate of the attention and the MLP). The time embedding (sinusoidal ``freq_dim``, linear-SiLU-
linear) and the text projection (linear, tanh-GELU, linear) come first; the output norm is
modulated by a ``[2, dim]`` table plus the time embedding, then projected and unpatchified.

Attention goes through ``parallel.attention`` (its ``AttentionSpec``), so the video tokens are
sequence-parallel over a mesh like the image models'; the cross-attention's text keys and values
are short and stay whole. ``models.convert.wan`` loads a diffusers folder into it.

As a run's model (``model.family='wan'``) the config also carries what the run samples
(``frames`` x ``image_size`` x ``image_width`` latent cells, ``text_len``) and, for the synthetic
video world, a prompt encoder over its words (``text_width > 0``, the MMDiT's
``PromptEncoder``) in place of UMT5 states; ``encode`` / ``context`` split the prompt's
timestep-independent part off as the MMDiT's do, so samplers and trainers call either model
the same way.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.models.layers import (
    Dense,
    RMSNorm,
    apply_rope,
    layer_norm,
    param,
    run_blocks,
    stacked_blocks,
    timestep_embedding,
)
from spotlight_jax.models.mmdit import REMAT_POLICIES, AttentionSpec, PromptEncoder, as_dtype


@dataclasses.dataclass(frozen=True)
class WanConfig:
    """diffusers' ``WanTransformer3DModel`` config (its ``config.json`` names), T2V."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 40
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 13824
    num_layers: int = 40
    cross_attn_norm: bool = True
    eps: float = 1e-6
    rope_theta: float = 10_000.0
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False           # jax.checkpoint each block (its backward recomputes it)
    remat_policy: str = "nothing"   # what a rematerialised block keeps (mmdit.REMAT_POLICIES)
    # lax.scan over the blocks' parameters stacked on a leading axis: one block is traced and
    # compiled whatever the depth (the looped blocks of a 40-layer model are compiled 40 times)
    scan_blocks: bool = False
    # What a run chooses (not in diffusers' config.json): the latent it samples, frames x
    # image_size x image_size cells (Wan 2.1 at 480 x 832 x 81 frames: 21 x 60 x 104 with a
    # non-square canvas; here square), and the prompt length.
    frames: int = 21
    image_size: int = 60
    image_width: int = 0          # latent columns when not square (480 x 832: 104); 0 = square
    text_len: int = 512
    # A prompt encoder over the synthetic world's vocabulary (the tiny video world, as the
    # MMDiT's): token embedding + ``text_layers`` self-attention layers of ``text_width``, whose
    # features feed ``text_dim``; text_width = 0: precomputed UMT5 states of width text_dim.
    vocab_size: int = 64
    text_width: int = 0
    text_layers: int = 2
    text_heads: int = 2
    # Pooled text conditioning, not in diffusers' Wan (which reads its prompt only through cross
    # attention): "text_mean" adds a projection of the prompt encoder's masked-mean features to
    # the timestep embedding, so every block's modulation carries the whole prompt, as the tiny
    # image MMDiT's does. Zero-initialised: a base grown from one without it starts unchanged.
    # "none" (every diffusers model) keeps the released architecture.
    pooled: str = "none"
    # Absolute positions, not in diffusers' Wan (3-D RoPE only, relative): "learned" adds a
    # frame, a row and a column embedding (each a table over the latent's patch grid, summed) to
    # the video tokens, so at pure noise the model knows where a pixel is and in which frame,
    # which a word that decides where objects are (a direction, a count) needs there.
    # Zero-initialised: a base grown from one without it starts unchanged. "none" (every
    # diffusers model) keeps the released architecture.
    pos_embed: str = "none"

    def __post_init__(self):
        # ConfigDicts hand lists; a frozen config must stay hashable (it is static in jit)
        if isinstance(self.patch_size, list):
            object.__setattr__(self, "patch_size", tuple(self.patch_size))

    @property
    def dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    # The names the rest of the project reads off a model config (``MMDiTConfig``'s).
    @property
    def width(self) -> int:
        return self.dim

    @property
    def depth(self) -> int:
        return self.num_layers

    @property
    def num_heads(self) -> int:
        return self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim

    @property
    def channels(self) -> int:
        return self.in_channels

    @property
    def text_embed_dim(self) -> int:
        """Width of the precomputed text states fed without a prompt encoder (UMT5's)."""
        return 0 if self.text_width else self.text_dim

    # What the rest of the project reads off an MMDiTConfig, fixed for Wan (class constants, not
    # fields): no pooled input, no guidance input, no single-stream blocks.
    pooled_dim = 0
    guidance_embed = False
    single_blocks = 0

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """One sample's latent: ``(frames, image_size, image_width or image_size,
        channels)``."""
        return self.frames, self.image_size, self.image_width or self.image_size, self.in_channels

    @property
    def num_patches(self) -> int:
        """Video tokens of one sample."""
        return math.prod(self.patch_grid)

    def passes(self, guidance: float) -> int:
        """Forward passes per velocity: 2 with classifier-free guidance, else 1."""
        return 1 if guidance == 1.0 else 2

    @property
    def patch_grid(self) -> tuple[int, int, int]:
        """The latent's video tokens as ``(frames, rows, columns)`` of patches."""
        pt, ph, pw = self.patch_size
        f, h, w, _ = self.latent_shape
        return f // pt, h // ph, w // pw

    @property
    def rope_axes(self) -> tuple[int, int, int]:
        """Each head's dims for (frame, row, column)."""
        d = self.attention_head_dim
        hw = 2 * (d // 6)
        return d - 2 * hw, hw, hw

    def validate(self) -> WanConfig:
        if len(self.patch_size) != 3 or min(self.patch_size) < 1:
            raise ValueError(f"patch_size={self.patch_size!r}: give (frames, rows, columns), "
                             "each >= 1 (Wan 2.1: (1, 2, 2))")
        if self.attention_head_dim % 2 or min(self.rope_axes) < 2:
            raise ValueError(f"attention_head_dim={self.attention_head_dim}: must be even and "
                             ">= 12 (three rotary axes)")
        pt, ph, pw = self.patch_size
        if self.frames < 1 or self.frames % pt:
            raise ValueError(f"frames={self.frames}: must be a positive multiple of the patch's "
                             f"{pt} frame(s) (latent frames: (video frames - 1) / 4 + 1 for "
                             "Wan 2.1's VAE)")
        if self.image_size < 1 or self.image_size % ph:
            raise ValueError(f"image_size={self.image_size}: must be a positive multiple of the "
                             f"patch's {ph} rows (latent rows: pixels / 8)")
        w = self.image_width or self.image_size
        if self.image_width < 0 or w % pw:
            raise ValueError(f"image_width={self.image_width}: must be 0 (square) or a positive "
                             f"multiple of the patch's {pw} columns (latent columns: pixels / 8)")
        if self.text_len < 1:
            raise ValueError(f"text_len={self.text_len}: must be >= 1 (tokens per prompt)")
        if self.text_width and (self.text_width % self.text_heads or self.vocab_size < 2):
            raise ValueError(f"text_width={self.text_width}: must divide into text_heads="
                             f"{self.text_heads} with vocab_size >= 2 (0 = UMT5 states)")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"{name}={getattr(self, name)!r}: use float32, bfloat16 or "
                                 "float16")
        if self.pooled not in ("none", "text_mean"):
            raise ValueError(f"pooled={self.pooled!r}: a Wan model takes 'none' (diffusers') or "
                             "'text_mean' (the world's prompt encoder's mean, added to the "
                             "timestep embedding)")
        if self.pooled == "text_mean" and not self.text_width:
            raise ValueError("pooled='text_mean' needs the world's prompt encoder (text_width > "
                             "0); a model reading UMT5 states takes pooled='none'")
        if self.pos_embed not in ("none", "learned"):
            raise ValueError(f"pos_embed={self.pos_embed!r}: a Wan model takes 'none' "
                             "(diffusers', RoPE only) or 'learned' (frame, row and column "
                             "tables added to the video tokens)")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r}: choose one of "
                             f"{tuple(REMAT_POLICIES)}")
        return self


class _Norm(nnx.Module):
    """LayerNorm computed in float32 (``layers.layer_norm``), with or without a learned affine
    (diffusers' ``FP32LayerNorm``); the result stays float32 for the modulation."""

    def __init__(self, dim: int, eps: float, affine: bool, *, rngs, param_dtype):
        self.eps = eps
        self.weight = (param(rngs, nnx.initializers.ones, (dim,), param_dtype, ("embed",))
                       if affine else None)
        self.bias = (param(rngs, nnx.initializers.zeros, (dim,), param_dtype, ("embed",))
                     if affine else None)

    def __call__(self, x):
        y = layer_norm(x.astype(jnp.float32), self.eps)
        if self.weight is not None:
            y = y * self.weight[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y


class WanAttention(nnx.Module):
    """Self- or cross-attention: q from ``x``, k and v from ``context`` (``x`` itself when
    None), QK RMSNorm across heads, rotary positions on q and k when given."""

    def __init__(self, cfg: WanConfig, *, rngs):
        d, dt, pdt = cfg.dim, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        self.to_q = Dense(d, d, axes=("embed", "qkv"), **kw)
        self.to_k = Dense(d, d, axes=("embed", "qkv"), **kw)
        self.to_v = Dense(d, d, axes=("embed", "qkv"), **kw)
        self.to_out = Dense(d, d, axes=("qkv", "embed"), **kw)
        # QK-norm across all heads at once: over the whole projection
        self.norm_q = RMSNorm(d, rngs=rngs, param_dtype=pdt, eps=cfg.eps)
        self.norm_k = RMSNorm(d, rngs=rngs, param_dtype=pdt, eps=cfg.eps)
        self.heads = cfg.num_attention_heads

    def __call__(self, x, attn: AttentionSpec, context=None, rope=None, kv_mask=None):
        context = x if context is None else context
        b, n, d = x.shape
        q = self.norm_q(self.to_q(x)).reshape(b, n, self.heads, -1)
        k = self.norm_k(self.to_k(context)).reshape(b, context.shape[1], self.heads, -1)
        v = self.to_v(context).reshape(b, context.shape[1], self.heads, -1)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if context is not x:            # the text keys are few: attended whole on each device
            attn = dataclasses.replace(attn, mesh=None, strategy="dense")
        return self.to_out(attn(q, k, v, kv_mask).reshape(b, n, d))


class WanBlock(nnx.Module):
    def __init__(self, cfg: WanConfig, *, rngs):
        d, dt, pdt = cfg.dim, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        self.norm1 = _Norm(d, cfg.eps, False, rngs=rngs, param_dtype=pdt)
        self.attn1 = WanAttention(cfg, rngs=rngs)
        self.norm2 = (_Norm(d, cfg.eps, True, rngs=rngs, param_dtype=pdt)
                      if cfg.cross_attn_norm else None)
        self.attn2 = WanAttention(cfg, rngs=rngs)
        self.norm3 = _Norm(d, cfg.eps, False, rngs=rngs, param_dtype=pdt)
        self.ffn_in = Dense(d, cfg.ffn_dim, axes=("embed", "mlp"), **kw)
        self.ffn_out = Dense(cfg.ffn_dim, d, axes=("mlp", "embed"), **kw)
        self.scale_shift_table = param(rngs, nnx.initializers.normal(d ** -0.5), (1, 6, d),
                                       pdt, (None, None, "embed"))

    def __call__(self, x, text, temb6, rope, attn: AttentionSpec, text_mask=None):
        mods = self.scale_shift_table[...].astype(jnp.float32) + temb6.astype(jnp.float32)
        shift, scale, gate, c_shift, c_scale, c_gate = (mods[:, i][:, None] for i in range(6))
        h = (self.norm1(x) * (1 + scale) + shift).astype(x.dtype)
        x = (x.astype(jnp.float32) + self.attn1(h, attn, rope=rope) * gate).astype(x.dtype)
        h = x if self.norm2 is None else self.norm2(x).astype(x.dtype)
        x = x + self.attn2(h, attn, context=text, kv_mask=text_mask)
        h = (self.norm3(x) * (1 + c_scale) + c_shift).astype(x.dtype)
        ff = self.ffn_out(jax.nn.gelu(self.ffn_in(h), approximate=True))
        return (x.astype(jnp.float32) + ff.astype(jnp.float32) * c_gate).astype(x.dtype)


def wan_rope(cfg: WanConfig, frames: int, rows: int, cols: int):
    """``(cos, sin)`` ``[frames * rows * cols, head_dim / 2]`` of the video tokens, in
    (frame, row, column) order: each axis its own frequencies ``theta ** (-2j / dims)``,
    computed in float64 as diffusers does, then float32."""
    pos = np.stack(np.meshgrid(np.arange(frames), np.arange(rows), np.arange(cols),
                               indexing="ij"), axis=-1).reshape(-1, 3)
    angles = []
    for a, dim in enumerate(cfg.rope_axes):
        inv = 1.0 / np.power(cfg.rope_theta, np.arange(0, dim, 2, dtype=np.float64) / dim)
        angles.append(pos[:, a].astype(np.float64)[:, None] * inv[None])
    ang = np.concatenate(angles, axis=1)
    return (jnp.asarray(np.cos(ang).astype(np.float32)),
            jnp.asarray(np.sin(ang).astype(np.float32)))


class WanTransformer(nnx.Module):
    """The model of the module docstring."""

    def __init__(self, cfg: WanConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg = cfg.validate()
        d, dt, pdt = cfg.dim, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        self.patch_embed = Dense(math.prod(cfg.patch_size) * cfg.in_channels, d,
                                 axes=("patch", "embed"), **kw)
        self.time_1 = Dense(cfg.freq_dim, d, axes=("cond", "embed"), **kw)
        self.time_2 = Dense(d, d, axes=("embed", "cond"), **kw)
        self.time_proj = Dense(d, 6 * d, axes=("cond", "embed"), **kw)
        # the synthetic world's prompt encoder (a tiny video model), else UMT5 states come in
        self.encoder = PromptEncoder(cfg, rngs=rngs) if cfg.text_width else None
        text_in = cfg.text_width or cfg.text_dim
        self.text_1 = Dense(text_in, d, axes=("text", "embed"), **kw)
        self.text_2 = Dense(d, d, axes=("embed", "embed"), **kw)
        self.pool_proj = (Dense(cfg.text_width, d, axes=("text", "embed"), zero=True, **kw)
                          if cfg.pooled == "text_mean" else None)
        # absolute positions: a zero table per axis of the patch grid (pos_embed='learned')
        table = ((lambda n: param(rngs, nnx.initializers.zeros, (n, d), pdt, (None, "embed")))
                 if cfg.pos_embed == "learned" else (lambda n: None))
        gf, gh, gw = cfg.patch_grid
        self.pos_frame, self.pos_row, self.pos_col = table(gf), table(gh), table(gw)
        if cfg.scan_blocks:
            self.blocks = stacked_blocks(lambda r: WanBlock(cfg, rngs=r), cfg.num_layers, rngs)
        else:
            self.blocks = nnx.List([WanBlock(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.norm_out = _Norm(d, cfg.eps, False, rngs=rngs, param_dtype=pdt)
        self.proj_out = Dense(d, cfg.out_channels * math.prod(cfg.patch_size),
                              axes=("embed", "patch"), **kw)
        self.scale_shift_table = param(rngs, nnx.initializers.normal(d ** -0.5), (1, 2, d),
                                       pdt, (None, None, "embed"))

    def _positions(self, gf: int, gh: int, gw: int):
        """``[gf * gh * gw, dim]``: the learned frame, row and column embeddings summed, in the
        tokens' (frame, row, column) order."""
        grid = self.cfg.patch_grid
        if (gf, gh, gw) != grid:
            raise ValueError(f"a latent of {gf} x {gh} x {gw} patches (frames x rows x "
                             f"columns); pos_embed='learned' holds tables for {grid[0]} x "
                             f"{grid[1]} x {grid[2]}: sample the shape the model was built for "
                             "(model.frames, image_size, image_width)")
        pos = (self.pos_frame[...][:, None, None] + self.pos_row[...][None, :, None]
               + self.pos_col[...][None, None, :])
        return pos.reshape(gf * gh * gw, -1)

    def encode(self, tokens, text_mask=None, pooled=None):
        """The prompt's timestep-independent part ``(text states [B, L, dim], pooled
        conditioning [B, dim] or None)``: the projected UMT5 states (or the prompt encoder's
        features of token ids) and, with ``pooled='text_mean'``, the projection of their masked
        mean. A sampler encodes a prompt once per rollout and passes it as ``context``; the
        ``pooled`` argument (the image models' separate pooled input) is unused."""
        dt = as_dtype(self.cfg.dtype)
        cond = None
        if self.encoder is not None:
            mask = (jnp.ones(tokens.shape[:2], bool) if text_mask is None
                    else jnp.asarray(text_mask, bool))
            tokens, mean = self.encoder(tokens, mask)
            if self.pool_proj is not None:
                cond = self.pool_proj(mean.astype(dt))
        text = self.text_2(jax.nn.gelu(self.text_1(tokens.astype(dt)), approximate=True))
        return text, cond

    def __call__(self, x, t, text_embeds, text_mask=None, pooled=None, guidance=None,
                 attn: AttentionSpec | None = None, context=None):
        """``text_embeds``: UMT5 states ``[B, L, text_dim]`` (token ids ``[B, L]`` with a
        prompt encoder); ``context``: ``encode(text_embeds, text_mask)`` computed once by the
        caller (the same result as None). ``pooled`` and ``guidance`` are the image models'
        call's and unused here."""
        cfg = self.cfg
        attn = AttentionSpec() if attn is None else attn
        dt = as_dtype(cfg.dtype)
        if x.ndim != 5:
            raise ValueError(f"the Wan transformer takes video latents [batch, frames, height, "
                             f"width, channels]; got shape {tuple(x.shape)} (an image model's "
                             "latent? use model.family='mmdit' for images)")
        b, f, h, w, c = x.shape
        pt, ph, pw = cfg.patch_size
        if f % pt or h % ph or w % pw:
            raise ValueError(f"a latent of {f} frames x {h} x {w} does not divide into patches "
                             f"of {cfg.patch_size}")
        gf, gh, gw = f // pt, h // ph, w // pw
        patches = x.reshape(b, gf, pt, gh, ph, gw, pw, c).transpose(0, 1, 3, 5, 2, 4, 6, 7)
        tokens = self.patch_embed(patches.reshape(b, gf * gh * gw, pt * ph * pw * c).astype(dt))
        if self.pos_frame is not None:
            tokens = tokens + self._positions(gf, gh, gw).astype(dt)
        attn = attn.resolved(dt, cfg.attention_head_dim)
        freqs = timestep_embedding(t, cfg.freq_dim, rounded_freqs=True)
        temb = self.time_2(jax.nn.silu(self.time_1(freqs.astype(dt))))
        text, cond = self.encode(text_embeds, text_mask) if context is None else context
        if cond is not None:
            temb = temb + cond
        temb6 = self.time_proj(jax.nn.silu(temb)).reshape(b, 6, -1)
        kv_mask = None if text_mask is None else jnp.asarray(text_mask, bool)
        rope = wan_rope(cfg, gf, gh, gw)

        def run_block(block, tokens):
            return block(tokens, text, temb6, rope, attn, kv_mask)

        if cfg.remat:
            run_block = nnx.remat(run_block, policy=REMAT_POLICIES[cfg.remat_policy])
        tokens = run_blocks(self.blocks, run_block, tokens, cfg.scan_blocks)
        mods = self.scale_shift_table[...].astype(jnp.float32) + temb[:, None].astype(
            jnp.float32)
        shift, scale = mods[:, 0][:, None], mods[:, 1][:, None]
        y = self.proj_out((self.norm_out(tokens) * (1 + scale) + shift).astype(dt))
        y = y.reshape(b, gf, gh, gw, pt, ph, pw, cfg.out_channels)
        y = y.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, f, h, w, cfg.out_channels)
        return y.astype(jnp.float32)
