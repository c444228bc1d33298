"""Meshes, sharding rules and sequence-parallel attention (imports only jax)."""
from spotlight_jax.parallel.attention import STRATEGIES, attention
from spotlight_jax.parallel.kernels import IMPLEMENTATIONS, Kernel
from spotlight_jax.parallel.kernels import resolve as resolve_kernel
from spotlight_jax.parallel.mesh import MESH_AXES, MeshConfig, device_key, make_mesh
from spotlight_jax.parallel.sharding import DEFAULT_RULES, logical_to_spec, param_specs

__all__ = ["STRATEGIES", "attention", "IMPLEMENTATIONS", "Kernel", "resolve_kernel", "MESH_AXES",
           "MeshConfig", "device_key", "make_mesh", "DEFAULT_RULES", "logical_to_spec",
           "param_specs"]
