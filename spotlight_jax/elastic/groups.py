"""Regrouping: form sequence-parallel (SP) groups from the alive devices of each node.

Groups never span nodes: a spot node is preempted as a whole, so a group that spans two nodes
would be lost with either, and intra-node links are the fast ones. Within a node the alive devices
(in pool order) are cut into groups of the target SP degree; what is left forms one smaller group
(``remainder='sp'``, "use what is left") or one data-parallel group of SP degree 1 on the ``data``
axis (``remainder='data'``).

The attention strategy follows from the head count: Ulysses needs ``heads % degree == 0``; otherwise
ring attention (needs no head divisibility), or, with ``allow_usp``, a 2-D Ulysses x ring split when
some Ulysses degree > 1 divides both. Every fallback is logged in one line saying why.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import jax
from jax.sharding import Mesh

from spotlight_jax.parallel.mesh import MeshConfig, device_key, make_mesh

logger = logging.getLogger(__name__)

REMAINDER_POLICIES = ("sp", "data")


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """``heads``: the model's attention heads. ``sp_degree``: target devices per group (0 = all
    alive devices of the node in one group). ``allow_usp``: allow the 2-D Ulysses x ring split
    (off by default: the attention contract takes one ``sp`` axis and no Ulysses degree).
    ``remainder``: what the devices left over after full groups become ('sp' or 'data')."""

    heads: int
    sp_degree: int = 0
    allow_usp: bool = False
    remainder: str = "sp"

    def __post_init__(self):
        if self.heads < 1:
            raise ValueError(f"GroupConfig.heads must be >= 1, got {self.heads}")
        if self.sp_degree < 0:
            raise ValueError(f"GroupConfig.sp_degree must be >= 0 (0 = whole node), "
                             f"got {self.sp_degree}")
        if self.remainder not in REMAINDER_POLICIES:
            raise ValueError(f"GroupConfig.remainder must be one of {REMAINDER_POLICIES}, "
                             f"got {self.remainder!r}")


@dataclasses.dataclass(frozen=True)
class SPGroup:
    """One SP group: its node, devices, SP degree, attention strategy and mesh.

    ``ulysses_degree`` is the head-split factor (``degree`` for 'ulysses', a divisor for 'usp', 1
    otherwise). ``reason`` says why the strategy was chosen when it is a fallback.
    """

    node: str
    devices: tuple[jax.Device, ...]
    degree: int
    strategy: str
    mesh: Mesh
    ulysses_degree: int = 1
    reason: str = ""

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d.id for d in self.devices)

    @property
    def key(self) -> tuple[int, ...]:
        """The executable-cache identity of this group's mesh (exact device tuple + shape)."""
        return device_key(self.mesh)


def choose_strategy(heads: int, degree: int, *, allow_usp: bool = False) -> tuple[str, int, str]:
    """Returns ``(strategy, ulysses_degree, reason)`` for ``degree`` devices; reason is '' unless
    the choice is a fallback from Ulysses."""
    if degree == 1:
        return "dense", 1, ""
    if heads % degree == 0:
        return "ulysses", degree, ""
    if allow_usp:
        for u in range(degree - 1, 1, -1):
            if degree % u == 0 and heads % u == 0:
                return "usp", u, (f"{heads} heads not divisible by SP degree {degree}; usp with "
                                  f"ulysses {u} x ring {degree // u}")
    return "ring", 1, f"{heads} heads not divisible by SP degree {degree}; ring attention"


def form_node_groups(node: str, devices: Sequence[jax.Device], config: GroupConfig,
                     *, log: bool = True) -> tuple[SPGroup, ...]:
    """SP groups over the alive ``devices`` of one node, in the given device order."""
    devices = tuple(devices)
    if not devices:
        return ()
    target = config.sp_degree or len(devices)
    chunks = [devices[i:i + target] for i in range(0, len(devices) - len(devices) % target, target)]
    rest = devices[len(chunks) * target:]
    groups = [_sp_group(node, c, config, log) for c in chunks]
    if rest:
        if config.remainder == "data" and len(rest) < len(devices):
            mesh = make_mesh(rest, MeshConfig(data=len(rest), fsdp=1, sp=1))
            groups.append(SPGroup(node, rest, 1, "dense", mesh, 1,
                                  f"{len(rest)} devices left after groups of {target}: "
                                  "data-parallel remainder"))
        else:
            groups.append(_sp_group(node, rest, config, log))
    return tuple(groups)


def form_groups(pool, config: GroupConfig, role: str | None = "spot",
                *, log: bool = True) -> tuple[SPGroup, ...]:
    """SP groups of every node of ``pool`` with ``role`` (None = all nodes), from alive devices."""
    out: list[SPGroup] = []
    for node, devices in pool.alive_by_node(role).items():
        out.extend(form_node_groups(node, devices, config, log=log))
    return tuple(out)


def _sp_group(node: str, devices: tuple[jax.Device, ...], config: GroupConfig,
              log: bool) -> SPGroup:
    degree = len(devices)
    strategy, u, reason = choose_strategy(config.heads, degree, allow_usp=config.allow_usp)
    if reason and log:
        logger.info("node %s group %s: %s", node, [d.id for d in devices], reason)
    mesh = make_mesh(devices, MeshConfig(data=1, fsdp=1, sp=degree))
    return SPGroup(node, devices, degree, strategy, mesh, u, reason)
