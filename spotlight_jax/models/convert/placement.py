"""Parameters placed onto their shardings as they are converted, one source tensor at a time.

``assemble(parts, shape, dtype, sharding)`` builds one parameter from its converted parts (one,
or one per stacked block along axis 0) straight into the host buffers of the shards this process
holds, then onto the devices: loading a checkpoint never holds more than one parameter's local
shards and one source tensor on the host.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def assemble(parts: list, shape: tuple, dtype: np.dtype, sharding) -> jax.Array:
    """One parameter on ``sharding`` from its converted parts (one part, or one per stacked
    block along axis 0): each part is converted once and copied into the host buffers of the
    distinct local shards only, then each shard goes to its devices. ``sharding`` None: one
    uncommitted array on the default device (jit may still move it), as ``jnp.asarray``."""
    if sharding is None:
        buf = np.empty(shape, dtype)
        for i, part in enumerate(parts):
            if len(parts) > 1:
                buf[i] = part()
            else:
                buf[...] = part()
        return jnp.asarray(buf)
    indices = sharding.addressable_devices_indices_map(shape)
    buffers: dict = {}
    for index in indices.values():
        key = index_key(index, shape)
        if key not in buffers:
            buffers[key] = np.empty(tuple(b - a for a, b in key), dtype)
    stacked = len(parts) > 1
    for i, part in enumerate(parts):
        a = np.asarray(part())
        for key, buf in buffers.items():
            if stacked:
                (lo, hi), rest = key[0], key[1:]
                if lo <= i < hi:
                    buf[i - lo] = a[tuple(slice(x, y) for x, y in rest)]
            else:
                buf[...] = a[tuple(slice(x, y) for x, y in key)]
        del a
    arrays = [jax.device_put(buffers[index_key(index, shape)], d)
              for d, index in indices.items()]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def index_key(index: tuple, shape: tuple) -> tuple:
    """A device's index (a tuple of slices) as ``((start, stop), ...)`` per dimension."""
    return tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))


def stack_parts(thunks: dict, stacks: dict) -> dict:
    """``{state path: [part functions]}`` for :func:`assemble` from ``thunks`` (``{path:
    function}`` of each converted tensor, a block's under ``(group, i, ...)``): each parameter
    of a scanned stack (``stacks``: its top-level group -> its number of blocks) gets one part
    per block, in order; every other parameter one part. A stack of one block keeps its axis."""
    out = {p: [f] for p, f in thunks.items() if p[0] not in stacks}
    for group, n in stacks.items():
        for suffix in sorted({p[2:] for p in thunks if p[0] == group}, key=str):
            parts = [thunks[(group, i) + suffix] for i in range(n)]
            if n == 1:          # one part is taken whole by assemble: give it the block axis
                parts = [lambda f=parts[0]: np.asarray(f())[None]]
            out[(group,) + suffix] = parts
    return out


def fill(state, parts: dict, dtype, shardings=None, what: str = "model") -> None:
    """Replaces every abstract parameter of the nnx ``state`` (from ``nnx.eval_shape``) by its
    :func:`assemble`-d array: ``parts`` ``{state path: [part functions]}``, cast to ``dtype``,
    placed on ``shardings(path, shape)`` (None: the default device). A parameter left abstract
    is a ValueError naming the first ones (``what``: the model, for the message)."""
    pure = nnx.to_pure_dict(state)
    place = shardings or (lambda path, shape: None)
    for path, fns in parts.items():
        node = pure
        for key in path[:-1]:
            node = node[key]
        shape = tuple(node[path[-1]].shape)
        node[path[-1]] = assemble(fns, shape, np.dtype(dtype), place(path, shape))
    leftover = [p for p, v in jax.tree_util.tree_leaves_with_path(pure)
                if isinstance(v, jax.ShapeDtypeStruct)]
    if leftover:
        raise ValueError(f"{what} parameters left unconverted: {leftover[:3]}")
    nnx.replace_by_pure_dict(state, pure)
