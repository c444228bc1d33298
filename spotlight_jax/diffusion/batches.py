"""Whole-batch helpers: the row operations every path does on a batch (a dict of arrays, a
prompt's ``tokens`` pytree among them, every leaf with the batch on axis 0), and the fixed-size
chunks that let one compiled program serve every call.

Slicing (:func:`take`), concatenating host chunks (:func:`concat`), repeating rows
(:func:`repeat`) never branch on what a leaf holds; :func:`flatten` / :func:`unflatten` turn a
nested batch into flat ``"a/b"`` names for npz files and broadcasts; :func:`padded_chunks` cuts
(prompt, seed) pairs into equal chunks, the last padded.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

SEP = "/"


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


def padded_chunks(prompts, seeds, chunk: int):
    """``(prompts, seeds, n)`` chunks of exactly ``chunk`` pairs, the last padded with copies of
    its last pair (``n`` real ones), so one compiled batch size serves every call."""
    prompts, seeds = list(prompts), np.asarray(seeds, np.uint32)
    for i in range(0, len(prompts), chunk):
        ps, ss = prompts[i:i + chunk], seeds[i:i + chunk]
        n = len(ps)
        if n < chunk:
            ps = ps + [ps[-1]] * (chunk - n)
            ss = np.concatenate([ss, np.repeat(ss[-1:], chunk - n)])
        yield ps, ss, n
