"""Logical axis names -> mesh axes: the one rule table of the project.

Model code names the axes of every parameter (``embed``, ``mlp``, ``heads``, ...) and of the
activations it constrains (``batch``, ``seq``). The rule table maps each logical name to a mesh axis
(or ``None`` = replicated). First match wins; a mesh axis is never used twice in one spec.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# (logical name, mesh axis or None). Weights are sharded over `fsdp` on their largest dim;
# activations over `data`/`fsdp` on batch and `sp` on the sequence.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("seq", "sp"),
    ("embed", "fsdp"),
    ("mlp", None),
    ("heads", None),
    ("qkv", None),
    ("vocab", None),
    ("patch", None),
    ("cond", None),
    ("lora", None),
    ("layers", None),
)


def validate_rules(rules: Sequence[tuple[str, object]]) -> None:
    names = [n for n, _ in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"logical axis rules name {dupes} more than once; first match would hide "
                         "the others. Keep one rule per logical name.")


def logical_to_spec(logical_axes: Sequence[str | None] | None,
                    rules: Sequence[tuple[str, object]] = DEFAULT_RULES,
                    mesh: Mesh | None = None) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec; unknown names and reused mesh axes replicate.

    With ``mesh`` given, mesh axes of size 1 are dropped (so specs print what is really sharded).
    """
    if logical_axes is None:
        return PartitionSpec()
    table = dict(rules)
    used: set[str] = set()
    out = []
    for name in logical_axes:
        target = table.get(name) if name is not None else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used
                     and (mesh is None or mesh.shape.get(a, 1) > 1))
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else (axes or None))
    return PartitionSpec(*out)


def _fit(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
    """Drops mesh axes that do not divide the dimension they shard (e.g. 3 heads over fsdp=2)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = 1
        for a in names:
            size *= mesh.shape[a]
        out.append(axes if size and dim % size == 0 else None)
    return PartitionSpec(*out)


def param_specs(state: nnx.State, mesh: Mesh,
                rules: Sequence[tuple[str, object]] = DEFAULT_RULES) -> nnx.State:
    """PartitionSpec for every variable of an NNX state, from its ``logical_axes`` metadata."""
    validate_rules(rules)

    def spec_of(var):
        axes = var.get_metadata().get("logical_axes") if hasattr(var, "get_metadata") else None
        value = var.get_value() if hasattr(var, "get_value") else var
        ndim = len(getattr(value, "shape", ()))
        if axes is not None and ndim == len(axes) + 1:
            axes = ("layers", *axes)  # stacked by a scan over blocks
        spec = logical_to_spec(axes, rules, mesh)
        return _fit(spec, tuple(getattr(value, "shape", ())), mesh)

    return jax.tree.map(spec_of, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def param_shardings(state: nnx.State, mesh: Mesh,
                    rules: Sequence[tuple[str, object]] = DEFAULT_RULES) -> nnx.State:
    specs = param_specs(state, mesh, rules)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                        is_leaf=lambda x: isinstance(x, PartitionSpec))


def shard_state(state: nnx.State, mesh: Mesh, rules=DEFAULT_RULES) -> nnx.State:
    """A copy of the NNX ``state`` placed on ``mesh`` following the rule table."""
    specs = param_specs(state, mesh, rules)
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    leaves, treedef = jax.tree.flatten(nnx.to_pure_dict(state))
    placed = [jax.device_put(a, NamedSharding(mesh, sp)) for a, sp in zip(leaves, flat_specs)]
    out = jax.tree.map(lambda x: x, state)
    nnx.replace_by_pure_dict(out, jax.tree.unflatten(treedef, placed))
    return out
