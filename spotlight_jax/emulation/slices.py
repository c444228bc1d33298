"""TPU slices: the fixed topologies a TPU is rented in, as chips and hosts.

A TPU is rented as a slice: chips in a fixed topology (v5e ``2x4``: 8 chips on one host;
``4x4``: 16 chips on 2 hosts; v5p ``2x2x2``: 8 chips on 2 hosts) joined by ICI. A spot slice is
preempted whole, every host of a multi-host slice at once, after GCP's 30 s notice. In the
emulated deployment one spot node is one slice (``DeploymentConfig.spot_slice``): the trace
counts slices, a loss removes all of a slice's chips in one event, and the slice's SP groups
lie within it, so their collectives run over ICI (``cost_models.ProfileCost.sp_comm``).
"""
from __future__ import annotations

import dataclasses
import math
import re

from spotlight_jax.emulation.datasheets import device_spec, tpu_devices

_TOPOLOGY = re.compile(r"[1-9]\d*(x[1-9]\d*){1,2}")


@dataclasses.dataclass(frozen=True)
class SliceShape:
    """One slice of ``device`` (a key of ``datasheets.DEVICES``) in ``topology``: ``chips``
    chips on ``hosts`` hosts (a slice smaller than a host counts as one, sharing it)."""

    device: str
    topology: str
    chips: int
    hosts: int

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    def describe(self) -> str:
        spec = device_spec(self.device)
        return (f"{spec.label} {self.topology} slice ({self.chips} chips on {self.hosts} "
                f"host{'s' if self.hosts > 1 else ''})")


def topology_chips(topology: str) -> int:
    """The chips of a topology string (``"4x8"`` -> 32, ``"2x2x1"`` -> 4)."""
    if not isinstance(topology, str) or not _TOPOLOGY.fullmatch(topology):
        raise ValueError(f"topology={topology!r}: write chips per axis, e.g. '2x4' or '2x2x1'")
    return math.prod(int(n) for n in topology.split("x"))


def slice_sizes(device: str) -> tuple[int, ...]:
    """The chip counts ``device``'s slices come in, smallest first."""
    return tuple(sorted({topology_chips(t) for t in device_spec(device).topologies}))


def slice_shape(device: str, topology: str) -> SliceShape:
    """The slice of ``device`` in ``topology``; a ValueError naming the value and the choices
    for a device that is not a TPU or a topology it does not come in."""
    spec = device_spec(device)
    if not spec.is_tpu:
        raise ValueError(f"device={device!r}: not a TPU (it has no slice topologies); choose "
                         f"one of {tpu_devices()}")
    if topology not in spec.topologies:
        raise ValueError(f"topology={topology!r}: not a {spec.label} slice topology; choose "
                         f"one of {', '.join(spec.topologies)}")
    chips = topology_chips(topology)
    return SliceShape(device, topology, chips, max(1, math.ceil(chips / spec.chips_per_host)))
