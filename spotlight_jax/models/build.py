"""Building an MMDiT: abstractly (shapes only) or with parameters created directly in their
sharded layout (``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``), never on one
device first."""
from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from spotlight_jax.models.mmdit import MMDiT, MMDiTConfig
from spotlight_jax.parallel.sharding import param_specs


def abstract_model(cfg: MMDiTConfig, seed: int = 0):
    """``(graphdef, abstract_state)`` without allocating parameters."""
    return nnx.split(nnx.eval_shape(lambda: MMDiT(cfg, rngs=nnx.Rngs(seed))))


def create_model(cfg: MMDiTConfig, mesh: Mesh | None = None, seed: int = 0):
    """``(graphdef, state)`` with parameters created directly in their sharded layout."""
    graphdef, abstract = abstract_model(cfg, seed)

    def init():
        return nnx.split(MMDiT(cfg, rngs=nnx.Rngs(seed)))[1]

    if mesh is None:
        return graphdef, jax.jit(init)()
    shardings = param_specs(abstract, mesh)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), shardings,
                             is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return graphdef, jax.jit(init, out_shardings=shardings)()
