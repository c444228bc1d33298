"""FLUX.2's VAE (diffusers' ``AutoencoderKLFlux2``): what it adds to ``AutoencoderKL``.

The network is ``AutoencoderKL``'s (``models.vae.autoencoder_kl``: the same encoder, decoder and
quant convs, only the decoder's widths may differ: ``decoder_block_out_channels``), so it is
built as that module. What differs is the latent space the transformer sees. ``Flux2Pipeline``
packs each 2 x 2 cell of the VAE's latent into one token of ``4 C`` channels ordered
``(c, py, px)`` and normalises every packed channel with the running statistics of the VAE's
affine-free batch norm ``bn`` (never applied as a layer, only read):
``(posterior mean - running_mean) / sqrt(running_var + batch_norm_eps)`` after encoding, the
inverse before decoding.

Packed channel ``(c, py, px)`` is latent channel ``c`` at position ``(py, px)`` of its cell, so
on the *unpacked* latent, which our FLUX.2 transformer takes (``models.flux2_transformer``), that
normalisation is an affine map per channel and position within the 2 x 2 cell:
:func:`batch_norm_cells` gives its scale and shift as ``[2, 2, C]`` arrays, which ``LatentVAE``
applies cell by cell (no packing needed around the VAE). :func:`pack_latents` and
:func:`unpack_latents` are the pipeline's packing, channels-last, for latents exchanged with
diffusers (``unpack_latents`` of the pipeline's packed, normalised latent is our latent).
"""
from __future__ import annotations

import numpy as np

PACK = 2        # the pipelines pack 2 x 2 latent cells into one token's channels


def batch_norm_cells(running_mean, running_var, eps: float, latent_channels: int):
    """``(scale, shift)``, each ``[PACK, PACK, latent_channels]`` float32, of the batch norm's
    running statistics over the packed channels (``[4 C]``, ``(c, py, px)`` order):
    ``scale[py, px, c] = sqrt(running_var + eps)`` and ``shift[py, px, c] = running_mean`` of
    packed channel ``(c, py, px)``, so ``raw = latents * scale + shift`` cell-wise."""
    mean, var = (np.asarray(v, np.float32).reshape(latent_channels, PACK, PACK)
                 for v in (running_mean, running_var))
    scale = np.sqrt(var + np.float32(eps))
    return scale.transpose(1, 2, 0), mean.transpose(1, 2, 0)


def pack_latents(latents):
    """The pipeline's ``_patchify_latents``, channels-last: ``[B, h, w, C]`` ->
    ``[B, h/2, w/2, 4 C]``, packed channel ``c * 4 + py * 2 + px`` (numpy or jax arrays)."""
    b, h, w, c = latents.shape
    if h % PACK or w % PACK:
        raise ValueError(f"latents.shape={tuple(latents.shape)}: h and w must be even to pack "
                         f"{PACK} x {PACK} cells (FLUX.2 images are multiples of 16 pixels)")
    x = latents.reshape(b, h // PACK, PACK, w // PACK, PACK, c).transpose(0, 1, 3, 5, 2, 4)
    return x.reshape(b, h // PACK, w // PACK, c * PACK * PACK)


def unpack_latents(packed):
    """The inverse of :func:`pack_latents` (the pipeline's ``_unpatchify_latents``,
    channels-last): ``[B, h/2, w/2, 4 C]`` -> ``[B, h, w, C]``."""
    b, i, j, k = packed.shape
    if k % (PACK * PACK):
        raise ValueError(f"packed.shape={tuple(packed.shape)}: the channels ({k}) must be a "
                         f"multiple of {PACK * PACK} (C latent channels x a 2 x 2 cell)")
    c = k // (PACK * PACK)
    x = packed.reshape(b, i, j, c, PACK, PACK).transpose(0, 1, 4, 2, 5, 3)
    return x.reshape(b, i * PACK, j * PACK, c)
