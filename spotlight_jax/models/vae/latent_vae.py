"""A frozen VAE that speaks the DiT's latents and the rewards' images.

Both families normalise latents per channel with an affine map, so one wrapper serves both:
``raw = latents * scale + shift`` before decoding and ``latents = (raw - shift) / scale`` after
encoding, with

- SD3 ``AutoencoderKL``: ``scale = 1 / scaling_factor``, ``shift = shift_factor`` (0 when the
  config has none, as SD1-style VAEs);
- Qwen-Image: ``scale = latents_std``, ``shift = latents_mean`` (per channel).

- Wan 2.1 (video): as Qwen-Image, per channel.

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
    ``video``: latents and images carry a frame axis after the batch."""

    def __init__(self, module: nnx.Module, *, latent_channels: int, latent_scale, latent_shift,
                 downsample_factor: int, family: str, video: bool = False):
        scale = np.asarray(latent_scale, np.float32).reshape(-1)
        shift = np.asarray(latent_shift, np.float32).reshape(-1)
        for name, v in (("latent_scale", scale), ("latent_shift", shift)):
            if v.size not in (1, latent_channels) or not np.all(np.isfinite(v)):
                raise ValueError(f"{name}={v.tolist()}: needs 1 or latent_channels="
                                 f"{latent_channels} finite values (one per channel)")
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
        raw = latents * self.latent_scale + self.latent_shift
        images = module.decode(raw).astype(jnp.float32)
        return jnp.clip(images * 0.5 + 0.5, 0.0, 1.0)

    def encode_with(self, state, images):
        """Pure: ``images`` ``[B, H, W, 3]`` in [0, 1] -> the posterior mean as the DiT's
        latents ``[B, h, w, c]``, float32 (video: ``[B, T, H, W, 3]`` -> ``[B, t, h, w, c]``)."""
        images = jnp.asarray(images, jnp.float32)
        if images.ndim != 4 + self.video or images.shape[-1] != 3:
            raise ValueError(f"images.shape={tuple(images.shape)}: expected "
                             f"[B, {'T, ' * self.video}H, W, 3] (channels-last RGB in [0, 1])")
        module = nnx.merge(self.graphdef, state)
        x = images * 2.0 - 1.0
        raw = module.encode(x).astype(jnp.float32)
        return (raw - self.latent_shift) / self.latent_scale
