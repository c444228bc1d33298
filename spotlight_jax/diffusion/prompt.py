"""The prompt a model call takes, as one pytree, and the row operations every path does on it.

``tokens`` (what a prompt source's ``tokenize`` returns, and what rollouts, batches and trainers
carry next to ``mask``) is either

* a plain array: token ids ``[B, L]`` (a model with its prompt encoder) or embeddings
  ``[B, L, D]``; classifier-free guidance's null prompt is then zeros with an all-False mask
  (the synthetic world's, unchanged); or
* a dict (a prompt-embedding file): ``{"embeds": [B, L, D], "pooled": [B, P] (families with a
  pooled text embedding, SD3/SD3.5), "null": {"embeds", "mask", "pooled"}}``, where ``null``
  holds each row's guidance null prompt (the file's encoded empty prompt), so the null travels
  with its prompt through every path (scheduler segments, spot nodes, checkpoints, trainers)
  and no call site decides which null applies. An editing model's prompt also carries
  ``"image"``: the input image's latents ``[B, H', W', C]`` (or a tuple of them, one per
  reference image), which a row's null prompt shares (guidance drops the words, not the image
  being edited); ``"embeds"`` then holds token ids for a model with its prompt encoder.

Only :func:`model_inputs` and :func:`null_prompt` look inside; everything else treats ``tokens``
as a pytree whose leaves all have the batch on axis 0 (``diffusion.batches``: slicing,
concatenating, repeating, flattening; ``parallel.mesh.place_batch``), so no path branches on the
kind.
"""
from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

EMBEDS, POOLED, NULL, MASK, IMAGE = "embeds", "pooled", "null", "mask", "image"


def model_inputs(tokens):
    """``(ids or embeddings, pooled or None)``: what ``MMDiT(x, t, tokens, mask, pooled=...)``
    takes of ``tokens``."""
    if isinstance(tokens, Mapping):
        return tokens[EMBEDS], tokens.get(POOLED)
    return tokens, None


def image_latents(tokens):
    """The input image's latents an editing model takes (``MMDiT(..., image_latents=...)``), or
    None for a text-to-image prompt."""
    return tokens.get(IMAGE) if isinstance(tokens, Mapping) else None


def model_kwargs(tokens) -> dict:
    """The keyword inputs a model call takes of ``tokens`` beside the ids or embeddings: the
    pooled embedding and the input image, where the prompt has them."""
    embeds_pooled = model_inputs(tokens)
    image = image_latents(tokens)
    return {"pooled": embeds_pooled[1],
            **({} if image is None else {"image_latents": image})}


def conditional(tokens):
    """``tokens`` without their null prompt (the structure a model call's inputs have)."""
    if isinstance(tokens, Mapping) and NULL in tokens:
        return {k: v for k, v in tokens.items() if k != NULL}
    return tokens


def null_prompt(tokens, mask):
    """Each row's classifier-free-guidance null prompt ``(tokens, mask)``, structured as
    ``conditional(tokens)``: the carried ``null`` when there is one, else zeros with an all-False
    mask."""
    image = image_latents(tokens)
    if isinstance(tokens, Mapping) and NULL in tokens:
        null = tokens[NULL]
        out = {k: v for k, v in null.items() if k != MASK}
        return ({**out, IMAGE: image} if image is not None else out), null[MASK]
    if image is None:
        return jax.tree.map(jnp.zeros_like, tokens), jnp.zeros_like(mask)
    words = {k: v for k, v in tokens.items() if k != IMAGE}
    return {**jax.tree.map(jnp.zeros_like, words), IMAGE: image}, jnp.zeros_like(mask)


def with_null(tokens, mask):
    """The conditional rows followed by their null prompts: ``(tokens [2B...], mask [2B, L])``,
    one batch for guidance's two forwards."""
    null_tokens, null_mask = null_prompt(tokens, mask)
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), conditional(tokens), null_tokens)
    return both, jnp.concatenate([mask, null_mask])


def drop(tokens, mask, keep):
    """Prompt dropout: rows where ``keep [B]`` is False become their null prompt. Returns
    ``(tokens, mask)`` structured as ``conditional(tokens)``."""
    null_tokens, null_mask = null_prompt(tokens, mask)

    def pick(a, b):
        return jnp.where(keep.reshape(keep.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, conditional(tokens), null_tokens), pick(mask, null_mask)
