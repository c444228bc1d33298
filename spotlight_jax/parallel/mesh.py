"""Device layout: the one place that turns a device list into a mesh.

Every mesh in the project has the axes ``("data", "fsdp", "sp")`` (any may be 1). Meshes use
``AxisType.Auto`` so that jitted code can mix GSPMD-propagated shardings with explicit
``shard_map`` regions (attention) without annotating every intermediate.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "sp")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape. ``-1`` in at most one field means "whatever is left of the devices"."""

    data: int = -1
    fsdp: int = 1
    sp: int = 1

    def validate(self) -> MeshConfig:
        """Returns self, or raises a one-line ValueError naming the bad axis (``name=value:``)."""
        for name in MESH_AXES:
            v = getattr(self, name)
            if v == 0 or v < -1:
                raise ValueError(f"{name}={v!r}: must be >= 1, or -1 for the devices left")
        filled = [name for name in MESH_AXES if getattr(self, name) == -1]
        if len(filled) > 1:
            raise ValueError(f"{filled[1]}=-1: only one mesh axis may be -1 ({filled[0]}=-1 "
                             f"already takes the devices left; e.g. {filled[1]}=1)")
        return self

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        self.validate()
        dims = [self.data, self.fsdp, self.sp]
        known = math.prod(d for d in dims if d != -1)
        if -1 in dims:
            if num_devices % known:
                raise ValueError(
                    f"cannot fill mesh data/fsdp/sp={dims} with {num_devices} devices: "
                    f"{num_devices} is not a multiple of {known}; change the mesh config")
            dims[dims.index(-1)] = num_devices // known
        if math.prod(dims) != num_devices:
            raise ValueError(
                f"mesh data*fsdp*sp = {dims[0]}*{dims[1]}*{dims[2]} = {math.prod(dims)} does not "
                f"match {num_devices} devices; set one axis to -1 or fix the sizes")
        return tuple(dims)


def make_mesh(devices: Sequence[jax.Device] | None = None,
              config: MeshConfig = MeshConfig()) -> Mesh:
    """Builds the ``(data, fsdp, sp)`` mesh over ``devices`` (default: all devices).

    Devices keep the given order, so an SP group is a run of consecutive devices: callers that
    care about locality (one SP group per node) pass devices node by node.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = config.resolve(len(devices))
    arr = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(arr, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def device_key(mesh: Mesh) -> tuple[int, ...]:
    """Identity of a mesh for executable caches: the exact device tuple plus the shape."""
    return tuple(d.id for d in mesh.devices.flat) + tuple(mesh.devices.shape)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def place_batch(x, mesh: Mesh | None):
    """Puts a per-sample array (or a pytree of them, e.g. a prompt with its pooled embedding) on
    ``mesh``, each split over its (data, fsdp) axes when they divide the batch (else
    replicated), so replicated-parameter meshes run data-parallel, not redundantly. Without a
    mesh, on the default device. Always an explicit ``device_put``: the loop's programs take no
    host array implicitly (``tests/runner/test_transfer_guard.py``)."""
    if mesh is None:
        return jax.tree.map(jax.device_put, x)
    n = mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1)

    def place(a):
        spec = PartitionSpec(("data", "fsdp")) if a.shape[0] % n == 0 else PartitionSpec()
        return jax.device_put(a, NamedSharding(mesh, spec))

    return jax.tree.map(place, x)


# -- where the explorers and the emulated spot nodes live -----------------------------------

def fold_in(key: jax.Array, data: int) -> jax.Array:
    """``jax.random.fold_in(key, data)`` with the host integer ``data`` put on a device
    explicitly (a Python number handed to an eager op is an implicit transfer). Uncommitted, so
    it follows ``key`` and the result keeps ``key``'s placement: a program that takes the new
    key is not compiled again for a new one."""
    return jax.random.fold_in(key, on_device(np.uint32(data)))


def on_device(x) -> jax.Array:
    """A host scalar or array put on the default device explicitly and uncommitted (a jitted
    program places it with its other arguments, as it would a host value), for a program's
    non-batch argument."""
    return jax.device_put(np.asarray(x))


def explore_mesh(trainer_mesh: Mesh, devices=None, batch_multiple: int = 1) -> Mesh | None:
    """Where ``spotlight`` mode explores while the trainer updates: a data-parallel mesh over
    devices the trainer's mesh does not use (of ``devices``, default all), as many as the largest
    power of two that divides ``batch_multiple`` (the explorer's padded batch). None when the
    trainer holds every device: exploration then shares the trainer's devices."""
    used = {d.id for d in trainer_mesh.devices.flat}
    free = [d for d in (jax.devices() if devices is None else devices) if d.id not in used]
    n = 1
    while 2 * n <= len(free) and batch_multiple % (2 * n) == 0:
        n *= 2
    if not free:
        return None
    return make_mesh(free[-n:], MeshConfig(data=-1, fsdp=1, sp=1))


def fleet_devices(trainer_mesh: Mesh, devices, num_nodes: int, per_node: int):
    """Where the emulated spot nodes live in ``spotlight`` mode: ``(devices, per_node)`` with
    the last ``num_nodes * per_node`` devices the trainer's mesh does not use, or one device per
    node when fewer are free (the groups then run unsharded), or None when not even that fits."""
    used = {d.id for d in trainer_mesh.devices.flat}
    free = [d for d in devices if d.id not in used]
    for n in (per_node, 1):
        if n >= 1 and len(free) >= num_nodes * n:
            return free[len(free) - num_nodes * n:], n
    return None
