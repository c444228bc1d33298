"""FLOP and parameter counts of the MMDiT, from its config alone (no model is built).

The profile cost model (``cost_models.ProfileCost``) turns these counts into seconds on a named
accelerator, so a run on a tiny CPU model is timed as the paper-scale model would be.

FLOP count of one MMDiT forward (per sample; matmuls only, 2 FLOPs per multiply-add -- the
MFU convention, elementwise ops are not counted). With D = width, H = int(D * mlp_ratio),
L = text_len, N = (image_size / patch)^2 image tokens, S = L + N, p = patch, C = channels,
T = text width fed to the MMDiT (text_width, or text_embed_dim without a prompt encoder):

    per block     = 2 S D (4D + 2H)        qkv (3D^2) + out (D^2) + fc1/fc2 (2DH), per token of
                                           its stream (text and image streams have own weights)
                  + 4 S^2 D                joint attention: Q K^T and A V
                  + 2 * 2 D (6D)           adaLN-Zero modulation of both streams (per sample)
    outside       = 2 N (p^2 C_in) D       patch embedding (C_in = conv_stem or C)
                  + 2 L T D + 2 T D        text projection, pooled-text projection (SD3's
                                           pooled input: 2 P D + 2 D^2; none: 0)
                  + 2 (256 D + D^2)        timestep MLP
                  + 2 D (2D) + 2 N D p^2 C final adaLN and projection
                  + 2 (h w) 9 C c_stem     optional 3x3 conv stem / head on the h x w image
                  + 2 (h w) 9 C C
    single block  = 2 S D (4D + 2H)        Flux: qkv (3D^2), MLP in (DH), out ((D + H) D) over
                  + 4 S^2 D                the joint sequence, one set of weights
                  + 2 D (3D)               its (shift, scale, gate) modulation
    prompt enc.   = per layer 2 L Tw (12 Tw) + 4 L^2 Tw   (only with a synthetic prompt encoder)
    forward       = depth * per block + single_blocks * single block + outside + prompt encoder
                    (+ 2 (256 D + D^2) for FLUX.1 [dev]'s guidance MLP)

An editing model (``reference_images`` R > 0) counts every reference slot at the target's size,
the most a call may pass: the image stream holds N (1 + R) tokens (S = L + N (1 + R)) through
the patch embedding and every block; the final layer sees the target's N. With
``reference_zero_t`` the timestep MLP runs twice (t and 0) and each block's image modulation
twice (+ 2 D (6D) per block).

The Wan transformer (video; ``WanConfig``), with N = video tokens (frames / p_t x rows / p_h x
columns / p_w), P = p_t p_h p_w, F = ffn_dim, T = text width fed to it (text_width, or UMT5's
text_dim), L = text_len:

    per block     = 2 N D (6D) + 4 L D^2       self-attention q, k, v, out; cross-attention q,
                                               out over the video, k, v over the text
                  + 4 N D F                    MLP
                  + 4 N^2 D + 4 N L D          self- and cross-attention
    outside       = 2 N (P C) D + 2 N D (P C)  patch embedding, output projection
                  + 2 (freq D + D^2) + 12 D^2  time embedding and its 6-way projection
                  + 2 L T D + 2 L D^2          text projection (linear, GELU, linear)

It is tested against the dot_general FLOPs of the real model's jaxpr
(tests/emulation/test_clock_cost.py, tests/emulation/test_flops_wan.py).

Z-Image and FLUX.2 (``ZImageConfig``, ``Flux2Config``) have no closed form here: their counts
are read off the model itself (:func:`traced_counts`: the parameters of the abstract model, the
dot_general FLOPs of its forward's jaxpr for one sample, attention being the dots with batch
dimensions), checked against torch's FLOP counter over diffusers' model on the meta device
(tests/test_configs.py).

A video clip's VAE decode (``vae_decode_flops``) is counted from the jaxpr of this project's
own decoder traced on abstract parameters (its first frame and causal chunks make a closed
form long): the convolutions' and matmuls' FLOPs (``jaxpr_flops``), checked against XLA's own
count of the compiled decode (tests/emulation/test_vae_flops.py).
"""
from __future__ import annotations

import dataclasses
import functools
import math

from spotlight_jax.models.flux2_transformer import Flux2Config
from spotlight_jax.models.mmdit import MMDiTConfig
from spotlight_jax.models.wan_transformer import WanConfig
from spotlight_jax.models.z_image_transformer import ZImageConfig

TRACED = (ZImageConfig, Flux2Config)    # families counted from their traced model


def _prompt_encoder(cfg, text_tokens: int) -> int:
    """Matmul FLOPs of a synthetic prompt encoder (0 without one)."""
    if not cfg.text_width:
        return 0
    tw, lt = cfg.text_width, text_tokens
    return cfg.text_layers * (2 * lt * tw * 12 * tw + 4 * lt * lt * tw)


def wan_flops_breakdown(cfg: WanConfig, text_tokens: int | None = None) -> dict[str, int]:
    """:func:`flops_breakdown` of the Wan transformer (its formula in the module docstring)."""
    d, f, n = cfg.dim, cfg.ffn_dim, cfg.num_patches
    lt = cfg.text_len if text_tokens is None else text_tokens
    patch = math.prod(cfg.patch_size)
    tdim = cfg.text_width or cfg.text_dim
    blocks = cfg.num_layers
    return {
        "block_linear": blocks * (2 * n * d * 6 * d + 4 * lt * d * d + 4 * n * d * f),
        "block_attention": blocks * (4 * n * n * d + 4 * n * lt * d),
        "block_adaln": 0,
        "embed": (2 * n * patch * cfg.in_channels * d + 2 * (cfg.freq_dim * d + d * d)
                  + 2 * d * 6 * d + 2 * lt * tdim * d + 2 * lt * d * d),
        "final": 2 * n * d * patch * cfg.out_channels,
        "conv": 0,
        "prompt_encoder": _prompt_encoder(cfg, lt),
    }


def flops_breakdown(cfg: MMDiTConfig, text_tokens: int | None = None) -> dict[str, int]:
    """Matmul FLOPs of one forward of one sample, by part (formula in the module docstring)."""
    if isinstance(cfg, WanConfig):
        return wan_flops_breakdown(cfg, text_tokens)
    if isinstance(cfg, TRACED):
        return dict(traced_counts(cfg, cfg.text_len if text_tokens is None else text_tokens)[0])
    d, p, c = cfg.width, cfg.patch_size, cfg.channels
    h = int(cfg.width * cfg.mlp_ratio)
    n = cfg.num_patches
    images = 1 + cfg.reference_images           # the target and each reference slot
    lt = cfg.text_len if text_tokens is None else text_tokens
    s = lt + n * images
    tdim = cfg.text_width or cfg.text_embed_dim
    pixels = cfg.image_size * cfg.image_size
    blocks = cfg.depth + cfg.single_blocks      # a single block's matmuls equal a dual one's
    zero_t = 2 if cfg.reference_zero_t else 1   # the time embedding at t and at 0
    out = {
        "block_linear": blocks * 2 * s * d * (4 * d + 2 * h),
        "block_attention": blocks * 4 * s * s * d,
        "block_adaln": (cfg.depth * (1 + zero_t) * 2 * d * 6 * d
                        + cfg.single_blocks * 2 * d * 3 * d),
        "embed": (2 * n * images * p * p * (cfg.conv_stem or c) * d + 2 * lt * tdim * d
                  + _pooled_flops(cfg, tdim)
                  + 2 * (256 * d + d * d) * (2 if cfg.guidance_embed else 1) * zero_t),
        "final": 2 * d * 2 * d + 2 * n * d * p * p * c,
        "conv": (2 * pixels * images * 9 * c * cfg.conv_stem if cfg.conv_stem else 0)
                + (2 * pixels * 9 * c * c if cfg.conv_head else 0),
        "prompt_encoder": 0,
    }
    out["prompt_encoder"] = _prompt_encoder(cfg, lt)
    return out


def _pooled_flops(cfg: MMDiTConfig, tdim: int) -> int:
    """The pooled conditioning's projection: of the text mean (ours), of SD3's pooled input
    (linear-SiLU-linear), none for timestep-only models (Qwen-Image)."""
    d = cfg.width
    return {"text_mean": 2 * tdim * d, "input": 2 * cfg.pooled_dim * d + 2 * d * d,
            "none": 0}[cfg.pooled]


def forward_flops(cfg: MMDiTConfig, batch: int = 1, text_tokens: int | None = None) -> int:
    """Matmul FLOPs of one MMDiT forward over ``batch`` samples (see the module docstring)."""
    return batch * sum(flops_breakdown(cfg, text_tokens).values())


def param_count(cfg: MMDiTConfig) -> int:
    """Exact parameter count of ``MMDiT(cfg)`` (weights, biases, QK-norm scales), or of the
    Wan transformer (:func:`wan_param_count`)."""
    if isinstance(cfg, WanConfig):
        return wan_param_count(cfg)
    if isinstance(cfg, TRACED):
        return traced_counts(cfg, cfg.text_len)[1]
    d, p, c = cfg.width, cfg.patch_size, cfg.channels
    h = int(cfg.width * cfg.mlp_ratio)
    tdim = cfg.text_width or cfg.text_embed_dim

    def dense(i, o):
        return i * o + o

    stream = (dense(d, 6 * d) + dense(d, 3 * d) + dense(d, d) + dense(d, h) + dense(h, d)
              + (2 * cfg.head_dim if cfg.qk_norm else 0))
    total = cfg.depth * 2 * stream
    total += cfg.single_blocks * (2 * dense(d, 3 * d) + dense(d, h) + dense(d + h, d)
                                  + 2 * cfg.head_dim)
    if cfg.guidance_embed:
        total += dense(256, d) + dense(d, d)
    total += dense(p * p * (cfg.conv_stem or c), d) + dense(tdim, d) + dense(256, d)
    total += dense(d, d) + dense(d, 2 * d) + dense(d, p * p * c)
    total += {"text_mean": dense(tdim, d), "input": dense(cfg.pooled_dim, d) + dense(d, d),
              "none": 0}[cfg.pooled]
    if cfg.text_norm:
        total += tdim
    if cfg.conv_stem:
        total += 9 * c * cfg.conv_stem + cfg.conv_stem
    if cfg.conv_head:
        total += 9 * c * c + c
    if cfg.reference_images and cfg.pos_embed == "sincos":
        total += cfg.reference_images * d          # the reference slots' embeddings
    if cfg.text_width:
        tw = cfg.text_width
        total += cfg.vocab_size * tw + cfg.text_layers * (dense(tw, 3 * tw) + dense(tw, tw)
                                                          + dense(tw, 4 * tw) + dense(4 * tw, tw))
    return total


def wan_param_count(cfg: WanConfig) -> int:
    """Exact parameter count of the Wan transformer: per block four attention projections
    and a QK RMSNorm scale pair for each of its two attentions, the cross-attention's affine
    norm, the MLP and the modulation table; around them the patch embedding, the time MLP and
    its 6-way projection, the text projection, the output projection and table, and the
    synthetic prompt encoder when there is one."""
    d, f = cfg.dim, cfg.ffn_dim
    patch = math.prod(cfg.patch_size)

    def dense(i, o):
        return i * o + o

    attn = 4 * dense(d, d) + 2 * d
    block = 2 * attn + (2 * d if cfg.cross_attn_norm else 0) + dense(d, f) + dense(f, d) + 6 * d
    total = cfg.num_layers * block
    total += dense(patch * cfg.in_channels, d) + dense(cfg.freq_dim, d) + dense(d, d)
    total += dense(d, 6 * d) + dense(cfg.text_width or cfg.text_dim, d) + dense(d, d)
    total += dense(d, patch * cfg.out_channels) + 2 * d
    if cfg.text_width:
        tw = cfg.text_width
        total += cfg.vocab_size * tw + cfg.text_layers * (dense(tw, 3 * tw) + dense(tw, tw)
                                                          + dense(tw, 4 * tw) + dense(4 * tw, tw))
    return total


def lora_param_count(cfg: MMDiTConfig, rank: int) -> int:
    """LoRA factors on the qkv and out kernels of both streams of every block and of every
    single-stream block (rl/lora.py); the Wan transformer's: on the q, k, v and out kernels of
    both its attentions."""
    if isinstance(cfg, WanConfig):
        return cfg.num_layers * 8 * rank * 2 * cfg.dim
    if isinstance(cfg, TRACED):
        return traced_counts(cfg, cfg.text_len, rank)[2]
    d, h = cfg.width, int(cfg.width * cfg.mlp_ratio)
    per_stream = rank * (d + 3 * d) + rank * (d + d)
    single = rank * (d + 3 * d) + rank * (d + h + d)
    return cfg.depth * 2 * per_stream + cfg.single_blocks * single


def remat_recompute_fraction(cfg: MMDiTConfig, fused_attention: bool | None = None) -> float:
    """The share of a forward the backward recomputes under the model's remat policy
    (``models.mmdit.REMAT_POLICIES``): none without remat; all of it when nothing is kept; all
    but the attention when a fused kernel's outputs are kept (``attention``); the attention
    when the other matmul outputs are kept (``dots_no_batch``: its matmuls have batch
    dimensions; ``dots``, unless the attention is XLA's, whose matmuls it keeps); none when
    both are (``dots_attention``). A fused kernel's output is no matmul, so only the
    ``*attention`` policies keep it: ``fused_attention`` (None: whether ``auto`` runs one for the
    model's dtype and head dim on a GPU, what the priced devices run). ``bench.gpu_lowering``'s
    census of the lowered step agrees (``tests/bench/test_gpu_lowering.py``)."""
    if not cfg.remat:
        return 0.0
    if fused_attention is None:
        from spotlight_jax.models.mmdit import as_dtype  # noqa: PLC0415
        from spotlight_jax.parallel.kernels import fused_on_gpus  # noqa: PLC0415
        fused_attention = fused_on_gpus("auto", as_dtype(cfg.dtype), cfg.head_dim)
    parts = flops_breakdown(cfg)
    attention = parts["block_attention"] / sum(parts.values())
    keeps_attention = fused_attention and cfg.remat_policy.endswith("attention")
    if cfg.remat_policy == "dots":
        keeps_attention = not fused_attention
    if cfg.remat_policy in ("dots", "dots_no_batch", "dots_attention"):
        return 0.0 if keeps_attention else attention
    return 1.0 - attention if keeps_attention else 1.0


@functools.lru_cache(maxsize=16)
def traced_counts(cfg, text_tokens: int, lora_rank: int = 0):
    """``(FLOPs by part, parameters, LoRA parameters at lora_rank)`` of a model read off the
    model itself: its abstract parameters (nothing allocated) and the jaxpr of one sample's
    forward with ``text_tokens`` prompt tokens (traced, never run). The FLOPs are
    ``block_attention`` (dot_generals with batch dimensions: scores and their mix) and
    ``block_linear`` (every other matmul), the other parts 0."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax.models.factory import abstract_model  # noqa: PLC0415
    from spotlight_jax.rl import lora  # noqa: PLC0415

    plain = dataclasses.replace(cfg, remat=False)
    graphdef, state = abstract_model(plain)
    f32 = np.float32
    args = (jax.ShapeDtypeStruct((1, *cfg.latent_shape), f32), jax.ShapeDtypeStruct((1,), f32),
            jax.ShapeDtypeStruct((1, text_tokens, cfg.text_embed_dim), f32),
            jax.ShapeDtypeStruct((1, text_tokens), np.bool_))
    guidance = jax.ShapeDtypeStruct((1,), f32) if getattr(cfg, "guidance_embed", False) else None
    jaxpr = jax.make_jaxpr(lambda st, g, *a: nnx.merge(graphdef, st)(*a, guidance=g))(
        state, guidance, *args)
    total = jaxpr_flops(jaxpr.jaxpr)
    attention = jaxpr_flops(jaxpr.jaxpr, batched_only=True)
    parts = {"block_linear": total - attention, "block_attention": attention, "block_adaln": 0,
             "embed": 0, "final": 0, "conv": 0, "prompt_encoder": 0}
    leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(state))
    params = sum(math.prod(a.shape) for _, a in leaves)
    adapters = sum(math.prod(a.shape[:-2]) * lora_rank * (a.shape[-2] + a.shape[-1])
                   for path, a in leaves if lora.is_target(path))
    return parts, params, adapters


def jaxpr_flops(jaxpr, mult: int = 1, batched_only: bool = False) -> int:
    """FLOPs of every ``dot_general`` and convolution of a jaxpr (2 per multiply-add), into
    its sub-jaxprs (a scan's body times its length); ``batched_only``: of the dot_generals with
    batch dimensions alone (attention's)."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("while", "cond"):
            raise ValueError(f"jaxpr_flops: a {name} has no static trip count")
        if name == "dot_general":
            (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
            a, b = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
            batch = math.prod(a[i] for i in lb)
            contract = math.prod(a[i] for i in lc)
            m = math.prod(a[i] for i in range(len(a)) if i not in lc and i not in lb)
            n = math.prod(b[i] for i in range(len(b)) if i not in rc and i not in rb)
            if lb or not batched_only:
                total += 2 * batch * m * n * contract * mult
        elif name == "conv_general_dilated" and not batched_only:
            rhs = eqn.invars[1].aval.shape
            cout = rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
            out = eqn.outvars[0].aval.shape
            total += 2 * math.prod(out) * (math.prod(rhs) // cout) * mult
        inner = mult * (eqn.params["length"] if name == "scan" else 1)
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                if hasattr(sub, "eqns"):
                    total += jaxpr_flops(sub, inner, batched_only)
                elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                    total += jaxpr_flops(sub.jaxpr, inner, batched_only)
    return total


@functools.lru_cache(maxsize=16)
def vae_decode_flops(vae_cfg, latent_shape: tuple[int, ...]) -> int:
    """FLOPs of decoding one sample's latents ``latent_shape`` (``[t, h, w, z]`` or
    ``[h, w, z]``) with the Wan VAE of ``vae_cfg`` (``models.vae.WanVAEConfig``), one latent
    frame per chunk as the decoder runs; traced, never run."""
    import jax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax.models.vae.wan_vae import WanVAE  # noqa: PLC0415

    graphdef, state = nnx.split(nnx.eval_shape(lambda: WanVAE(vae_cfg, rngs=nnx.Rngs(0))))
    z = jax.ShapeDtypeStruct((1, *latent_shape), jax.numpy.float32)
    jaxpr = jax.make_jaxpr(lambda s, z: nnx.merge(graphdef, s).decode(z))(state, z).jaxpr
    return jaxpr_flops(jaxpr)
