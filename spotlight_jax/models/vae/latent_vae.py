"""A frozen VAE that speaks the DiT's latents and the rewards' images.

Both families normalise latents per channel with an affine map, so one wrapper serves both:
``raw = latents * scale + shift`` before decoding and ``latents = (raw - shift) / scale`` after
encoding, with

- SD3 ``AutoencoderKL``: ``scale = 1 / scaling_factor``, ``shift = shift_factor`` (0 when the
  config has none, as SD1-style VAEs);
- Qwen-Image: ``scale = latents_std``, ``shift = latents_mean`` (per channel).

- Wan 2.1 (video): as Qwen-Image, per channel.
- FLUX.2: ``scale = sqrt(running_var + eps)``, ``shift = running_mean`` of the VAE's batch norm
  over the pipeline's 2 x 2-packed channels, i.e. per channel *and* position within each 2 x 2
  cell of the (unpacked) latent: ``[2, 2, c]`` arrays applied cell-wise
  (``models.vae.flux2_vae``).

Images are ``[B, H, W, 3]`` float32 in [0, 1] (a video VAE's clips ``[B, T, H, W, 3]``, its
latents ``[B, t, h, w, c]``): diffusers' [-1, 1] output is mapped by ``x / 2 + 0.5`` and clipped,
as the pipelines' postprocess does; encode maps ``2 x - 1`` in.

Purity: the module is split once (``graphdef``, ``state``); ``decode_with(state, latents)`` and
``encode_with(state, images)`` are pure functions of the state that a caller may trace inside its
own jitted program (pass ``vae.state`` as an argument, so the weights are not baked in as
constants). ``decode``/``encode`` are the same functions jitted. Nothing is sharded specially: a
batch placed on a data-parallel mesh runs with the replicated state as is.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class LatentVAE:
    """``decode(latents [B, h, w, c]) -> images [B, H, W, 3]`` in [0, 1] and
    ``encode(images) -> latents`` (the posterior mean, normalised), for a frozen VAE module that
    has ``encode``/``decode`` in diffusers' raw spaces. ``family`` names the checkpoint class;
    ``video``: latents and images carry a frame axis after the batch. ``latent_scale`` and
    ``latent_shift``: one value, one per channel, or ``[p, p, c]`` (per channel and position
    within each ``p x p`` cell of latent pixels: FLUX.2's)."""

    def __init__(self, module: nnx.Module, *, latent_channels: int, latent_scale, latent_shift,
                 downsample_factor: int, family: str, video: bool = False):
        scale, shift = _affine_factors(latent_scale, latent_shift, latent_channels)
        if np.any(scale == 0):
            raise ValueError(f"latent_scale={scale.tolist()}: must be non-zero (it divides the "
                             f"encoder's latents)")
        self.family = family
        self.video = bool(video)
        self.config = module.config
        self.latent_channels = int(latent_channels)
        self.downsample_factor = int(downsample_factor)
        self.latent_scale, self.latent_shift = scale, shift
        self.graphdef, self.state = nnx.split(module)
        self._decode = jax.jit(self.decode_with)
        self._encode = jax.jit(self.encode_with)

    def decode(self, latents):
        """``decode_with`` of this VAE's own state, jitted."""
        return self._decode(self.state, latents)

    def encode(self, images):
        """``encode_with`` of this VAE's own state, jitted."""
        return self._encode(self.state, images)

    def decode_with(self, state, latents):
        """Pure: ``latents`` ``[B, h, w, c]`` (the DiT's) -> images ``[B, H, W, 3]`` in [0, 1],
        float32 (video: ``[B, t, h, w, c]`` -> ``[B, T, H, W, 3]``)."""
        latents = jnp.asarray(latents, jnp.float32)
        if latents.ndim != 4 + self.video or latents.shape[-1] != self.latent_channels:
            raise ValueError(f"latents.shape={tuple(latents.shape)}: expected "
                             f"[B, {'t, ' * self.video}h, w, {self.latent_channels}] "
                             f"(channels-last, this {self.family}'s latent channels)")
        module = nnx.merge(self.graphdef, state)
        images = module.decode(self.denormalise(latents)).astype(jnp.float32)
        return jnp.clip(images * 0.5 + 0.5, 0.0, 1.0)

    def encode_with(self, state, images):
        """Pure: ``images`` ``[B, H, W, 3]`` in [0, 1] -> the posterior mean as the DiT's
        latents ``[B, h, w, c]``, float32 (video: ``[B, T, H, W, 3]`` -> ``[B, t, h, w, c]``)."""
        images = jnp.asarray(images, jnp.float32)
        if images.ndim != 4 + self.video or images.shape[-1] != 3:
            raise ValueError(f"images.shape={tuple(images.shape)}: expected "
                             f"[B, {'T, ' * self.video}H, W, 3] (channels-last RGB in [0, 1])")
        cell = self.downsample_factor * self.cell
        if self.cell > 1 and (images.shape[-3] % cell or images.shape[-2] % cell):
            raise ValueError(f"images.shape={tuple(images.shape)}: H and W must be multiples of "
                             f"{cell} ({self.family}'s latents are normalised per "
                             f"{self.cell} x {self.cell} cell of {self.downsample_factor}x "
                             f"downsampled pixels)")
        module = nnx.merge(self.graphdef, state)
        x = images * 2.0 - 1.0
        return self.normalise(module.encode(x).astype(jnp.float32))

    @property
    def cell(self) -> int:
        """The side of the latent-pixel cell the normalisation varies over (1: per channel)."""
        return self.latent_scale.shape[0] if self.latent_scale.ndim == 3 else 1

    def denormalise(self, latents):
        """The DiT's latents -> the VAE's raw latents: ``latents * scale + shift``."""
        return self._cellwise(latents, lambda x, scale, shift: x * scale + shift)

    def normalise(self, raw):
        """The VAE's raw latents -> the DiT's: ``(raw - shift) / scale``."""
        return self._cellwise(raw, lambda x, scale, shift: (x - shift) / scale)

    def _cellwise(self, x, affine):
        """``affine(x, scale, shift)`` per channel, or per channel and position within each
        ``cell x cell`` block of latent pixels (``x`` viewed as ``[..., h/p, p, w/p, p, c]``,
        the ``[p, p, c]`` factors broadcast over the blocks)."""
        p = self.cell
        if p == 1:
            return affine(x, self.latent_scale.reshape(-1), self.latent_shift.reshape(-1))
        *lead, h, w, c = x.shape
        if h % p or w % p:
            raise ValueError(f"latents.shape={tuple(x.shape)}: h and w must be multiples of {p} "
                             f"({self.family} normalises each channel per position in a "
                             f"{p} x {p} cell)")
        blocks = x.reshape(*lead, h // p, p, w // p, p, c)
        y = affine(blocks, self.latent_scale[:, None], self.latent_shift[:, None])
        return y.reshape(x.shape)


def _affine_factors(latent_scale, latent_shift, channels: int):
    """``(scale, shift)`` float32: both ``[n]`` (n = 1 or ``channels``), or both
    ``[p, p, channels]`` when either is given per cell position (the other broadcast to it); a
    wrong size or a non-finite value is a one-line ValueError."""
    scale, shift = (np.asarray(v, np.float32) for v in (latent_scale, latent_shift))
    for name, v in (("latent_scale", scale), ("latent_shift", shift)):
        per_cell = v.ndim == 3 and v.shape[0] == v.shape[1] and v.shape[2] == channels
        ok = per_cell if v.ndim == 3 else v.size in (1, channels)
        if not ok or not np.all(np.isfinite(v)):
            raise ValueError(f"{name}={v.tolist()}: needs 1 or latent_channels={channels} "
                             f"finite values (one per channel), or a [p, p, {channels}] array "
                             f"(per channel and position within a p x p cell)")
    cells = {v.shape for v in (scale, shift) if v.ndim == 3}
    if len(cells) > 1:
        raise ValueError(f"latent_scale of shape {scale.shape}, latent_shift of shape "
                         f"{shift.shape}: per-cell factors must share one cell size")
    if not cells:
        return scale.reshape(-1), shift.reshape(-1)
    shape = cells.pop()
    return tuple(np.broadcast_to(v if v.ndim == 3 else v.reshape(-1), shape).copy()
                 for v in (scale, shift))
