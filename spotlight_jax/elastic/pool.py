"""Device pool: which device belongs to which node, with which role, and whether it is alive.

The elastic layer reasons about *nodes* (hosts: a spot instance is preempted as a whole) and
*devices* (a GPU can also fail alone). On one machine the nodes are emulated by carving the local
devices into named groups, e.g. 8 CPU devices = one on-demand node of 4 + two spot nodes of 2
(:class:`PoolConfig`). On a GPU host :meth:`DevicePool.local` puts the real local devices in one
node.

Liveness here is bookkeeping only: marking a device lost does not touch its buffers. Code that moves
state (``state_move``) consults the pool and must never read a buffer on a device the pool says is
dead -- on real hardware that memory is gone, and on CPU dispatching on a deleted buffer crashes.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import jax

logger = logging.getLogger(__name__)

ROLES = ("on_demand", "spot")


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """Layout of the pool: ``nodes`` is a tuple of ``(node name, role, number of devices)``.

    Devices are assigned to nodes in order (the first 4 devices to the first node of 4, ...), so a
    node's devices are consecutive, which keeps each SP group a contiguous run of device ids.
    """

    nodes: tuple[tuple[str, str, int], ...] = (
        ("od0", "on_demand", 4), ("spot0", "spot", 2), ("spot1", "spot", 2))

    @property
    def num_devices(self) -> int:
        return sum(n for _, _, n in self.nodes)

    def validate(self) -> None:
        if not self.nodes:
            raise ValueError("PoolConfig.nodes is empty: the pool needs at least one node")
        for entry in self.nodes:
            if not isinstance(entry, tuple) or len(entry) != 3:
                raise ValueError(f"PoolConfig entry {entry!r} is not (name, role, num_devices)")
        names = [entry[0] for entry in self.nodes]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"PoolConfig.nodes names {dupes} more than once; names are unique")
        for name, role, n in self.nodes:
            if role not in ROLES:
                raise ValueError(f"node {name!r} has role {role!r}; the role is one of {ROLES}")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"node {name!r} has {n!r} devices; it needs a positive integer")


@dataclasses.dataclass(frozen=True)
class PoolEvent:
    """One change of the pool: ``kind`` is 'lost' or 'joined'; ``devices`` are the device ids."""

    seq: int
    kind: str
    node: str
    devices: tuple[int, ...]
    time: float | None = None  # trace/virtual time when given, else None
    reason: str = ""


class DevicePool:
    """Devices grouped into nodes with roles, each alive or not, with an event history."""

    def __init__(self, config: PoolConfig = PoolConfig(),
                 devices: Sequence[jax.Device] | None = None):
        config.validate()
        devices = list(jax.devices() if devices is None else devices)
        if config.num_devices > len(devices):
            layout = ", ".join(f"{name}({role})={n}" for name, role, n in config.nodes)
            raise ValueError(
                f"pool layout needs {config.num_devices} devices ({layout}) but only "
                f"{len(devices)} exist; shrink the layout or emulate more devices "
                "(XLA_FLAGS=--xla_force_host_platform_device_count=N)")
        if config.num_devices < len(devices):
            logger.info("pool layout uses %d of %d devices; the rest stay outside the pool",
                        config.num_devices, len(devices))
        self.config = config
        self._node_devices: dict[str, tuple[jax.Device, ...]] = {}
        self._role: dict[str, str] = {}
        self._node_of: dict[int, str] = {}
        self._device: dict[int, jax.Device] = {}
        i = 0
        for name, role, n in config.nodes:
            devs = tuple(devices[i:i + n])
            i += n
            self._node_devices[name] = devs
            self._role[name] = role
            for d in devs:
                self._node_of[d.id] = name
                self._device[d.id] = d
        self._alive: set[int] = set(self._device)
        self._history: list[PoolEvent] = []

    @classmethod
    def local(cls, role: str = "spot", name: str | None = None) -> DevicePool:
        """A pool of one node holding this process's real local devices (a GPU host)."""
        devices = jax.local_devices()
        name = name or f"host{jax.process_index()}"
        return cls(PoolConfig(nodes=((name, role, len(devices)),)), devices)

    # ---- queries ---------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._node_devices)

    def nodes_with_role(self, role: str) -> tuple[str, ...]:
        self._check_role(role)
        return tuple(n for n in self._node_devices if self._role[n] == role)

    def role(self, node: str) -> str:
        self._check_node(node)
        return self._role[node]

    def node_of(self, device: jax.Device | int) -> str | None:
        """The node of a device, or None for a device outside the pool."""
        return self._node_of.get(_id(device))

    def is_alive(self, device: jax.Device | int) -> bool:
        return _id(device) in self._alive

    def devices(self, node: str | None = None, role: str | None = None,
                alive: bool | None = True) -> tuple[jax.Device, ...]:
        """Devices in pool order, filtered by node, role and liveness (None = either)."""
        if node is not None:
            self._check_node(node)
        if role is not None:
            self._check_role(role)
        out = []
        for name, devs in self._node_devices.items():
            if node is not None and name != node:
                continue
            if role is not None and self._role[name] != role:
                continue
            out.extend(d for d in devs if alive is None or (d.id in self._alive) == alive)
        return tuple(out)

    def alive_devices(self, node: str) -> tuple[jax.Device, ...]:
        return self.devices(node=node, alive=True)

    def alive_by_node(self, role: str | None = None) -> dict[str, tuple[jax.Device, ...]]:
        """Alive devices of every node (with the given role), nodes with none included."""
        return {n: self.alive_devices(n) for n in self._node_devices
                if role is None or self._role[n] == role}

    def alive_by_role(self) -> dict[str, tuple[jax.Device, ...]]:
        return {r: self.devices(role=r) for r in ROLES}

    def dead_device_ids(self) -> frozenset[int]:
        return frozenset(set(self._device) - self._alive)

    @property
    def history(self) -> tuple[PoolEvent, ...]:
        return tuple(self._history)

    # ---- changes ---------------------------------------------------------------------------
    def mark_lost(self, devices: Iterable[jax.Device | int], *, time: float | None = None,
                  reason: str = "") -> list[PoolEvent]:
        """Marks devices dead (one event per node touched). Already-dead devices are ignored."""
        return self._change(devices, alive=False, time=time, reason=reason)

    def mark_joined(self, devices: Iterable[jax.Device | int], *, time: float | None = None,
                    reason: str = "") -> list[PoolEvent]:
        """Marks devices alive again (one event per node touched)."""
        return self._change(devices, alive=True, time=time, reason=reason)

    def mark_node_lost(self, node: str, *, time: float | None = None,
                       reason: str = "") -> list[PoolEvent]:
        self._check_node(node)
        return self.mark_lost(self._node_devices[node], time=time, reason=reason)

    def mark_node_joined(self, node: str, *, time: float | None = None,
                         reason: str = "") -> list[PoolEvent]:
        self._check_node(node)
        return self.mark_joined(self._node_devices[node], time=time, reason=reason)

    def apply(self, event) -> list[PoolEvent]:
        """Applies a trace event (``traces.SpotEvent``): 'loss' and 'join' change liveness; a
        'notice' changes nothing (the node is still alive until its deadline)."""
        if event.kind == "loss":
            return self.mark_node_lost(event.node, time=event.time,
                                       reason="abrupt loss" if event.abrupt else "preempted")
        if event.kind == "join":
            return self.mark_node_joined(event.node, time=event.time, reason="join")
        return []

    # ---- internals -------------------------------------------------------------------------
    def _change(self, devices, *, alive: bool, time, reason) -> list[PoolEvent]:
        ids = [_id(d) for d in devices]
        unknown = [i for i in ids if i not in self._device]
        if unknown:
            raise ValueError(f"devices {unknown} are not in the pool (pool devices: "
                             f"{sorted(self._device)})")
        per_node: dict[str, list[int]] = {}
        for i in ids:
            if (i in self._alive) != alive:
                per_node.setdefault(self._node_of[i], []).append(i)
        events = []
        for node, changed in per_node.items():
            if alive:
                self._alive.update(changed)
            else:
                self._alive.difference_update(changed)
            ev = PoolEvent(seq=len(self._history), kind="joined" if alive else "lost", node=node,
                           devices=tuple(sorted(changed)), time=time, reason=reason)
            self._history.append(ev)
            events.append(ev)
            logger.info("pool: node %s %s devices %s%s", node, ev.kind, list(ev.devices),
                        f" ({reason})" if reason else "")
        return events

    def _check_node(self, node: str) -> None:
        if node not in self._node_devices:
            raise KeyError(f"unknown node {node!r}; pool nodes are {list(self._node_devices)}")

    @staticmethod
    def _check_role(role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {ROLES}")

    def __repr__(self) -> str:
        parts = [f"{n}({self._role[n]}: {len(self.alive_devices(n))}/{len(d)} alive)"
                 for n, d in self._node_devices.items()]
        return f"DevicePool({', '.join(parts)})"


def _id(device: jax.Device | int) -> int:
    return device if isinstance(device, int) else device.id

