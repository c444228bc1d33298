"""The FLUX.2 transformer ([dev] and [klein]) in Flax NNX (diffusers' ``Flux2Transformer2DModel``).

``model(x [B, H, W, C], t [B] in [0, 1], text_embeds [B, L, joint_attention_dim], text_mask=None,
pooled=None, guidance=None)`` returns the flow-matching velocity ``noise - x0`` ``[B, H, W, C]``
in float32, the sign diffusers' flow models predict (``x_t = (1 - t) x0 + t noise``).

Latents: ``x`` is unpacked, ``C = in_channels / 4`` (FLUX.2's VAE: 32). The FLUX.2 pipelines
patchify the latent 2x2 into ``in_channels`` (128) channels ordered ``(c, py, px)`` and feed one
token per patch (the transformer's own ``patch_size`` is 1); here the model patchifies in our
``(py, px, c)`` order and the converter (``models.convert.flux2``) permutes ``x_embedder`` and
``proj_out`` to match, so any even ``H x W`` works, odd and non-square patch grids included.
(The pipelines batch-normalise the *packed* latent with the VAE's ``bn`` statistics, one per
packed channel; ``x`` is that normalised latent, unpacked.)

Time and guidance: ``t`` is the flow time sigma (the pipelines pass ``timestep / 1000`` of the
scheduler's ``1000 sigma``); like diffusers, the model embeds ``1000 t`` (sinusoidal,
``timestep_guidance_channels`` wide, ``[cos, sin]``, then linear-SiLU-linear) and, for [dev]
(``guidance_embeds``), adds ``1000 g`` of the distilled guidance scale ``g`` (e.g. 4.0)
embedded the same way by its own MLP. [klein] has no guidance input (its base variants use
classifier-free guidance in the sampler); a given ``guidance`` is ignored there, as diffusers
does. [dev] without ``guidance`` is a ValueError (diffusers would silently drop the term).

Architecture, as diffusers builds it (no bias anywhere): the time embedding ``temb`` drives three
modulations *shared by all blocks*: ``silu(temb)`` through ``mod_img`` / ``mod_txt`` (the
dual-stream blocks' image and text (shift, scale, gate) x (attention, MLP)) and ``mod_single``
(the single-stream blocks' one (shift, scale, gate)). Dual-stream blocks keep per-stream weights
(q/k/v with QK RMSNorm per head, output projection, a SwiGLU MLP ``fc2(silu(a) * b)`` with
``[a; b] = fc1(h)`` and hidden ``mlp_ratio x dim``) and attend jointly over ``[text; image]``;
single-stream blocks run attention and the SwiGLU MLP in parallel on the joint sequence, one
output projection over ``[attention; MLP]`` (diffusers fuses q/k/v and the MLP input into one
``to_qkv_mlp_proj``: split here into ``qkv`` and ``fc1``, the same product). LayerNorms have no
affine (eps ``eps``); the output norm is modulated by ``final_mod(silu(temb))`` = (scale, shift).

Positions: 4-axis RoPE (``axes_dims_rope`` of each head, angles ``pos * theta ** (-2j / d)``
in float64 with ``theta = rope_theta``, rotating interleaved pairs) over (t, h, w, l) ids, as
the pipelines build them for text-to-image: image token (row, col) at ``(0, row, col, 0)``, text
token i at ``(0, 0, 0, i)``. Every text token is attended to (the pipelines pass no mask);
``use_text_mask=True`` makes ``text_mask`` a key mask instead (not diffusers' behaviour).

Attention goes through ``AttentionSpec`` (``parallel.attention``), the joint sequence built by
its ``join`` / ``split``, so the same weights run dense or sequence-parallel (ulysses, ring,
usp) over a mesh. ``remat``, ``remat_policy`` and ``scan_blocks`` are the MMDiT's.
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
    apply_rope,
    layer_norm,
    rope_angles,
    run_blocks,
    stacked_blocks,
    timestep_embedding,
)
from spotlight_jax.models.mmdit import REMAT_POLICIES, AttentionSpec, as_dtype, patchify, unpatchify

PACK = 2            # the pipelines pack 2x2 latent cells into one token


@dataclasses.dataclass(frozen=True)
class Flux2Config:
    """diffusers' ``Flux2Transformer2DModel`` config (its ``config.json`` names; diffusers'
    defaults are FLUX.2 [dev]'s), plus this project's numerics and run fields."""

    in_channels: int = 128          # packed: 4 x the VAE latent's channels
    num_layers: int = 8             # dual-stream blocks
    num_single_layers: int = 48
    attention_head_dim: int = 128
    num_attention_heads: int = 48
    joint_attention_dim: int = 15360    # the text states' width (3 stacked encoder layers)
    timestep_guidance_channels: int = 256
    mlp_ratio: float = 3.0
    axes_dims_rope: tuple[int, ...] = (32, 32, 32, 32)
    rope_theta: float = 2000.0
    eps: float = 1e-6
    guidance_embeds: bool = True    # [dev]: the distilled guidance scale is an input
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False             # jax.checkpoint each block
    remat_policy: str = "nothing"   # what a rematerialised block keeps (mmdit.REMAT_POLICIES)
    scan_blocks: bool = False       # lax.scan over each stack of identical blocks
    use_text_mask: bool = False     # True: text_mask masks keys (diffusers attends to all)
    # What a run chooses (not in config.json): the latent it samples, image_size x
    # (image_width or image_size) unpacked cells (1024 px: 128), and the prompt length.
    image_size: int = 128
    image_width: int = 0            # latent columns when not square; 0 = square
    text_len: int = 512

    def __post_init__(self):
        # ConfigDicts and JSON hand lists; a frozen config must stay hashable (static in jit)
        if isinstance(self.axes_dims_rope, list):
            object.__setattr__(self, "axes_dims_rope", tuple(self.axes_dims_rope))

    @property
    def dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def mlp_hidden(self) -> int:
        return int(self.dim * self.mlp_ratio)

    # The names the rest of the project reads off a model config (``MMDiTConfig``'s).
    @property
    def width(self) -> int:
        return self.dim

    @property
    def depth(self) -> int:
        return self.num_layers

    @property
    def single_blocks(self) -> int:
        return self.num_single_layers

    @property
    def num_heads(self) -> int:
        return self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim

    @property
    def channels(self) -> int:
        """The unpacked latent's channels (FLUX.2's VAE: 32)."""
        return self.in_channels // (PACK * PACK)

    @property
    def patch_size(self) -> int:
        """Latent cells per token side (diffusers' ``patch_size`` is 1 over packed tokens)."""
        return PACK

    @property
    def text_embed_dim(self) -> int:
        return self.joint_attention_dim

    @property
    def guidance_embed(self) -> bool:
        return self.guidance_embeds

    # Fixed for FLUX.2 (class constants, not fields): precomputed text states (no prompt
    # encoder), no pooled text conditioning.
    text_width = 0
    pooled = "none"
    pooled_dim = 0

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """One sample's unpacked latent: ``(image_size, image_width or image_size, channels)``."""
        return self.image_size, self.image_width or self.image_size, self.channels

    @property
    def num_patches(self) -> int:
        """Image tokens of one sample."""
        h, w, _ = self.latent_shape
        return (h // PACK) * (w // PACK)

    def passes(self, guidance: float) -> int:
        """Forward passes per velocity: 1 for [dev] (guidance is an input) or without guidance,
        else 2 (classifier-free guidance, [klein] base)."""
        return 1 if guidance == 1.0 or self.guidance_embeds else 2

    def validate(self) -> Flux2Config:
        """Returns self, or raises a one-line ValueError naming the bad field and a fix."""
        def bad(name, why):
            raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

        for name in ("num_layers", "num_single_layers", "num_attention_heads",
                     "attention_head_dim", "joint_attention_dim", "text_len"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        if self.in_channels < PACK * PACK or self.in_channels % (PACK * PACK):
            bad("in_channels", "must be a positive multiple of 4 (the pipelines pack 2x2 "
                               "latent cells: 4 x the VAE's channels, e.g. 128)")
        if self.attention_head_dim % 2:
            bad("attention_head_dim", "must be even (rotary pairs), e.g. 128")
        axes = self.axes_dims_rope
        if len(axes) != 4 or any(not isinstance(a, int) or a < 2 or a % 2 for a in axes) or \
                sum(axes) != self.attention_head_dim:
            bad("axes_dims_rope", f"must be 4 even sizes (t, h, w, l) summing to "
                                  f"attention_head_dim={self.attention_head_dim} (e.g. "
                                  f"{(self.attention_head_dim // 4,) * 4} when divisible)")
        if self.timestep_guidance_channels < 2 or self.timestep_guidance_channels % 2:
            bad("timestep_guidance_channels", "must be even and >= 2 (e.g. 256)")
        if not self.mlp_ratio > 0 or self.mlp_hidden < 1:
            bad("mlp_ratio", "must be > 0 (e.g. mlp_ratio=3.0)")
        if not self.rope_theta > 0:
            bad("rope_theta", "must be > 0 (e.g. rope_theta=2000)")
        if not self.eps > 0:
            bad("eps", "must be > 0 (e.g. eps=1e-6)")
        if self.image_size < PACK or self.image_size % PACK:
            bad("image_size", "must be a positive even number of latent cells (pixels / 8)")
        if self.image_width < 0 or self.image_width % PACK:
            bad("image_width", "must be 0 (square) or an even number of latent cells")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                bad(name, "use float32, bfloat16 or float16")
        if self.remat_policy not in REMAT_POLICIES:
            bad("remat_policy", f"choose one of {tuple(REMAT_POLICIES)}")
        return self


def _modulated(x, shift, scale, eps, dtype):
    """Affine-free LayerNorm of ``x`` in float32, then ``* (1 + scale) + shift`` (``[B, D]``
    each), cast to the compute dtype."""
    y = layer_norm(x.astype(jnp.float32), eps)
    return (y * (1 + scale[:, None]) + shift[:, None]).astype(dtype)


def _gated(x, gate, y):
    """The residual ``x + gate * y`` in float32, back in ``x``'s dtype."""
    return (x.astype(jnp.float32) + gate[:, None] * y.astype(jnp.float32)).astype(x.dtype)


def _swiglu(h):
    """diffusers' ``Flux2SwiGLU``: ``silu(first half) * second half``."""
    a, b = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(a) * b


def _split_mods(mod, n: int):
    """``n`` chunks ``[B, D]`` of a modulation ``[B, n D]``, in float32."""
    return jnp.split(mod.astype(jnp.float32), n, axis=-1)


class Flux2Stream(nnx.Module):
    """One stream's weights (image or text) in a dual-stream block: fused q/k/v with per-head
    QK RMSNorm, the attention output projection, and the SwiGLU MLP."""

    def __init__(self, cfg: Flux2Config, *, rngs: nnx.Rngs):
        d, h, dt, pdt = cfg.dim, cfg.mlp_hidden, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt, use_bias=False)
        self.qkv = Dense(d, 3 * d, axes=("embed", "qkv"), **kw)
        self.out = Dense(d, d, axes=("qkv", "embed"), **kw)
        self.fc1 = Dense(d, 2 * h, axes=("embed", "mlp"), **kw)
        self.fc2 = Dense(h, d, axes=("mlp", "embed"), **kw)
        self.q_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt, eps=cfg.eps)
        self.k_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt, eps=cfg.eps)
        self.heads, self.eps, self.dtype = cfg.num_heads, cfg.eps, dt

    def pre_attention(self, x, shift, scale, rope):
        b, n, d = x.shape
        qkv = self.qkv(_modulated(x, shift, scale, self.eps, self.dtype))
        qkv = qkv.reshape(b, n, 3, self.heads, d // self.heads)
        q, k, v = self.q_norm(qkv[:, :, 0]), self.k_norm(qkv[:, :, 1]), qkv[:, :, 2]
        return apply_rope(q, *rope), apply_rope(k, *rope), v

    def post_attention(self, x, o, gate1, shift2, scale2, gate2):
        x = _gated(x, gate1, self.out(o))
        h = self.fc2(_swiglu(self.fc1(_modulated(x, shift2, scale2, self.eps, self.dtype))))
        return _gated(x, gate2, h)


class Flux2DoubleBlock(nnx.Module):
    """Dual-stream block: per-stream weights, joint attention over ``[text; image]``, modulated
    by the model's shared ``mod_img`` / ``mod_txt``."""

    def __init__(self, cfg: Flux2Config, *, rngs: nnx.Rngs):
        self.img = Flux2Stream(cfg, rngs=rngs)
        self.txt = Flux2Stream(cfg, rngs=rngs)

    def __call__(self, txt, img, mod_img, mod_txt, rope, kv_mask, attn: AttentionSpec):
        """``mod_*``: 6 chunks (shift, scale, gate) x (attention, MLP); ``rope``: ``(text
        (cos, sin), image (cos, sin))``."""
        i_mods, t_mods = _split_mods(mod_img, 6), _split_mods(mod_txt, 6)
        iq, ik, iv = self.img.pre_attention(img, i_mods[0], i_mods[1], rope[1])
        tq, tk, tv = self.txt.pre_attention(txt, t_mods[0], t_mods[1], rope[0])
        o = attn(attn.join(tq, iq), attn.join(tk, ik), attn.join(tv, iv), kv_mask)
        b, n, h, hd = o.shape
        to, io = attn.split(o.reshape(b, n, h * hd), txt.shape[1])
        return (self.txt.post_attention(txt, to, *t_mods[2:]),
                self.img.post_attention(img, io, *i_mods[2:]))


class Flux2SingleBlock(nnx.Module):
    """Single-stream (parallel) block over the joint sequence: attention and the SwiGLU MLP on
    the same modulated input, one output projection ``out`` over ``[attention; MLP]``."""

    def __init__(self, cfg: Flux2Config, *, rngs: nnx.Rngs):
        d, h, dt, pdt = cfg.dim, cfg.mlp_hidden, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt, use_bias=False)
        self.qkv = Dense(d, 3 * d, axes=("embed", "qkv"), **kw)
        self.fc1 = Dense(d, 2 * h, axes=("embed", "mlp"), **kw)
        self.out = Dense(d + h, d, axes=("mlp", "embed"), **kw)
        self.q_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt, eps=cfg.eps)
        self.k_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt, eps=cfg.eps)
        self.heads, self.eps, self.dtype = cfg.num_heads, cfg.eps, dt

    def __call__(self, x, mod, rope, kv_mask, attn: AttentionSpec):
        """``mod``: (shift, scale, gate); ``rope``: the joint sequence's ``(cos, sin)``."""
        shift, scale, gate = _split_mods(mod, 3)
        b, n, d = x.shape
        h = _modulated(x, shift, scale, self.eps, self.dtype)
        qkv = self.qkv(h).reshape(b, n, 3, self.heads, d // self.heads)
        q = apply_rope(self.q_norm(qkv[:, :, 0]), *rope)
        k = apply_rope(self.k_norm(qkv[:, :, 1]), *rope)
        o = attn(q, k, qkv[:, :, 2], kv_mask).reshape(b, n, d)
        return _gated(x, gate, self.out(jnp.concatenate([o, _swiglu(self.fc1(h))], axis=-1)))


def flux2_rope(cfg: Flux2Config, rows: int, cols: int, text_len: int):
    """``(text (cos, sin), image (cos, sin))``, each ``[tokens, head_dim / 2]`` float32, of the
    pipelines' text-to-image ids: image token (row, col) at (0, row, col, 0) in row-major
    order, text token i at (0, 0, 0, i); angles in float64 as diffusers computes them."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    zeros = np.zeros(rows * cols, np.int64)
    img = np.stack([zeros, r.reshape(-1), c.reshape(-1), zeros], axis=1)
    txt = np.zeros((text_len, 4), np.int64)
    txt[:, 3] = np.arange(text_len)
    out = []
    for pos in (txt, img):
        ang = rope_angles(pos, cfg.axes_dims_rope, cfg.rope_theta, dtype=np.float64)
        out.append((jnp.asarray(np.cos(ang).astype(np.float32)),
                    jnp.asarray(np.sin(ang).astype(np.float32))))
    return tuple(out)


class Flux2Transformer(nnx.Module):
    """The model of the module docstring."""

    def __init__(self, cfg: Flux2Config, *, rngs: nnx.Rngs):
        self.cfg = cfg = cfg.validate()
        d, dt, pdt = cfg.dim, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt, use_bias=False)
        tc = cfg.timestep_guidance_channels
        self.img_in = Dense(cfg.in_channels, d, axes=("patch", "embed"), **kw)
        self.txt_in = Dense(cfg.joint_attention_dim, d, axes=("cond", "embed"), **kw)
        self.time_1 = Dense(tc, d, axes=("cond", "embed"), **kw)
        self.time_2 = Dense(d, d, axes=("embed", "cond"), **kw)
        if cfg.guidance_embeds:
            self.guidance_1 = Dense(tc, d, axes=("cond", "embed"), **kw)
            self.guidance_2 = Dense(d, d, axes=("embed", "cond"), **kw)
        self.mod_img = Dense(d, 6 * d, axes=("cond", "embed"), **kw)
        self.mod_txt = Dense(d, 6 * d, axes=("cond", "embed"), **kw)
        self.mod_single = Dense(d, 3 * d, axes=("cond", "embed"), **kw)
        if cfg.scan_blocks:
            self.blocks = stacked_blocks(lambda r: Flux2DoubleBlock(cfg, rngs=r),
                                         cfg.num_layers, rngs)
            self.single_blocks = stacked_blocks(lambda r: Flux2SingleBlock(cfg, rngs=r),
                                                cfg.num_single_layers, rngs)
        else:
            self.blocks = nnx.List([Flux2DoubleBlock(cfg, rngs=rngs)
                                    for _ in range(cfg.num_layers)])
            self.single_blocks = nnx.List([Flux2SingleBlock(cfg, rngs=rngs)
                                           for _ in range(cfg.num_single_layers)])
        self.final_mod = Dense(d, 2 * d, axes=("cond", "embed"), **kw)    # (scale, shift)
        self.proj_out = Dense(d, cfg.in_channels, axes=("embed", "patch"), **kw)

    def encode(self, tokens, text_mask=None, pooled=None):
        """The prompt's timestep-independent part ``(text states [B, L, dim], None)``: the
        text encoder's states through ``context_embedder``. A sampler encodes a prompt once and
        passes it as ``context``; ``text_mask`` and ``pooled`` are unused (FLUX.2 has no
        pooled conditioning; the mask applies in attention, with ``use_text_mask``)."""
        return self.txt_in(tokens.astype(as_dtype(self.cfg.dtype))), None

    def _time_embedding(self, t, guidance, batch: int):
        cfg = self.cfg
        dt = as_dtype(cfg.dtype)

        def embed(value, fc1, fc2):
            value = jnp.broadcast_to(jnp.asarray(value, jnp.float32), (batch,))
            freqs = timestep_embedding(value, cfg.timestep_guidance_channels,
                                       rounded_freqs=True)
            return fc2(jax.nn.silu(fc1(freqs.astype(dt))))

        temb = embed(t, self.time_1, self.time_2)
        if cfg.guidance_embeds:
            if guidance is None:
                raise ValueError("guidance=None: this model (guidance_embeds=True, FLUX.2 [dev]) "
                                 "needs the distilled guidance scale [batch] (e.g. 4.0, "
                                 "sampler.guidance)")
            temb = temb + embed(guidance, self.guidance_1, self.guidance_2)
        return temb

    def __call__(self, x, t, text_embeds, text_mask=None, pooled=None, guidance=None,
                 attn: AttentionSpec | None = None, context=None):
        """``text_embeds``: the text encoder's stacked states ``[B, L, joint_attention_dim]``;
        ``context``: ``encode(text_embeds)`` computed once by the caller (the same result as
        None). ``pooled`` is the image models' call's and unused; ``guidance`` [dev]'s scale
        ``[B]`` (or a scalar), ignored by [klein]."""
        cfg = self.cfg
        attn = AttentionSpec() if attn is None else attn
        dt = as_dtype(cfg.dtype)
        if x.ndim != 4 or x.shape[-1] != cfg.channels:
            raise ValueError(f"FLUX.2 takes unpacked latents [batch, height, width, "
                             f"{cfg.channels}]; got shape {tuple(x.shape)}")
        b, h, w, c = x.shape
        if h % PACK or w % PACK:
            raise ValueError(f"a latent of {h} x {w} cells does not pack into 2x2 tokens: give "
                             "an even height and width (pixels a multiple of 16)")
        txt, _ = self.encode(text_embeds) if context is None else context
        img = self.img_in(patchify(x.astype(dt), PACK))
        temb = self._time_embedding(t, guidance, b)
        act = jax.nn.silu(temb)
        mod_img, mod_txt, mod_single = self.mod_img(act), self.mod_txt(act), self.mod_single(act)
        attn = attn.resolved(dt, cfg.head_dim)
        kv_mask = None
        if text_mask is not None and cfg.use_text_mask:
            kv_mask = attn.join(jnp.asarray(text_mask, bool), jnp.ones((b, img.shape[1]), bool))
        rope = flux2_rope(cfg, h // PACK, w // PACK, txt.shape[1])

        def run_double(block, txt, img):
            return block(txt, img, mod_img, mod_txt, rope, kv_mask, attn)

        joint_rope = tuple(attn.join(a[None], i[None])[0] for a, i in zip(*rope))

        def run_single(block, x):
            return block(x, mod_single, joint_rope, kv_mask, attn)

        if cfg.remat:
            policy = REMAT_POLICIES[cfg.remat_policy]
            run_double = nnx.remat(run_double, policy=policy)
            run_single = nnx.remat(run_single, policy=policy)
        txt, img = run_blocks(self.blocks, run_double, (txt, img), cfg.scan_blocks)
        joint = run_blocks(self.single_blocks, run_single, attn.join(txt, img), cfg.scan_blocks)
        img = attn.split(joint, txt.shape[1])[1]
        scale, shift = _split_mods(self.final_mod(act), 2)
        out = self.proj_out(_modulated(img, shift, scale, cfg.eps, dt))
        return unpatchify(out, PACK, h, w, c).astype(jnp.float32)
