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
  and no call site decides which null applies.

Only :func:`model_inputs` and :func:`null_prompt` look inside; everything else treats ``tokens``
as a pytree whose leaves all have the batch on axis 0, so slicing a batch (:func:`take`),
concatenating chunks (:func:`concat`), repeating rows (:func:`repeat`) and placing it on a mesh
(``parallel.mesh.place_batch``) never branch on the kind. :func:`flatten` / :func:`unflatten`
turn a batch holding such a pytree into flat ``"a/b"`` names for npz files and broadcasts.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

EMBEDS, POOLED, NULL, MASK = "embeds", "pooled", "null", "mask"
SEP = "/"


def model_inputs(tokens):
    """``(ids or embeddings, pooled or None)``: what ``MMDiT(x, t, tokens, mask, pooled=...)``
    takes of ``tokens``."""
    if isinstance(tokens, Mapping):
        return tokens[EMBEDS], tokens.get(POOLED)
    return tokens, None


def conditional(tokens):
    """``tokens`` without their null prompt (the structure a model call's inputs have)."""
    if isinstance(tokens, Mapping) and NULL in tokens:
        return {k: v for k, v in tokens.items() if k != NULL}
    return tokens


def null_prompt(tokens, mask):
    """Each row's classifier-free-guidance null prompt ``(tokens, mask)``, structured as
    ``conditional(tokens)``: the carried ``null`` when there is one, else zeros with an all-False
    mask."""
    if isinstance(tokens, Mapping) and NULL in tokens:
        null = tokens[NULL]
        return {k: v for k, v in null.items() if k != MASK}, null[MASK]
    return jax.tree.map(jnp.zeros_like, tokens), jnp.zeros_like(mask)


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


def batch_size(tree) -> int:
    """Rows of a pytree whose leaves all have the batch on axis 0."""
    return int(np.shape(jax.tree.leaves(tree)[0])[0])


def take(tree, rows):
    """Rows ``rows`` (indices, a boolean mask or a slice) of every leaf."""
    return jax.tree.map(lambda a: a[rows], tree)


def concat(trees: Sequence):
    """Host chunks of one structure, concatenated along the batch (numpy)."""
    return jax.tree.map(lambda *a: np.concatenate(a), *trees)


def repeat(tree, n: int):
    """Each row ``n`` times in a row (``jnp.repeat`` on axis 0 of every leaf)."""
    return jax.tree.map(lambda a: jnp.repeat(a, n, axis=0), tree)


def flatten(tree: Mapping, prefix: str = "") -> dict:
    """A nested dict of arrays as one flat dict named ``"a/b"`` (for npz files and
    broadcasts); the inverse of :func:`unflatten`."""
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if SEP in str(k):
            raise ValueError(f"key {k!r}: contains {SEP!r}, which flat names reserve; rename it")
        if isinstance(v, Mapping):
            out.update(flatten(v, name + SEP))
        else:
            out[name] = v
    return out


def unflatten(flat: Mapping) -> dict:
    """Flat ``"a/b"`` names back to nested dicts (:func:`flatten`'s inverse)."""
    out: dict = {}
    for name, v in flat.items():
        node = out
        *parents, leaf = name.split(SEP)
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out
