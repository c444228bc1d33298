"""Z-Image (diffusers' ``ZImageTransformer2DModel``, text-to-image) in Flax NNX.

``model(x [B, H, W, C], t [B], text_embeds [B, L, cap_feat_dim], text_mask=None)`` returns the
velocity ``noise - x0`` ``[B, H, W, C]`` in float32, ``t`` the noise level sigma in [0, 1]
(1 = noise), as every model of this project; ``H`` and ``W`` are any multiples of the patch
(2), square or not.

Conventions, converted here so that samplers need nothing special: Z-Image's transformer is
trained on the reversed clock and the opposite sign. ``ZImagePipeline`` feeds it
``(1000 - 1000 sigma) / 1000 = 1 - sigma`` (0 = noise), which it scales by ``t_scale`` (1000)
before the sinusoidal embedding, and negates its output before the scheduler's Euler step
``x + (sigma_next - sigma) v``: the transformer predicts ``x0 - noise``. So ``t`` enters as
``1 - t`` and the output is negated: the result is our ``noise - x0``.

The architecture, as diffusers builds it (one stream, no cross-attention):

- 2x2 patches ``(row, col, channel)``-flattened through one linear, padded to a multiple of 32
  tokens with a learned ``x_pad_token``; ``noise_refiner`` layers (modulated by the time
  embedding) run on the image tokens alone;
- the caption: its real tokens (``text_mask``; diffusers takes the list of each prompt's real
  tokens), RMSNorm + linear, padded to a multiple of 32 with a learned ``cap_pad_token``;
  ``context_refiner`` layers (unmodulated: timestep-independent, so ``encode`` runs them) on
  the caption alone;
- ``layers``: the main blocks over the joint sequence of image and caption tokens (diffusers
  orders it ``[image; caption]``; here ``AttentionSpec.join`` orders it, which attention does
  not see: positions are RoPE ids, not indices), then the final layer (LayerNorm scaled by
  ``1 + linear(silu(temb))``, linear) on the real image tokens.
- Every block: ``x += tanh(g1) * attention_norm2(attn(attention_norm1(x) * (1 + s1)))``, then
  ``x += tanh(g2) * ffn_norm2(mlp(ffn_norm1(x) * (1 + s2)))`` (RMSNorms; ``(s1, g1, s2, g2)``
  one linear of the time embedding, no shift; unmodulated blocks drop the factors), the MLP
  SwiGLU of ``int(dim / 3 * 8)``, and per-head QK RMSNorm (its eps fixed at 1e-5 by diffusers,
  whatever ``norm_eps``).
- The pad tokens (both kinds) are real keys: only the batch's padding beyond a row's own
  32-multiple is masked, as diffusers masks its padded batch.
- RoPE over (frame, row, col) ids, split ``axes_dims`` (theta 256, angles in float64 then
  float32 as diffusers' tables): caption token ``j`` (pad tokens included) at ``(1 + j, 0,
  0)``; image patch ``(r, c)`` at ``(Lp + 1, r, c)`` with ``Lp`` the row's padded caption
  length (so per row); image pad tokens at ``(0, 0, 0)``. Positions past diffusers' tables
  (``axes_lens``, where diffusers fails) continue the same frequencies.

Batched: each row's caption length comes from its mask (a mask that is not a prefix keeps the
real tokens in order, as diffusers' ``embeds[mask]`` does), so the batch equals diffusers run
on each sample alone. Attention goes through ``AttentionSpec`` (the image refiner and the main
blocks sequence-parallel over a mesh; the short caption refiner attends whole on each device).
``models.convert.z_image`` loads a diffusers folder into it.

Not converted: the omni variant (``siglip_feat_dim``: SigLIP image conditioning and per-token
clean/noisy modulation) and checkpoints with several patch sizes.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.models.layers import (
    Dense,
    RMSNorm,
    layer_norm,
    param,
    rope_angles,
    run_blocks,
    stacked_blocks,
    timestep_embedding,
)
from spotlight_jax.models.mmdit import REMAT_POLICIES, AttentionSpec, as_dtype

SEQ_MULTIPLE = 32        # diffusers' SEQ_MULTI_OF: caption and image runs pad to a multiple
FREQ_DIM = 256           # the sinusoidal timestep embedding's width (fixed in diffusers)
T_HIDDEN = 1024          # the timestep MLP's hidden width (fixed in diffusers)
ADALN_MAX = 256          # the modulation input is min(dim, 256) wide
QK_EPS = 1e-5            # the QK RMSNorm's eps (fixed in diffusers, not norm_eps)


def _round_up(n, m: int = SEQ_MULTIPLE):
    return (n + m - 1) // m * m


@dataclasses.dataclass(frozen=True)
class ZImageConfig:
    """diffusers' ``ZImageTransformer2DModel`` config (its ``config.json`` names)."""

    all_patch_size: tuple[int, ...] = (2,)
    all_f_patch_size: tuple[int, ...] = (1,)
    in_channels: int = 16
    dim: int = 3840
    n_layers: int = 30
    n_refiner_layers: int = 2
    n_heads: int = 30
    n_kv_heads: int = 30          # unused, as in diffusers (k and v have n_heads heads)
    norm_eps: float = 1e-5
    qk_norm: bool = True
    cap_feat_dim: int = 2560
    rope_theta: float = 256.0
    t_scale: float = 1000.0
    axes_dims: tuple[int, ...] = (32, 48, 48)
    axes_lens: tuple[int, ...] = (1024, 512, 512)
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False           # jax.checkpoint each block (its backward recomputes it)
    remat_policy: str = "nothing"   # what a rematerialised block keeps (mmdit.REMAT_POLICIES)
    scan_blocks: bool = False     # lax.scan over each group's stacked blocks
    # What a run chooses (not in diffusers' config.json): the latent it samples (1024 x 1024
    # pixels: 128 x 128 cells) and the prompt length (the pipeline's max_sequence_length).
    image_size: int = 128
    image_width: int = 0          # latent columns when not square; 0 = square
    text_len: int = 512

    def __post_init__(self):
        # ConfigDicts and config.json hand lists; a frozen config must stay hashable (static)
        for name in ("all_patch_size", "all_f_patch_size", "axes_dims", "axes_lens"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def patch_size(self) -> int:
        return self.all_patch_size[0]

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def adaln_dim(self) -> int:
        return min(self.dim, ADALN_MAX)

    @property
    def ffn_dim(self) -> int:
        return int(self.dim / 3 * 8)

    # The names the rest of the project reads off a model config (``MMDiTConfig``'s).
    @property
    def width(self) -> int:
        return self.dim

    @property
    def depth(self) -> int:
        return self.n_layers

    @property
    def num_heads(self) -> int:
        return self.n_heads

    @property
    def channels(self) -> int:
        return self.in_channels

    @property
    def text_embed_dim(self) -> int:
        """Width of the precomputed text states (Qwen3's second-to-last hidden states)."""
        return self.cap_feat_dim

    # Fixed for Z-Image: no prompt encoder of its own, no pooled text, no guidance input, no
    # Flux-style single-stream blocks.
    text_width = 0
    pooled = "none"
    pooled_dim = 0
    guidance_embed = False
    single_blocks = 0

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        return self.image_size, self.image_width or self.image_size, self.in_channels

    @property
    def num_patches(self) -> int:
        h, w, _ = self.latent_shape
        return (h // self.patch_size) * (w // self.patch_size)

    def passes(self, guidance: float) -> int:
        """Forward passes per velocity: 2 with classifier-free guidance, else 1."""
        return 1 if guidance == 1.0 else 2

    def validate(self) -> ZImageConfig:
        if len(self.all_patch_size) != 1 or len(self.all_f_patch_size) != 1:
            raise ValueError(f"all_patch_size={self.all_patch_size!r}, all_f_patch_size="
                             f"{self.all_f_patch_size!r}: one patch size is supported "
                             "(Z-Image: (2,) and (1,))")
        if self.all_f_patch_size[0] != 1 or self.patch_size < 1:
            raise ValueError(f"all_f_patch_size={self.all_f_patch_size!r}: images have one "
                             "frame; use (1,) with a patch size >= 1")
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim}: must divide into n_heads={self.n_heads}")
        if (len(self.axes_dims) != 3 or any(a < 2 or a % 2 for a in self.axes_dims)
                or sum(self.axes_dims) != self.head_dim):
            raise ValueError(f"axes_dims={self.axes_dims!r}: give 3 even RoPE widths (frame, "
                             f"row, column) summing to the head dim {self.head_dim}")
        if len(self.axes_lens) != 3:
            raise ValueError(f"axes_lens={self.axes_lens!r}: give 3 table lengths (frame, row, "
                             "column)")
        p = self.patch_size
        if self.image_size < 1 or self.image_size % p:
            raise ValueError(f"image_size={self.image_size}: must be a positive multiple of the "
                             f"patch's {p} rows (latent rows: pixels / 8)")
        w = self.image_width or self.image_size
        if self.image_width < 0 or w % p:
            raise ValueError(f"image_width={self.image_width}: must be 0 (square) or a positive "
                             f"multiple of the patch's {p} columns (latent columns: pixels / 8)")
        if self.text_len < 1:
            raise ValueError(f"text_len={self.text_len}: must be >= 1 (tokens per prompt)")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"{name}={getattr(self, name)!r}: use float32, bfloat16 or "
                                 "float16")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r}: choose one of "
                             f"{tuple(REMAT_POLICIES)}")
        return self


def _rotate(x, cos, sin):
    """RoPE on interleaved pairs ``(x[2i], x[2i+1])`` of ``x [B, S, H, D]`` (diffusers'
    complex product), in float32; ``cos``/``sin`` ``[S, D/2]`` or per row ``[B, S, D/2]``."""
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    x32 = x.astype(jnp.float32)
    re, im = x32[..., 0::2], x32[..., 1::2]
    out = jnp.stack([re * c - im * s, re * s + im * c], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)


def _cos_sin(positions: np.ndarray, axes, theta: float):
    """Host ``(cos, sin)`` float32 of integer ``positions [S, len(axes)]``: angles in float64,
    rounded to float32 (diffusers' tables), then their cosine and sine."""
    ang = rope_angles(positions, axes, theta, dtype=np.float64).astype(np.float32)
    ang = ang.astype(np.float64)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


class ZImageBlock(nnx.Module):
    """One Z-Image block: self-attention and a SwiGLU MLP, each sandwiched between RMSNorms
    and, when ``modulated``, scaled and tanh-gated by the time embedding."""

    def __init__(self, cfg: ZImageConfig, *, modulated: bool, rngs: nnx.Rngs):
        d, dt, pdt = cfg.dim, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt, use_bias=False)
        self.to_q = Dense(d, d, axes=("embed", "qkv"), **kw)
        self.to_k = Dense(d, d, axes=("embed", "qkv"), **kw)
        self.to_v = Dense(d, d, axes=("embed", "qkv"), **kw)
        self.to_out = Dense(d, d, axes=("qkv", "embed"), **kw)
        hd = cfg.head_dim
        self.norm_q = (RMSNorm(hd, rngs=rngs, param_dtype=pdt, eps=QK_EPS)
                       if cfg.qk_norm else None)
        self.norm_k = (RMSNorm(hd, rngs=rngs, param_dtype=pdt, eps=QK_EPS)
                       if cfg.qk_norm else None)
        self.w1 = Dense(d, cfg.ffn_dim, axes=("embed", "mlp"), **kw)
        self.w3 = Dense(d, cfg.ffn_dim, axes=("embed", "mlp"), **kw)
        self.w2 = Dense(cfg.ffn_dim, d, axes=("mlp", "embed"), **kw)
        norm = dict(rngs=rngs, axis_name="embed", param_dtype=pdt, eps=cfg.norm_eps)
        self.attention_norm1 = RMSNorm(d, **norm)
        self.attention_norm2 = RMSNorm(d, **norm)
        self.ffn_norm1 = RMSNorm(d, **norm)
        self.ffn_norm2 = RMSNorm(d, **norm)
        self.mod = (Dense(cfg.adaln_dim, 4 * d, axes=("cond", "embed"), rngs=rngs, dtype=dt,
                          param_dtype=pdt) if modulated else None)
        self.heads = cfg.n_heads

    def attend(self, x, rope, kv_mask, attn: AttentionSpec):
        b, n, d = x.shape
        q = self.to_q(x).reshape(b, n, self.heads, -1)
        k = self.to_k(x).reshape(b, n, self.heads, -1)
        v = self.to_v(x).reshape(b, n, self.heads, -1)
        if self.norm_q is not None:
            q, k = self.norm_q(q), self.norm_k(k)
        q, k = _rotate(q, *rope), _rotate(k, *rope)
        return self.to_out(attn(q, k, v, kv_mask).reshape(b, n, d))

    def __call__(self, x, rope, kv_mask, attn: AttentionSpec, temb=None):
        """``x [B, S, dim]``; ``rope`` its ``(cos, sin)``; ``kv_mask`` bool ``[B, S]`` or None;
        ``temb [B, adaln_dim]`` for a modulated block."""
        dt = x.dtype
        if self.mod is None:
            a = self.attention_norm2(self.attend(self.attention_norm1(x), rope, kv_mask, attn))
            x = x + a
            h = self.ffn_norm1(x)
            return x + self.ffn_norm2(self.w2(jax.nn.silu(self.w1(h)) * self.w3(h)))
        mods = self.mod(temb).astype(jnp.float32)[:, None]
        scale_a, gate_a, scale_f, gate_f = jnp.split(mods, 4, axis=-1)
        h = (self.attention_norm1(x).astype(jnp.float32) * (1 + scale_a)).astype(dt)
        a = self.attention_norm2(self.attend(h, rope, kv_mask, attn))
        x = (x.astype(jnp.float32) + jnp.tanh(gate_a) * a.astype(jnp.float32)).astype(dt)
        h = (self.ffn_norm1(x).astype(jnp.float32) * (1 + scale_f)).astype(dt)
        f = self.ffn_norm2(self.w2(jax.nn.silu(self.w1(h)) * self.w3(h)))
        return (x.astype(jnp.float32) + jnp.tanh(gate_f) * f.astype(jnp.float32)).astype(dt)


class ZImageTransformer(nnx.Module):
    """The model of the module docstring."""

    def __init__(self, cfg: ZImageConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg = cfg.validate()
        d, dt, pdt = cfg.dim, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        p = cfg.patch_size
        self.x_embed = Dense(p * p * cfg.in_channels, d, axes=("patch", "embed"), **kw)
        self.x_pad_token = param(rngs, nnx.initializers.normal(1.0), (1, d), pdt,
                                 (None, "embed"))
        self.cap_norm = RMSNorm(cfg.cap_feat_dim, rngs=rngs, axis_name="cond", param_dtype=pdt,
                                eps=cfg.norm_eps)
        self.cap_proj = Dense(cfg.cap_feat_dim, d, axes=("cond", "embed"), **kw)
        self.cap_pad_token = param(rngs, nnx.initializers.normal(1.0), (1, d), pdt,
                                   (None, "embed"))
        self.t_fc1 = Dense(FREQ_DIM, T_HIDDEN, axes=("cond", "mlp"), **kw)
        self.t_fc2 = Dense(T_HIDDEN, cfg.adaln_dim, axes=("mlp", "cond"), **kw)

        def group(n, modulated):
            if cfg.scan_blocks:
                return stacked_blocks(lambda r: ZImageBlock(cfg, modulated=modulated, rngs=r),
                                      n, rngs)
            return nnx.List([ZImageBlock(cfg, modulated=modulated, rngs=rngs)
                             for _ in range(n)])

        self.noise_refiner = group(cfg.n_refiner_layers, True)
        self.context_refiner = group(cfg.n_refiner_layers, False)
        self.layers = group(cfg.n_layers, True)
        self.final_mod = Dense(cfg.adaln_dim, d, axes=("cond", "embed"), **kw)
        self.final = Dense(d, p * p * cfg.in_channels, axes=("embed", "patch"), **kw)

    def _run(self, blocks, x, rope, kv_mask, attn, temb=None):
        cfg = self.cfg

        def run_block(block, x):
            return block(x, rope, kv_mask, attn, temb)

        if cfg.remat:
            run_block = nnx.remat(run_block, policy=REMAT_POLICIES[cfg.remat_policy])
        return run_blocks(blocks, run_block, x, cfg.scan_blocks)

    def _caption(self, text_len: int, text_mask):
        """``(real tokens [B], padded caption lengths [B], caption length with padding)`` of a
        ``text_len``-token batch (its mask None: every token real)."""
        lc = _round_up(text_len)
        if text_mask is None:
            full = jnp.full((1,), text_len, jnp.int32)
            return full, jnp.full((1,), lc, jnp.int32), lc
        real = jnp.sum(jnp.asarray(text_mask, bool), axis=1, dtype=jnp.int32)
        return real, _round_up(real), lc

    def encode(self, text_embeds, text_mask=None, pooled=None, attn: AttentionSpec | None = None):
        """The prompt's timestep-independent part ``(caption states [B, Lc, dim], None)``
        (``Lc``: ``L`` rounded up to 32): each row's real tokens first, in order, projected,
        then its learned pad tokens, through the context refiner. A sampler encodes a prompt
        once per rollout and passes it as ``context`` with the same ``text_mask``; ``pooled``
        is unused (no pooled text conditioning)."""
        cfg = self.cfg
        dt = as_dtype(cfg.dtype)
        b, length, _ = text_embeds.shape
        real, padded, lc = self._caption(length, text_mask)
        feats = text_embeds.astype(dt)
        if text_mask is not None:       # real tokens first, in order (diffusers' embeds[mask])
            order = jnp.argsort(~jnp.asarray(text_mask, bool), axis=1, stable=True)
            feats = jnp.take_along_axis(feats, order[..., None], axis=1)
        feats = jnp.pad(feats, ((0, 0), (0, lc - length), (0, 0)))
        cap = self.cap_proj(self.cap_norm(feats))
        j = jnp.arange(lc)
        cap = jnp.where((j[None, :] < real[:, None])[..., None], cap,
                        self.cap_pad_token[...].astype(dt))
        kv_mask = None if text_mask is None else j[None, :] < padded[:, None]
        rope = self._caption_rope(lc)
        # the caption is short: attended whole on each device (with the caller's kernel)
        local = dataclasses.replace(AttentionSpec() if attn is None else attn, mesh=None,
                                    strategy="dense").resolved(dt, cfg.head_dim)
        return self._run(self.context_refiner, cap, rope, kv_mask, local), None

    def _caption_rope(self, lc: int):
        pos = np.zeros((lc, 3), np.int64)
        pos[:, 0] = 1 + np.arange(lc)
        return tuple(jnp.asarray(a) for a in _cos_sin(pos, self.cfg.axes_dims,
                                                      self.cfg.rope_theta))

    def _image_rope(self, gh: int, gw: int, n_pad: int, padded_caption, lc: int):
        """Per-row ``(cos, sin)`` ``[B, gh * gw + n_pad, head_dim / 2]`` of the image tokens:
        patch ``(r, c)`` at ``(Lp + 1, r, c)`` (``Lp`` its row's padded caption length), the
        pad tokens at the origin."""
        cfg = self.cfg
        d0 = cfg.axes_dims[0]
        n = gh * gw
        rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        pos = np.zeros((n + n_pad, 3), np.int64)
        pos[:n, 1], pos[:n, 2] = rows.reshape(-1), cols.reshape(-1)
        cos_rc, sin_rc = _cos_sin(pos[:, 1:], cfg.axes_dims[1:], cfg.rope_theta)
        # the frame axis: a table over every position a row can take, gathered per row
        frames = np.arange(lc + 2)[:, None]
        cos_f, sin_f = _cos_sin(frames, (d0,), cfg.rope_theta)
        index = jnp.where(jnp.arange(n + n_pad)[None, :] < n, padded_caption[:, None] + 1, 0)
        b = index.shape[0]
        out = []
        for table, rest in ((cos_f, cos_rc), (sin_f, sin_rc)):
            frame = jnp.take(jnp.asarray(table), index, axis=0)
            rest = jnp.broadcast_to(jnp.asarray(rest)[None], (b,) + rest.shape)
            out.append(jnp.concatenate([frame, rest], axis=-1))
        return tuple(out)

    def __call__(self, x, t, text_embeds, text_mask=None, pooled=None, guidance=None,
                 attn: AttentionSpec | None = None, context=None):
        """``text_embeds``: the prompt's text states ``[B, L, cap_feat_dim]``; ``text_mask``
        bool ``[B, L]`` (True = a real token; None = all real); ``context``:
        ``encode(text_embeds, text_mask)`` computed once by the caller (the same result as
        None). ``pooled`` and ``guidance`` are the other models' call's and unused here."""
        cfg = self.cfg
        attn = AttentionSpec() if attn is None else attn
        dt = as_dtype(cfg.dtype)
        if x.ndim != 4:
            raise ValueError(f"the Z-Image transformer takes image latents [batch, height, "
                             f"width, channels]; got shape {tuple(x.shape)}")
        b, h, w, c = x.shape
        p = cfg.patch_size
        if h % p or w % p or c != cfg.in_channels:
            raise ValueError(f"a latent of {h} x {w} x {c} does not divide into {p} x {p} "
                             f"patches of in_channels={cfg.in_channels}")
        gh, gw = h // p, w // p
        n = gh * gw
        n_pad = _round_up(n) - n
        patches = x.reshape(b, gh, p, gw, p, c).transpose(0, 1, 3, 2, 4, 5)
        img = self.x_embed(patches.reshape(b, n, p * p * c).astype(dt))
        img = jnp.concatenate(
            [img, jnp.broadcast_to(self.x_pad_token[...].astype(dt), (b, n_pad, cfg.dim))], 1)
        # diffusers' clock runs the other way: its timestep is 1 - sigma (scaled by t_scale)
        t = jnp.broadcast_to(jnp.asarray(t, jnp.float32), (b,))
        freqs = timestep_embedding(1.0 - t, FREQ_DIM, scale=cfg.t_scale, rounded_freqs=True)
        temb = self.t_fc2(jax.nn.silu(self.t_fc1(freqs.astype(dt))))
        attn = attn.resolved(dt, cfg.head_dim)

        length = text_embeds.shape[1]
        _, padded, lc = self._caption(length, text_mask)
        padded = jnp.broadcast_to(padded, (b,))
        img_rope = self._image_rope(gh, gw, n_pad, padded, lc)
        img = self._run(self.noise_refiner, img, img_rope, None, attn, temb)
        cap, _ = self.encode(text_embeds, text_mask, attn=attn) if context is None else context

        cap_rope = tuple(jnp.broadcast_to(a[None], (b,) + a.shape)
                         for a in self._caption_rope(lc))
        rope = tuple(attn.join(a, i) for a, i in zip(cap_rope, img_rope))
        kv_mask = None
        if text_mask is not None:
            cap_valid = jnp.arange(lc)[None, :] < padded[:, None]
            kv_mask = attn.join(cap_valid, jnp.ones((b, n + n_pad), bool))
        joint = self._run(self.layers, attn.join(cap.astype(dt), img), rope, kv_mask, attn,
                          temb)
        img = attn.split(joint, lc)[1][:, :n]

        scale = 1 + self.final_mod(jax.nn.silu(temb)).astype(jnp.float32)[:, None]
        y = self.final((layer_norm(img, 1e-6).astype(jnp.float32) * scale).astype(dt))
        y = y.reshape(b, gh, gw, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        return -y.astype(jnp.float32)         # Z-Image predicts x0 - noise: ours is noise - x0
