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

Real checkpoints (``spotlight_jax.models.convert``) are configs of the same model, not other
classes: ``pos_embed`` (our computed sin-cos, SD3's stored sin-cos table recomputed and centre
cropped, Qwen-Image's 3-axis RoPE on q/k after QK-norm, or Flux's with its own positions),
``pooled`` (our masked text mean,
SD3's separate pooled embedding through a two-layer SiLU MLP, or none as in Qwen-Image),
``text_norm`` (Qwen-Image's RMSNorm before the text projection), ``use_text_mask`` (SD3 attends
to every text token), ``single_blocks`` (Flux's single-stream blocks after the dual-stream
ones: one set of weights over the joint sequence, attention and MLP in parallel),
``guidance_embed`` (FLUX.1 [dev]'s distilled guidance scale embedded like the timestep and
added to the conditioning), ``context_pre_only_last`` (SD3's last block: the text stream is only
normalised and projected to q/k/v), ``dual_attention_layers`` (SD3.5's image-only second
attention with its own modulation) and the timestep embedding's float32 rounding
(``timestep_scaling``, ``timestep_freqs``). Their defaults are this project's model, parameter
for parameter and bit for bit.

Velocity sign: diffusers' flow-matching models predict ``noise - x0`` for ``x_t = (1 - s) x0 +
s noise`` (their Euler step is ``x + (s_next - s) v``), the same as ours, so a converted model
is used by our samplers unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax import parallel
from spotlight_jax.models.layers import (
    Dense,
    RMSNorm,
    apply_rope,
    layer_norm,
    modulate,
    param,
    rope_angles,
    run_blocks,
    sd3_sincos_crop,
    sincos_1d,
    sincos_2d,
    stacked_blocks,
    timestep_embedding,
)
from spotlight_jax.parallel.kernels import keeps_fused_attention

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
POS_EMBEDS = ("sincos", "sd3_table", "rope3d", "rope3d_flux")
POOLED = ("text_mean", "input", "none")
TIMESTEP_SCALINGS = ("before_freqs", "after_freqs")
TIMESTEP_FREQS = ("jnp", "rounded")


REMAT_POLICIES = {
    "nothing": None,
    "attention": keeps_fused_attention,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots_attention": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable, keeps_fused_attention),
    "dots": jax.checkpoint_policies.checkpoint_dots}


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
    # what a rematerialised block keeps for its backward (REMAT_POLICIES): nothing (recompute
    # the whole block), attention (a fused attention kernel's output and statistics: the rest
    # is recomputed, the kernel is not), dots_no_batch (the projections' and MLPs' matmul
    # outputs; recompute the attention and the elementwise work), dots_attention (both), dots
    # (every matmul output, XLA's attention's too; a fused kernel's output is no matmul)
    remat_policy: str = "nothing"
    scan_blocks: bool = False     # lax.scan over stacked blocks (large depths compile once)
    # Options of converted checkpoints (models.convert); the defaults are this project's model.
    # Position: sincos (computed, added) | sd3_table (SD3's stored table, recomputed and centre
    # cropped: pos_embed_max_size = its grid side, pos_embed_base_size = diffusers' base_size,
    # i.e. sample_size // patch_size, rounded through pos_embed_dtype) | rope3d (Qwen-Image:
    # 3-axis RoPE on q/k, rope_axes split head_dim into (frame, height, width) parts).
    pos_embed: str = "sincos"
    pos_embed_max_size: int = 0
    pos_embed_base_size: int = 0
    pos_embed_dtype: str = "float32"  # sd3_table: the checkpoint stores the table in this dtype
    # | rope3d_flux (Flux: the same rotation, image patches at (0, row, col) from the corner,
    # every text token at (0, 0, 0), angles in float64).
    rope_axes: tuple[int, ...] = (16, 56, 56)
    rope_theta: float = 10_000.0
    # Pooled conditioning added to the time embedding: text_mean (masked mean of the text
    # features) | input (a separate [B, pooled_dim] input through linear-SiLU-linear, SD3) |
    # none (timestep only, Qwen-Image).
    pooled: str = "text_mean"
    pooled_dim: int = 0
    text_norm: bool = False       # RMSNorm on the text embeddings before text_proj (Qwen-Image)
    use_text_mask: bool = True    # False: every text token is attended to (SD3 has no mask)
    context_pre_only_last: bool = False     # SD3: the last block's text is only projected
    dual_attention_layers: tuple[int, ...] = ()   # SD3.5: blocks with a 2nd image attention
    single_blocks: int = 0        # Flux: single-stream blocks after the `depth` dual-stream ones
    guidance_embed: bool = False  # FLUX.1 [dev]: a distilled guidance scale input, embedded
    # The x1000 of the timestep embedding multiplies t (ours, SD3) or the t * freq products
    # (Qwen-Image): the same value, rounded differently in float32. Its frequencies: jnp.exp
    # (ours) or correctly rounded float32 (torch's, for diffusers parity).
    timestep_scaling: str = "before_freqs"
    timestep_freqs: str = "jnp"
    # Image conditioning (editing): the most reference images a call may pass as
    # ``image_latents`` (0 = a text-to-image model). Their latents enter as extra image-stream
    # tokens after the target's, through the same patch embedding, at their own positions
    # (rope3d: reference i at frame i + 1, each grid centred, as Qwen-Image-Edit; sincos: the
    # grid's table plus a learned embedding per reference slot); the velocity is the target's.
    reference_images: int = 0
    # Qwen-Image-Edit-2511's zero_cond_t: the image stream modulates the reference tokens as at
    # t = 0 (a clean image), the target's as at t.
    reference_zero_t: bool = False

    def __post_init__(self):
        # ConfigDicts may hand lists; a frozen config must stay hashable (it is static in jit)
        for name in ("rope_axes", "dual_attention_layers"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """One sample's latent: ``(image_size, image_size, channels)``."""
        return self.image_size, self.image_size, self.channels

    def passes(self, guidance: float) -> int:
        """Forward passes per velocity at guidance scale ``guidance``: 2 with classifier-free
        guidance (conditional and unconditional), 1 without it or for a guidance-distilled
        model (``guidance_embed``), which takes the scale as an input."""
        return 1 if guidance == 1.0 or self.guidance_embed else 2

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
        for name in ("dtype", "param_dtype", "pos_embed_dtype"):
            if isinstance(getattr(self, name), str) and getattr(self, name) not in _DTYPES:
                bad(name, f"choose one of {sorted(_DTYPES)}")
        self._validate_family_options(bad)
        return self

    def _validate_family_options(self, bad) -> None:
        for name, choices in (("pos_embed", POS_EMBEDS), ("pooled", POOLED),
                              ("remat_policy", tuple(REMAT_POLICIES)),
                              ("timestep_scaling", TIMESTEP_SCALINGS),
                              ("timestep_freqs", TIMESTEP_FREQS)):
            if getattr(self, name) not in choices:
                bad(name, f"choose one of {choices}")
        for name in ("pos_embed_max_size", "pos_embed_base_size", "pooled_dim", "single_blocks",
                     "reference_images"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0 (0 = unused)")
        if self.pos_embed == "sd3_table":
            grid = self.image_size // self.patch_size
            if self.pos_embed_max_size < grid:
                bad("pos_embed_max_size", f"must be >= the patch grid {grid} (image_size / "
                                          f"patch_size) with pos_embed='sd3_table' (e.g. "
                                          f"pos_embed_max_size={max(grid, 1)})")
            if self.pos_embed_base_size < 1:
                bad("pos_embed_base_size", "must be >= 1 with pos_embed='sd3_table' (diffusers' "
                                           "sample_size // patch_size, e.g. 64)")
            if self.width % 4:
                bad("width", "must be a multiple of 4 with pos_embed='sd3_table'")
        if not self.rope_theta > 0:
            bad("rope_theta", "must be > 0 (e.g. rope_theta=10000.0)")
        axes = tuple(self.rope_axes)
        if len(axes) != 3 or any(not isinstance(a, int) or a < 2 or a % 2 for a in axes) or (
                self.pos_embed.startswith("rope3d") and sum(axes) != self.head_dim):
            bad("rope_axes", f"must be 3 even sizes (frame, height, width), summing to "
                             f"head_dim={self.head_dim} with pos_embed={self.pos_embed!r} (e.g. "
                             f"rope_axes={_rope_split(self.head_dim)})")
        if self.pooled == "input" and self.pooled_dim < 1:
            bad("pooled_dim", "must be >= 1 with pooled='input' (the pooled text width, "
                              "e.g. pooled_dim=2048)")
        if self.reference_images and self.pos_embed not in ("sincos", "rope3d"):
            bad("reference_images", f"reference images need pos_embed 'rope3d' (Qwen-Image-Edit) "
                                    f"or 'sincos', not {self.pos_embed!r} (reference_images=0)")
        if self.reference_zero_t and not self.reference_images:
            bad("reference_zero_t", "modulates reference tokens: set reference_images >= 1, or "
                                    "reference_zero_t=False")
        if self.reference_zero_t and self.single_blocks:
            bad("reference_zero_t", "is a dual-stream option; single_blocks must be 0")
        layers = tuple(self.dual_attention_layers)
        if any(not isinstance(i, int) or not 0 <= i < self.depth for i in layers) or \
                len(set(layers)) != len(layers):
            bad("dual_attention_layers", f"must be distinct block indices in [0, {self.depth})")
        if self.scan_blocks and (self.context_pre_only_last
                                 or 0 < len(layers) < self.depth):
            bad("scan_blocks", "needs identical blocks; context_pre_only_last or some "
                               "dual_attention_layers make them differ (scan_blocks=False)")


def _rope_split(head_dim: int) -> tuple[int, int, int]:
    """An even (frame, height, width) split of ``head_dim`` in Qwen-Image's 16:56:56 spirit."""
    frame = max(2, (head_dim // 8) // 2 * 2)
    rest = head_dim - frame
    h = rest // 2 // 2 * 2
    return (frame, h, rest - h)


def _divisor_near(n: int, k: int) -> int:
    """The divisor of ``n`` closest to ``k`` (for an error message's example fix)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - k), d))


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """How attention runs: dense on one device, or sequence-parallel over ``mesh[axis]``, with
    the local kernel ``impl`` (``auto``, ``xla``, ``cudnn``: ``parallel.kernels``)."""

    mesh: Any = None
    strategy: str = "dense"
    axis: Any = "sp"
    impl: Any = "auto"

    def resolved(self, dtype, head_dim: int) -> AttentionSpec:
        """This spec with ``impl`` resolved to the kernel that runs ``dtype`` inputs of
        ``head_dim`` on the mesh's devices (a forced ``cudnn`` that cannot run: ValueError)."""
        devices = None if self.mesh is None else self.mesh.devices.flat
        return dataclasses.replace(
            self, impl=parallel.resolve_kernel(self.impl, dtype, head_dim, devices))

    @property
    def text_last(self) -> bool:
        """Whether joint sequences put the text after the image: a kernel that takes key
        lengths (cuDNN) needs the padded text keys last. Attention does not depend on the
        order; the default (text first) keeps XLA's numerics as they were."""
        return isinstance(self.impl, parallel.Kernel) and self.impl.by_lengths

    def __call__(self, q, k, v, kv_mask=None):
        return parallel.attention(q, k, v, mesh=self.mesh, strategy=self.strategy,
                                  axis=self.axis, kv_mask=kv_mask, implementation=self.impl)

    def join(self, txt, img):
        """The joint sequence of a text and an image part, in this spec's order."""
        return jnp.concatenate([img, txt] if self.text_last else [txt, img], axis=1)

    def split(self, joint, text_len: int):
        """``(txt, img)`` parts of a joint sequence made by :meth:`join`."""
        if self.text_last:
            cut = joint.shape[1] - text_len
            return joint[:, cut:], joint[:, :cut]
        return joint[:, :text_len], joint[:, text_len:]


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


class SelfAttention(nnx.Module):
    """Image-only self-attention of SD3.5's dual-attention blocks (``attn2``): its own fused
    ``qkv`` and ``out`` projections (LoRA targets like the joint ones) and QK-norm."""

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs):
        d, dt, pdt = cfg.width, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        self.qkv = Dense(d, 3 * d, axes=("embed", "qkv"), **kw)
        self.out = Dense(d, d, axes=("qkv", "embed"), **kw)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
            self.k_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
        else:
            self.q_norm = self.k_norm = None
        self.heads = cfg.num_heads

    def __call__(self, x, attn: AttentionSpec, rope=None):
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return self.out(attn(q, k, v).reshape(b, n, d))


class ReferenceCond(NamedTuple):
    """The image stream's conditioning when reference tokens are modulated as at t = 0
    (``reference_zero_t``): ``target`` ``[B, width]`` at t, ``reference`` at 0, and
    ``is_reference`` ``[N]`` bool over the image-stream tokens."""

    target: jax.Array
    reference: jax.Array
    is_reference: jax.Array


class StreamParams(nnx.Module):
    """The weights one stream (text or image) owns inside a dual-stream block.

    ``pre_only``: the stream only feeds the joint attention's keys and values (SD3's last text
    stream): a (shift, scale) modulation and ``qkv``, nothing after attention. ``dual``: a
    second, image-only attention (SD3.5) modulated by three more chunks of ``mod``.
    """

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs, pre_only: bool = False,
                 dual: bool = False):
        d, dt, pdt = cfg.width, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        hidden = int(cfg.width * cfg.mlp_ratio)
        self.pre_only, self.dual = pre_only, dual
        self.n_mod = 2 if pre_only else (9 if dual else 6)
        self.mod = Dense(d, self.n_mod * d, axes=("cond", "embed"), zero=True, **kw)
        self.qkv = Dense(d, 3 * d, axes=("embed", "qkv"), **kw)
        if not pre_only:
            self.out = Dense(d, d, axes=("qkv", "embed"), **kw)
            self.fc1 = Dense(d, hidden, axes=("embed", "mlp"), **kw)
            self.fc2 = Dense(hidden, d, axes=("mlp", "embed"), **kw)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
            self.k_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
        else:
            self.q_norm = self.k_norm = None
        if dual:
            self.attn2 = SelfAttention(cfg, rngs=rngs)

    def modulations(self, c):
        """This stream's ``n_mod`` modulation chunks, each ``[B, 1, D]``, or token-wise
        ``[B, N, D]`` for a :class:`ReferenceCond` (reference tokens at t = 0)."""
        if isinstance(c, ReferenceCond):
            now = jnp.split(self.mod(c.target), self.n_mod, axis=-1)
            ref = jnp.split(self.mod(c.reference), self.n_mod, axis=-1)
            pick = c.is_reference[None, :, None]
            return [jnp.where(pick, r[:, None], m[:, None]) for m, r in zip(now, ref)]
        return [m[:, None] for m in jnp.split(self.mod(c), self.n_mod, axis=-1)]

    def pre_attention(self, x, c, heads, rope=None):
        mods = self.modulations(c)
        shift1, scale1 = mods[:2]
        b, n, d = x.shape
        normed = layer_norm(x)
        qkv = self.qkv(modulate(normed, shift1, scale1)).reshape(b, n, 3, heads, d // heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        rest = tuple(mods[2:])
        if self.dual:   # the second attention's input: the same norm, its own shift and scale
            shift3, scale3, gate3 = rest[4:]
            rest = rest[:4] + (modulate(normed, shift3, scale3), gate3)
        return (q, k, v), rest

    def post_attention(self, x, attn, mods, spec: AttentionSpec | None = None, rope=None):
        gate1, shift2, scale2, gate2 = mods[:4]
        x = x + gate1 * self.out(attn)
        if self.dual:
            x2, gate3 = mods[4:]
            x = x + gate3 * self.attn2(x2, spec, rope)
        h = self.fc2(jax.nn.gelu(self.fc1(modulate(layer_norm(x), shift2, scale2))))
        return x + gate2 * h


class MMDiTBlock(nnx.Module):
    """Dual-stream block: separate weights per stream, joint attention over [text; image]."""

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs, index: int = 0):
        pre_only = cfg.context_pre_only_last and index == cfg.depth - 1
        self.txt = StreamParams(cfg, rngs=rngs, pre_only=pre_only)
        self.img = StreamParams(cfg, rngs=rngs, dual=index in cfg.dual_attention_layers)
        self.heads = cfg.num_heads

    def __call__(self, txt, img, c, kv_mask, attn: AttentionSpec, rope=None):
        """``rope``: ``(text (cos, sin), image (cos, sin))`` for rope3d models, else None;
        ``c``: ``[B, width]``, or a :class:`ReferenceCond` for the image stream (the text
        stream takes its ``target``)."""
        trope, irope = rope if rope is not None else (None, None)
        ctxt = c.target if isinstance(c, ReferenceCond) else c
        (tq, tk, tv), tmods = self.txt.pre_attention(txt, ctxt, self.heads, trope)
        (iq, ik, iv), imods = self.img.pre_attention(img, c, self.heads, irope)
        o = attn(attn.join(tq, iq), attn.join(tk, ik), attn.join(tv, iv), kv_mask)
        b, n, h, hd = o.shape
        to, io = attn.split(o.reshape(b, n, h * hd), txt.shape[1])
        # a pre-only text stream ends here: its value is never read again
        txt = txt if self.txt.pre_only else self.txt.post_attention(txt, to, tmods)
        return txt, self.img.post_attention(img, io, imods, attn, irope)


class SingleStreamBlock(nnx.Module):
    """Flux's single-stream block over the joint sequence ``[text; image]``: one (shift, scale,
    gate) modulation, then attention and an MLP in parallel on the same normed input, their
    outputs concatenated into one output projection ``out`` (``[width + hidden, width]``)."""

    def __init__(self, cfg: MMDiTConfig, *, rngs: nnx.Rngs):
        d, dt, pdt = cfg.width, as_dtype(cfg.dtype), as_dtype(cfg.param_dtype)
        kw = dict(rngs=rngs, dtype=dt, param_dtype=pdt)
        hidden = int(cfg.width * cfg.mlp_ratio)
        self.mod = Dense(d, 3 * d, axes=("cond", "embed"), zero=True, **kw)
        self.qkv = Dense(d, 3 * d, axes=("embed", "qkv"), **kw)
        self.fc1 = Dense(d, hidden, axes=("embed", "mlp"), **kw)
        self.out = Dense(d + hidden, d, axes=("mlp", "embed"), zero=True, **kw)
        self.q_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
        self.k_norm = RMSNorm(cfg.head_dim, rngs=rngs, param_dtype=pdt)
        self.heads = cfg.num_heads

    def __call__(self, x, c, kv_mask, attn: AttentionSpec, rope=None):
        """``x``: the joint sequence; ``rope``: its ``(cos, sin)`` or None."""
        shift, scale, gate = jnp.split(self.mod(c), 3, axis=-1)
        b, n, d = x.shape
        normed = modulate(layer_norm(x), shift, scale)
        qkv = self.qkv(normed).reshape(b, n, 3, self.heads, d // self.heads)
        q, k = self.q_norm(qkv[:, :, 0]), self.k_norm(qkv[:, :, 1])
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        o = attn(q, k, qkv[:, :, 2], kv_mask)
        h = jax.nn.gelu(self.fc1(normed))
        return x + gate[:, None] * self.out(jnp.concatenate([o.reshape(b, n, d), h], axis=-1))


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

    Call: ``model(x, t, tokens, text_mask=None, pooled=None, guidance=None,
    attn=AttentionSpec())`` with x ``[B,H,W,C]``, t ``[B]`` in [0, 1] (1 = noise), tokens int
    ``[B, L]`` (or float embeddings ``[B, L, text_embed_dim]`` when the config has no prompt
    encoder), text_mask bool ``[B, L]`` (True = a real token; None = all real), pooled
    ``[B, pooled_dim]`` when ``pooled='input'``, guidance ``[B]`` the distilled guidance scale
    when ``guidance_embed`` (FluxPipeline's ``guidance_scale``, e.g. 3.5). Returns the velocity
    ``noise - x0`` ``[B,H,W,C]`` in float32.
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
        self.text_norm = (RMSNorm(tdim, rngs=rngs, axis_name="cond", param_dtype=pdt)
                          if cfg.text_norm else None)
        self.text_proj = Dense(tdim, d, axes=("cond", "embed"), **kw)
        self.t_fc1 = Dense(256, d, axes=("cond", "embed"), **kw)
        self.t_fc2 = Dense(d, d, axes=("embed", "cond"), **kw)
        if cfg.pooled == "text_mean":
            self.pool_proj = Dense(tdim, d, axes=("cond", "embed"), **kw)
        elif cfg.pooled == "input":
            self.pool_fc1 = Dense(cfg.pooled_dim, d, axes=("cond", "embed"), **kw)
            self.pool_fc2 = Dense(d, d, axes=("embed", "cond"), **kw)
        if cfg.guidance_embed:
            self.g_fc1 = Dense(256, d, axes=("cond", "embed"), **kw)
            self.g_fc2 = Dense(d, d, axes=("embed", "cond"), **kw)
        if cfg.scan_blocks:
            self.blocks = stacked_blocks(lambda r: MMDiTBlock(cfg, rngs=r), cfg.depth, rngs)
        else:
            self.blocks = nnx.List([MMDiTBlock(cfg, rngs=rngs, index=i)
                                    for i in range(cfg.depth)])
        if cfg.single_blocks and cfg.scan_blocks:
            self.single_blocks = stacked_blocks(lambda r: SingleStreamBlock(cfg, rngs=r),
                                          cfg.single_blocks, rngs)
        elif cfg.single_blocks:
            self.single_blocks = nnx.List([SingleStreamBlock(cfg, rngs=rngs)
                                           for _ in range(cfg.single_blocks)])
        if cfg.reference_images and cfg.pos_embed == "sincos":
            self.ref_embed = param(rngs, nnx.initializers.normal(0.02),
                                   (cfg.reference_images, d), pdt, (None, "embed"))
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

    def encode(self, tokens, text_mask=None, pooled=None):
        """The prompt's timestep-independent part: ``(text features [B, L, width], pooled
        conditioning [B, width])`` after their projections. A sampler encodes a prompt once per
        rollout and a trainer once per train step, then passes it as ``context``.
        ``text_mask`` None = every token real; ``pooled`` is the separate pooled embedding of
        ``pooled='input'`` models (SD3), ignored otherwise."""
        cfg = self.cfg
        dt = as_dtype(cfg.dtype)
        if text_mask is None:
            text_mask = jnp.ones(tokens.shape[:2], bool)
        text_mask = text_mask.astype(bool)
        if self.encoder is not None:
            txt, mean = self.encoder(tokens, text_mask)
        else:
            txt = tokens.astype(dt)
            mean = None
            if cfg.pooled == "text_mean":
                m = text_mask[..., None].astype(dt)
                mean = (txt * m).sum(1) / jnp.maximum(m.sum(1), 1)
        if cfg.pooled == "text_mean":
            cond = self.pool_proj(mean)
        elif cfg.pooled == "input":
            if pooled is None:
                raise ValueError(f"pooled=None: this model (pooled='input') needs the pooled "
                                 f"text embedding [batch, {cfg.pooled_dim}] (e.g. SD3's CLIP "
                                 f"pooled output from the prompt-embedding file)")
            cond = self.pool_fc2(jax.nn.silu(self.pool_fc1(pooled.astype(dt))))
        else:
            cond = jnp.zeros((tokens.shape[0], cfg.width), dt)
        if self.text_norm is not None:
            txt = self.text_norm(txt)
        return self.text_proj(txt), cond

    def _positions(self, grids, text_len: int):
        """Position inputs for the image stream's patch grids ``[(gh, gw), ...]`` (the target's,
        then each reference's): the additive table ``[sum gh*gw, width]`` (None for RoPE) and
        the RoPE ``(text (cos, sin), image (cos, sin))`` (rope3d*, else None).

        Qwen-Image's RoPE: grid i's patches at (frame i, row - (gh - gh//2), col - (gw - gw//2))
        (centred; the target is frame 0, reference j frame j + 1, as Qwen-Image-Edit), text
        token k at ``max over grids of max(gh//2, gw//2) + k`` on all three axes. Positions are
        of the whole sequence, so sequence-parallel attention sees the same rotated q/k."""
        cfg = self.cfg
        dt = as_dtype(cfg.dtype)
        if cfg.pos_embed == "sincos":
            return jnp.concatenate([sincos_2d(gh, gw, cfg.width) for gh, gw in grids]
                                   ).astype(dt), None
        if cfg.pos_embed == "rope3d":
            return None, _rope_tables((_qwen_text_positions(grids, text_len),
                                       _qwen_image_positions(grids)), cfg, np.float32)
        (gh, gw), = grids                   # validate(): references only with the two above
        if cfg.pos_embed == "sd3_table":
            table = sd3_sincos_crop(gh, gw, cfg.width, cfg.pos_embed_max_size,
                                    cfg.pos_embed_base_size)
            # diffusers adds the stored table: rounded to its dtype, as the checkpoint has it
            stored = jnp.asarray(table).astype(as_dtype(cfg.pos_embed_dtype))
            return stored.astype(dt), None
        # rope3d_flux: image from the corner, text at the origin
        rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        img_pos = np.stack([np.zeros(gh * gw, np.int64), rows.reshape(-1), cols.reshape(-1)], 1)
        txt_pos = np.zeros((text_len, 3), np.int64)
        return None, _rope_tables((txt_pos, img_pos), cfg, np.float64)

    def _embed_patches(self, x):
        """Tokens ``[B, gh*gw, width]`` of latents ``x`` ``[B, H, W, C]`` (stem, patchify,
        projection: the target's and every reference's the same way)."""
        xin = x.astype(as_dtype(self.cfg.dtype))
        if self.stem is not None:
            xin = jax.nn.gelu(self.stem(xin))
        return self.patch_embed(patchify(xin, self.cfg.patch_size))

    def _references(self, image_latents, x) -> list:
        """``image_latents`` as a list of ``[B, H', W', C]`` arrays, checked against the model
        and the target ``x`` (one-line ValueErrors naming the value and the fix)."""
        cfg = self.cfg
        if image_latents is None:
            if cfg.reference_images:
                raise ValueError(f"image_latents=None: this model edits an input image "
                                 f"(reference_images={cfg.reference_images}); pass its VAE "
                                 f"latents [batch, height, width, {cfg.channels}]")
            return []
        refs = list(image_latents) if isinstance(image_latents, (list, tuple)) else [
            image_latents]
        if not cfg.reference_images:
            raise ValueError("image_latents given to a text-to-image model (reference_images=0);"
                             " convert or configure an editing model, or drop image_latents")
        if not 1 <= len(refs) <= cfg.reference_images:
            raise ValueError(f"{len(refs)} reference images: this model takes 1 to "
                             f"{cfg.reference_images} (reference_images)")
        p = cfg.patch_size
        for i, r in enumerate(refs):
            shape = tuple(r.shape)
            if len(shape) != 4 or shape[0] != x.shape[0] or shape[3] != cfg.channels:
                raise ValueError(f"image_latents[{i}] has shape {shape}; expected [batch="
                                 f"{x.shape[0]}, height, width, channels={cfg.channels}]")
            if shape[1] % p or shape[2] % p:
                raise ValueError(f"image_latents[{i}] is {shape[1]}x{shape[2]} latent cells, "
                                 f"not a multiple of patch_size={p}: resize the input image to "
                                 f"a multiple of {p} x the VAE's downsampling")
        return refs

    def _time_embedding(self, t, guidance):
        cfg = self.cfg
        dt = as_dtype(cfg.dtype)
        temb = self.t_fc2(jax.nn.silu(self.t_fc1(timestep_embedding(
            t, 256, scale_after_freqs=cfg.timestep_scaling == "after_freqs",
            rounded_freqs=cfg.timestep_freqs == "rounded").astype(dt))))
        if cfg.guidance_embed:
            if guidance is None:
                raise ValueError("guidance=None: this model (guidance_embed=True, FLUX.1 [dev]) "
                                 "needs the distilled guidance scale [batch] (e.g. 3.5, "
                                 "sampler.guidance)")
            g = jnp.broadcast_to(jnp.asarray(guidance, jnp.float32), (t.shape[0],))
            temb = temb + self.g_fc2(jax.nn.silu(self.g_fc1(timestep_embedding(
                g, 256, rounded_freqs=cfg.timestep_freqs == "rounded").astype(dt))))
        return temb

    def __call__(self, x, t, tokens, text_mask=None, pooled=None, guidance=None,
                 attn: AttentionSpec = AttentionSpec(), context=None, image_latents=None):
        """``context``: ``encode(tokens, text_mask, pooled)`` computed once by the caller (the
        same result as leaving it None, which encodes here). ``image_latents``: an editing
        model's reference latents ``[B, H', W', C]`` (or a list of up to ``reference_images``
        of them), any size that divides into patches."""
        cfg = self.cfg
        dt = as_dtype(cfg.dtype)
        b, h, w, ch = x.shape
        if text_mask is not None:
            text_mask = text_mask.astype(bool)
        refs = self._references(image_latents, x)
        txt, pooled = self.encode(tokens, text_mask, pooled) if context is None else context
        p = cfg.patch_size
        grids = [(h // p, w // p)] + [(r.shape[1] // p, r.shape[2] // p) for r in refs]
        parts = [self._embed_patches(x)]
        for i, r in enumerate(refs):
            part = self._embed_patches(r)
            if cfg.pos_embed == "sincos":        # RoPE models tell references by their frame
                part = part + self.ref_embed[...][i].astype(dt)
            parts.append(part)
        img = jnp.concatenate(parts, axis=1) if refs else parts[0]
        n_target = grids[0][0] * grids[0][1]
        table, rope = self._positions(grids, txt.shape[1])
        if table is not None:
            img = img + table[None]
        temb = self._time_embedding(t, guidance)
        c = jax.nn.silu(temb + pooled)
        c_img = c
        if refs and cfg.reference_zero_t:
            c_ref = jax.nn.silu(self._time_embedding(jnp.zeros_like(t), guidance) + pooled)
            c_img = ReferenceCond(c, c_ref, jnp.arange(img.shape[1]) >= n_target)
        attn = attn.resolved(dt, cfg.head_dim)
        kv_mask = None
        if text_mask is not None and cfg.use_text_mask:
            kv_mask = attn.join(text_mask, jnp.ones((b, img.shape[1]), bool))

        def run_block(block, txt, img):
            return block(txt, img, c_img, kv_mask, attn, rope)

        if cfg.remat:
            run_block = nnx.remat(run_block, policy=REMAT_POLICIES[cfg.remat_policy])
        txt, img = run_blocks(self.blocks, run_block, (txt, img), cfg.scan_blocks)
        if cfg.single_blocks:       # Flux: one stream over [text; image] from here on
            joint_rope = None if rope is None else tuple(
                attn.join(a[None], b[None])[0] for a, b in zip(*rope))

            def run_single(block, x):
                return block(x, c, kv_mask, attn, joint_rope)

            if cfg.remat:
                run_single = nnx.remat(run_single, policy=REMAT_POLICIES[cfg.remat_policy])
            joint = run_blocks(self.single_blocks, run_single, attn.join(txt, img),
                                cfg.scan_blocks)
            img = attn.split(joint, txt.shape[1])[1]
        img = img[:, :n_target]             # the velocity is the target's
        shift, scale = jnp.split(self.final_mod(c), 2, axis=-1)
        feats = modulate(layer_norm(img), shift, scale)
        out = unpatchify(self.final(feats), p, h, w, ch)
        if self.head is not None:
            out = out + self.head(out)
        if cfg.pixel_head:
            z = unpatchify(self.pixel_feat(feats), p, h, w, cfg.pixel_head)
            z = jnp.concatenate([z, x.astype(dt)], axis=-1)
            conv1, conv2, conv3 = self.pixel_convs
            out = out + conv3(jax.nn.gelu(conv2(jax.nn.gelu(conv1(z)))))
        return out.astype(jnp.float32)


def _qwen_image_positions(grids) -> np.ndarray:
    """``[sum gh*gw, 3]`` (frame, row, col) of Qwen-Image's centred grids, grid i at frame i."""
    out = []
    for i, (gh, gw) in enumerate(grids):
        rows, cols = np.meshgrid(np.arange(gh) - (gh - gh // 2), np.arange(gw) - (gw - gw // 2),
                                 indexing="ij")
        out.append(np.stack([np.full(gh * gw, i), rows.reshape(-1), cols.reshape(-1)], 1))
    return np.concatenate(out).astype(np.int64)


def _qwen_text_positions(grids, text_len: int) -> np.ndarray:
    """``[text_len, 3]``: text token k at ``max(gh//2, gw//2 over the grids) + k`` on every axis."""
    start = max(max(gh // 2, gw // 2) for gh, gw in grids)
    return np.repeat(np.arange(start, start + text_len)[:, None], 3, axis=1)


def _rope_tables(positions, cfg: MMDiTConfig, dtype):
    """``((cos, sin), ...)`` float32 tables of each ``[S, 3]`` position array, the angles
    computed in ``dtype`` (float32 as diffusers does for Qwen-Image, float64 for Flux)."""
    out = []
    for pos in positions:
        ang = rope_angles(pos, cfg.rope_axes, cfg.rope_theta, dtype=dtype)
        out.append((jnp.asarray(np.cos(ang).astype(np.float32)),
                    jnp.asarray(np.sin(ang).astype(np.float32))))
    return tuple(out)


def count_params(state) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(state))
