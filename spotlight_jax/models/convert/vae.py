"""Load a diffusers VAE folder (``<model>/vae``) into the Flax VAE of its family, wrapped as a
``LatentVAE`` that speaks the DiT's latents (``decode``/``encode``).

Families, by the config's ``_class_name``: ``AutoencoderKL`` (SD3/SD3.5; SD1/SDXL too),
``AutoencoderKLFlux2`` (FLUX.2: ``AutoencoderKL``'s network, its batch-norm statistics ``bn.*``
read as the latent normalisation of ``models.vae.flux2_vae``), ``AutoencoderKLWan`` (the causal
3-D VAE of Wan 2.1, and of Wan 2.2 with its residual levels and 2 x 2 pixel folding: clips) and
``AutoencoderKLQwenImage`` (Wan 2.1's network, on single frames). The conversion is by rule, not
by a per-key table: the Flax modules are named after diffusers' module tree, so each parameter's
path gives its diffusers key (``kernel``/``scale`` -> ``weight``, plus the two ``nn.Sequential``
indices below), and the layout follows from the stored tensor's rank:

- conv ``[out, in, kh, kw]`` -> ``[kh, kw, in, out]``; linear ``[out, in]`` -> ``[in, out]``;
- Wan's (Qwen-Image's) causal 3-D conv ``[out, in, t, kh, kw]`` -> ``[t, kh, kw, in, out]``;
- Wan's norm gains ``(C, 1, 1[, 1])`` -> ``(C,)``.

Every tensor in the folder must be used (FLUX.2's batch-norm update counter aside): a missing,
mis-shaped or unexpected tensor is a ``CheckpointError`` naming it.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from spotlight_jax.models.convert.diffusers_folder import CheckpointError, read_component
from spotlight_jax.models.vae.autoencoder_kl import AutoencoderKL, AutoencoderKLConfig
from spotlight_jax.models.vae.flux2_vae import PACK, batch_norm_cells
from spotlight_jax.models.vae.latent_vae import LatentVAE
from spotlight_jax.models.vae.wan_vae import WanVAE, WanVAEConfig

SD_CLASS, QWEN_CLASS, WAN_CLASS = "AutoencoderKL", "AutoencoderKLQwenImage", "AutoencoderKLWan"
FLUX2_CLASS = "AutoencoderKLFlux2"
VIDEO_CLASSES = (WAN_CLASS,)

# Our module names whose diffusers counterpart sits inside an nn.Sequential / ModuleList.
_RENAMES = {SD_CLASS: {"to_out": "to_out.0"}, FLUX2_CLASS: {"to_out": "to_out.0"},
            QWEN_CLASS: {"resample": "resample.1"}, WAN_CLASS: {"resample": "resample.1"}}
# diffusers' defaults of the fields a config.json may omit, per AutoencoderKL-network class.
_KL_DEFAULTS = {SD_CLASS: dict(block_out_channels=(64,), layers_per_block=1, latent_channels=4),
                FLUX2_CLASS: dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                                  latent_channels=32)}
# FLUX.2's batch norm: its running statistics normalise the packed latent; the update count is
# a training-time counter nothing reads.
_BN_STATS, _BN_COUNTER = ("bn.running_mean", "bn.running_var"), "bn.num_batches_tracked"
# Pre-0.14 diffusers (and original LDM) names of the SD mid-block attention's projections.
_LEGACY = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}
_LEAVES = {"kernel": "weight", "scale": "weight", "gamma": "gamma", "bias": "bias"}


def vae_from_diffusers(checkpoint_dir, dtype=jnp.float32) -> LatentVAE:
    """The VAE in ``checkpoint_dir`` (a diffusers ``vae`` folder), parameters and compute in
    ``dtype``, as a ``LatentVAE`` (``decode(latents [B, h, w, c]) -> images [B, H, W, 3]`` in
    [0, 1], or for Wan ``[B, t, h, w, c] -> [B, T, H, W, 3]``; ``encode`` the inverse; the
    family's latent normalisation inside; for FLUX.2 the latents are the unpacked ``[B, h, w,
    32]`` its transformer takes, normalised as ``Flux2Pipeline`` normalises the packed ones)."""
    config, tensors = read_component(checkpoint_dir)
    family = config.get("_class_name")
    if family in (SD_CLASS, FLUX2_CLASS):
        cfg = autoencoder_kl_config(config, checkpoint_dir, family)
        build = lambda: AutoencoderKL(cfg, rngs=None, dtype=dtype, param_dtype=dtype)
        if family == FLUX2_CLASS:
            tensors, norm = flux2_normalisation(config, tensors, cfg.latent_channels,
                                                checkpoint_dir)
        else:
            norm = _sd_normalisation(config, cfg.latent_channels, checkpoint_dir)
    elif family in (QWEN_CLASS, WAN_CLASS):
        cfg = wan_vae_config(config, checkpoint_dir)
        build = lambda: WanVAE(cfg, rngs=None, dtype=dtype, param_dtype=dtype)
        norm = dict(latent_channels=cfg.z_dim,
                    latent_scale=_per_channel(config, "latents_std", cfg.z_dim, checkpoint_dir),
                    latent_shift=_per_channel(config, "latents_mean", cfg.z_dim, checkpoint_dir))
    else:
        raise CheckpointError(f"{checkpoint_dir}: _class_name={family!r} in config.json is not a "
                              f"supported VAE (use a folder of {SD_CLASS}, {FLUX2_CLASS}, "
                              f"{QWEN_CLASS} or {WAN_CLASS})")
    graphdef, abstract = nnx.split(build())  # shape-only parameters (rngs=None)
    state = load_state(abstract, tensors, family, checkpoint_dir, dtype)
    return LatentVAE(nnx.merge(graphdef, state), downsample_factor=cfg.downsample_factor,
                     family=family, video=family in VIDEO_CLASSES, **norm)


def _sd_normalisation(config: dict, channels: int, where) -> dict:
    """SD3's (FLUX.1's, SD1's) latent normalisation: ``1 / scaling_factor`` and
    ``shift_factor`` (0 when null), as LatentVAE's kwargs."""
    scaling = config.get("scaling_factor", 0.18215)
    shift = config.get("shift_factor") or 0.0
    if not scaling:
        raise CheckpointError(f"{where}: scaling_factor={scaling!r} in config.json (must be "
                              f"non-zero, e.g. 1.5305 for SD3)")
    return dict(latent_channels=channels, latent_scale=1.0 / float(scaling),
                latent_shift=float(shift))


def autoencoder_kl_config(config: dict, where, family: str = SD_CLASS) -> AutoencoderKLConfig:
    """The architecture of a diffusers ``AutoencoderKL`` (or ``AutoencoderKLFlux2``: the same
    network) config.json; rejects block types and activations this port does not implement."""
    defaults = _KL_DEFAULTS[family]
    boc = tuple(int(c) for c in config.get("block_out_channels", defaults["block_out_channels"]))
    down = list(config.get("down_block_types", ["DownEncoderBlock2D"] * len(boc)))
    up = list(config.get("up_block_types", ["UpDecoderBlock2D"] * len(boc)))
    if down != ["DownEncoderBlock2D"] * len(boc) or up != ["UpDecoderBlock2D"] * len(boc):
        raise CheckpointError(f"{where}: down_block_types={down}, up_block_types={up}: only "
                              f"DownEncoderBlock2D/UpDecoderBlock2D, one per block_out_channels "
                              f"entry ({len(boc)}), are supported (as in SD3's VAE)")
    act = config.get("act_fn", "silu")
    if act not in ("silu", "swish"):
        raise CheckpointError(f"{where}: act_fn={act!r}: only silu is supported (as in SD3)")
    return AutoencoderKLConfig(
        block_out_channels=boc,
        decoder_block_out_channels=_decoder_channels(config, boc, where),
        layers_per_block=int(config.get("layers_per_block", defaults["layers_per_block"])),
        latent_channels=int(config.get("latent_channels", defaults["latent_channels"])),
        norm_num_groups=int(config.get("norm_num_groups", 32)),
        in_channels=int(config.get("in_channels", 3)),
        out_channels=int(config.get("out_channels", 3)),
        use_quant_conv=bool(config.get("use_quant_conv", True)),
        use_post_quant_conv=bool(config.get("use_post_quant_conv", True)),
        mid_block_add_attention=bool(config.get("mid_block_add_attention", True)))


def _decoder_channels(config: dict, boc: tuple[int, ...], where) -> tuple[int, ...] | None:
    """FLUX.2's ``decoder_block_out_channels`` (None or absent: the encoder's widths); one
    width per encoder block, so the decoder upsamples as often as the encoder downsampled."""
    dec = config.get("decoder_block_out_channels")
    if not dec:
        return None
    dec = tuple(int(c) for c in dec)
    if len(dec) != len(boc):
        raise CheckpointError(f"{where}: decoder_block_out_channels={list(dec)}: needs one width "
                              f"per block_out_channels entry ({len(boc)}), or null for the "
                              f"encoder's")
    return dec


def flux2_normalisation(config: dict, tensors: dict, channels: int, where):
    """``(tensors less the batch norm's, LatentVAE's normalisation kwargs)`` of an
    ``AutoencoderKLFlux2`` folder: the running statistics of ``bn`` over the ``4 x channels``
    packed channels as cell-wise ``[2, 2, channels]`` scale and shift
    (``flux2_vae.batch_norm_cells``)."""
    patch = [int(p) for p in config.get("patch_size") or (PACK, PACK)]
    if patch != [PACK, PACK]:
        raise CheckpointError(f"{where}: patch_size={patch} in config.json: only [2, 2] is "
                              f"supported (Flux2Pipeline packs 2 x 2 latent cells)")
    eps = float(config.get("batch_norm_eps", 1e-4))
    want = (PACK * PACK * channels,)
    for key in _BN_STATS:
        if key not in tensors:
            raise CheckpointError(f"{where}: missing tensor {key!r} (the batch-norm statistics "
                                  f"FLUX.2 normalises latents with; is the folder complete?)")
        if tuple(tensors[key].shape) != want:
            raise CheckpointError(f"{where}: tensor {key!r} has shape "
                                  f"{tuple(tensors[key].shape)}, expected {want} (one per packed "
                                  f"channel: 4 x latent_channels={channels})")
    mean, var = (np.asarray(tensors[k], np.float32) for k in _BN_STATS)
    if not (np.all(np.isfinite(mean)) and np.all(var + eps > 0)):
        raise CheckpointError(f"{where}: bn.running_mean / bn.running_var + batch_norm_eps={eps} "
                              f"must be finite and the variances positive (min "
                              f"{float(np.min(var + eps)):.3g})")
    scale, shift = batch_norm_cells(mean, var, eps, channels)
    rest = {k: v for k, v in tensors.items() if k not in (*_BN_STATS, _BN_COUNTER)}
    return rest, dict(latent_channels=channels, latent_scale=scale, latent_shift=shift)


def wan_vae_config(config: dict, where) -> WanVAEConfig:
    """The architecture of a diffusers ``AutoencoderKLWan`` (Wan 2.1, or 2.2's residual VAE
    with its 2 x 2 pixel folding) or ``AutoencoderKLQwenImage`` config.json."""
    if config.get("attn_scales"):
        raise CheckpointError(f"{where}: attn_scales={config['attn_scales']}: encoder attention "
                              f"blocks are not supported (Wan's and Qwen-Image's VAEs have "
                              f"attn_scales=[])")
    patch = int(config.get("patch_size") or 1)
    rgb = 3 * patch * patch
    for key in ("input_channels", "in_channels", "out_channels"):
        if config.get(key, rgb) != rgb:
            raise CheckpointError(f"{where}: {key}={config[key]} with patch_size={patch}: only "
                                  f"RGB is supported ({rgb} channels after folding "
                                  f"{patch} x {patch} pixels)")
    mult = tuple(int(m) for m in config.get("dim_mult", (1, 2, 4, 4)))
    temporal = tuple(bool(t) for t in config.get("temperal_downsample", (False, True, True)))
    if len(temporal) != len(mult) - 1:
        raise CheckpointError(f"{where}: temperal_downsample={list(temporal)}: needs "
                              f"len(dim_mult) - 1 = {len(mult) - 1} entries")
    return WanVAEConfig(base_dim=int(config.get("base_dim", 96)),
                        z_dim=int(config.get("z_dim", 16)), dim_mult=mult,
                        num_res_blocks=int(config.get("num_res_blocks", 2)),
                        temperal_downsample=temporal, input_channels=rgb,
                        decoder_base_dim=int(config.get("decoder_base_dim") or 0),
                        is_residual=bool(config.get("is_residual", False)), patch_size=patch)


def _per_channel(config: dict, name: str, channels: int, where) -> np.ndarray:
    v = config.get(name)
    if v is None or len(v) != channels:
        raise CheckpointError(f"{where}: {name}={v!r} in config.json: needs z_dim={channels} "
                              f"values (one per latent channel)")
    return np.asarray(v, np.float32)


def diffusers_key(path: tuple, family: str) -> str:
    """The diffusers name of the parameter at ``path`` in our module tree."""
    renames = _RENAMES[family]
    *modules, leaf = (str(p) for p in path)
    return ".".join([renames.get(m, m) for m in modules] + [_LEAVES[leaf]])


def to_flax(a: np.ndarray, target_ndim: int) -> np.ndarray:
    """One stored tensor in our layout (see the module docstring)."""
    if target_ndim == 1:
        return a.reshape(-1) if a.ndim > 1 and a.size == a.shape[0] else a
    if target_ndim == 2 and a.ndim == 4 and a.shape[2:] == (1, 1):  # a 1x1 conv as a linear
        a = a[:, :, 0, 0]
    if a.ndim == 5:
        return a.transpose(2, 3, 4, 1, 0)
    if a.ndim == 4:
        return a.transpose(2, 3, 1, 0)
    if a.ndim == 2:
        return a.T
    return a


def load_state(abstract: nnx.State, tensors: dict, family: str, where, dtype) -> nnx.State:
    """Fill the abstract state with the folder's tensors; every error names the tensor."""
    used, flat = set(), []
    for path, var in nnx.to_flat_state(abstract):
        key = diffusers_key(path, family)
        name = key
        if name not in tensors and family == SD_CLASS:
            module, leaf = key.rsplit(".", 1)
            for new, old in _LEGACY.items():
                if module.endswith("." + new):
                    name = module[: -len(new)] + old + "." + leaf
        if name not in tensors:
            raise CheckpointError(f"{where}: missing tensor {key!r} (the config.json describes a "
                                  f"{family} with it; is the folder complete and of that class?)")
        a = to_flax(np.asarray(tensors[name]), len(var.shape))
        if tuple(a.shape) != tuple(var.shape):
            raise CheckpointError(f"{where}: tensor {name!r} has shape "
                                  f"{tuple(tensors[name].shape)}, expected {tuple(var.shape)} in "
                                  f"our layout (does config.json match the weights?)")
        used.add(name)
        flat.append((path, var.replace(jnp.asarray(a, dtype=dtype))))
    extra = sorted(set(tensors) - used)
    if extra:
        raise CheckpointError(f"{where}: {len(extra)} unexpected tensors, e.g. {extra[:3]} (the "
                              f"config.json does not describe them; is it this folder's config?)")
    return nnx.from_flat_state(flat)
