"""The emulated deployment: spot availability over (virtual) time and what each phase costs.

The learning in every mode is real computation; the *time axis* of a CPU run is emulated. This
module holds the deployment (on-demand devices, spot nodes of SP groups), replays a spot trace
(SkyPilot file or synthetic Poisson, ``emulation.traces``) on the run's clock, and charges each
phase its duration from the cost model (``emulation.cost_models``: FLOPs of the paper-scale model
on a named accelerator, or measured timings). Preemptions inside a phase cost what the
scheduler's rules say they cost: a notice commits in-flight state (only a regroup latency), an
abrupt loss redoes the work since the last periodic commit.

:class:`Deployment` takes frozen configs only; ``config.make_deployment(config)`` makes them
from a run's config.
"""
from __future__ import annotations

import dataclasses
import math

from spotlight_jax.emulation.clock import DeviceGroup, EventCursor, VirtualClock
from spotlight_jax.emulation.cost_models import CostConfig, Workload, make_cost_model
from spotlight_jax.emulation.traces import TraceConfig, replay

SHARED_UPDATES = ("off", "fixed", "auto", "payoff")


@dataclasses.dataclass(frozen=True)
class DeploymentConfig:
    """The emulated hardware: ``on_demand_devices`` reserved devices plus ``spot_nodes`` spot
    nodes of ``spot_devices_per_node`` devices, each node one SP group of degree ``spot_sp``;
    scheduled rollouts commit in-flight state every ``commit_every`` steps (what an abrupt loss
    redoes). ``scheduler``: rollouts go through the pull scheduler (``sched``).

    ``shared_update``: the spot modes' update cut into ``update_shards`` gradient shards per
    optimizer step that live spot groups help compute (``runner.shared_update``): 'off' (the
    trainer alone), 'fixed' (the spot groups may take ``update_spot_share`` of the shards) or
    'auto' (the share that makes the iteration's critical path shortest, exploration taking
    the spot time left) or 'payoff' (the share with the least expected time per unit of
    progress: exploration's selection gain, learned online by the planner, raised to
    ``update_payoff_exponent``, against the iteration's seconds)."""

    on_demand_devices: int = 4
    spot_nodes: int = 4
    spot_devices_per_node: int = 2
    spot_sp: int = 2
    commit_every: int = 2
    scheduler: bool = True
    shared_update: str = "off"
    update_spot_share: float = 1.0
    update_shards: int = 8
    update_payoff_exponent: float = 0.75

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

        if self.shared_update not in SHARED_UPDATES:
            bad("shared_update", f"choose one of {', '.join(map(repr, SHARED_UPDATES))}")
        if not 0.0 <= self.update_spot_share <= 1.0:
            bad("update_spot_share", "must be in [0, 1] (the share of an update's shards the "
                                     "spot groups may take)")
        if self.update_shards < 1:
            bad("update_shards", "must be >= 1")
        if not (self.update_payoff_exponent > 0 and math.isfinite(self.update_payoff_exponent)):
            bad("update_payoff_exponent", "must be finite and > 0 (progress per iteration as a "
                                          "power of the selected/base variance ratio)")

        for name in ("on_demand_devices", "spot_devices_per_node", "spot_sp", "commit_every"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        if self.spot_nodes < 0:
            bad("spot_nodes", "must be >= 0")
        if self.spot_devices_per_node % self.spot_sp:
            bad("spot_sp", f"must divide spot_devices_per_node={self.spot_devices_per_node} "
                           "(one SP group per node)")


class Deployment:
    """On-demand devices + spot nodes whose availability follows a trace on a virtual clock.

    ``num_steps``: denoising steps of a rollout (an abrupt loss redoes ``commit_every`` of
    them); ``horizon_s``: the length of a synthetic trace. ``rents_spot``: whether the run
    rents the spot nodes at all; a run that never uses one (``baseline``, ``explore_sync``) pays
    for its on-demand devices only, as an operator running it would.
    """

    def __init__(self, cfg: DeploymentConfig, trace: TraceConfig, cost: CostConfig,
                 workload: Workload, num_steps: int, horizon_s: float = 7 * 24 * 3600.0,
                 rents_spot: bool = True):
        self.cfg, self.trace_cfg, self.cost_cfg = cfg, trace, cost
        self.rents_spot = bool(rents_spot)
        self.cost = make_cost_model(cost, workload)
        self.num_steps = int(num_steps)
        spot_trace = trace.load(cfg.spot_nodes, horizon_s)
        self.trace_source = spot_trace.source
        self.replay = replay(spot_trace, cfg.spot_nodes, trace.replay_config())
        self.events = EventCursor(list(self.replay.events))
        self.alive_nodes = set(self.replay.initial_alive)
        self.clock = VirtualClock()
        self.od = DeviceGroup("on_demand", "on_demand", cfg.on_demand_devices)
        self.stats = {"preemptions": 0, "abrupt_losses": 0, "joins": 0, "regroups": 0,
                      "regroup_s": 0.0, "lost_work_s": 0.0}
        self._sync_alive()

    # -- availability ----------------------------------------------------------------------
    @property
    def spot_devices(self) -> int:
        return len(self.alive_nodes) * self.cfg.spot_devices_per_node

    def spot_group(self) -> DeviceGroup:
        return DeviceGroup("spot", "spot", max(self.spot_devices, 1))

    def _sync_alive(self):
        self.clock.set_alive("on_demand", self.cfg.on_demand_devices, at=self.clock.now())
        self.clock.set_alive("spot", self.spot_devices if self.rents_spot else 0,
                             at=self.clock.now())

    def advance(self, busy_spot_phase_s: float = 0.0):
        """Applies the trace events up to the clock's time. A loss while spot groups were busy
        costs lost work (abrupt: since the last commit) or a commit+regroup (notice)."""
        for e in self.events.events_until(self.clock.now()):
            if e.kind == "join":
                self.alive_nodes.add(e.node)
                self.stats["joins"] += 1
                self.stats["regroups"] += 1
                self.stats["regroup_s"] += self.cost.regroup("grow")
            elif e.kind == "loss" and e.node in self.alive_nodes:
                self.alive_nodes.discard(e.node)
                self.stats["preemptions"] += 1
                self.stats["regroups"] += 1
                self.stats["regroup_s"] += self.cost.regroup("shrink")
                if e.abrupt:
                    self.stats["abrupt_losses"] += 1
                    if busy_spot_phase_s > 0:
                        step = busy_spot_phase_s / max(self.num_steps, 1)
                        self.stats["lost_work_s"] += step * self.cfg.commit_every
        self._sync_alive()

    # -- phase durations -------------------------------------------------------------------
    def rollout_s(self, n: int, use_spot: bool) -> float:
        """Rollouts of ``n`` trajectories on the on-demand devices (data parallel) plus, when
        ``use_spot``, the live spot groups; pull-based sizing balances them (capacity-weighted)."""
        od_groups = self.cfg.on_demand_devices
        sp = self.cfg.spot_sp
        spot_groups = self.spot_devices // sp if use_spot else 0
        # capacity in trajectories/s of each group type at a batch of 8
        cap_od = 8 / self.cost.rollout(8, sp=1)
        cap_sp = 8 / self.cost.rollout(8, sp=sp)
        total = od_groups * cap_od + spot_groups * cap_sp
        per_od = max(1, math.ceil(n * cap_od / total))
        t = self.cost.rollout(per_od, sp=1)
        if spot_groups:
            per_sp = max(1, math.ceil(n * cap_sp / total))
            t = max(t, self.cost.rollout(per_sp, sp=sp))
        return t

    def spot_seconds_per_candidate(self) -> float:
        """Device-seconds of one exploration candidate on a spot group: its rollout (batch of
        8) and its reward, which the group computes itself (so a candidate's image never leaves
        the group, and a pipelined batch arrives rewarded)."""
        sp = self.cfg.spot_sp
        return sp * (self.cost.rollout(8, sp=sp) / 8 + self.cost.reward(1))

    def od_seconds_per_candidate(self) -> float:
        return self.cost.rollout(8, sp=1) / 8

    def train_s(self, n: int) -> float:
        return self.cost.train(n, self.cfg.on_demand_devices)

    def reward_s(self, n: int) -> float:
        return self.cost.reward(n)

    def dollars(self) -> float:
        return self.cost.dollars(self.clock)

    # -- a rollout phase through the pull scheduler ----------------------------------------
    def scheduler_setup(self, num_devices: int, horizon_s: float) -> dict:
        """What ``sched.Simulation`` needs to run a rollout phase starting now: the pool layout
        (``od0`` + the spot nodes, with the trace's node names), the step-time model from the
        cost model, the trace events of the next ``horizon_s`` seconds in phase-relative time,
        and the spot nodes that are down at the start.

        The layout is the deployment's when ``num_devices`` real devices hold it; otherwise
        (8 emulated CPU devices for 4 + 4 x 2) each spot node gets one device and ``od0`` the
        rest: the devices then only carry group identities, time comes from ``cost``.
        """
        from spotlight_jax.elastic import PoolConfig  # noqa: PLC0415
        from spotlight_jax.sched import SimEvent, StepCost  # noqa: PLC0415

        c = self.cfg
        od, per_node = c.on_demand_devices, c.spot_devices_per_node
        if od + c.spot_nodes * per_node > num_devices:
            od, per_node = num_devices - c.spot_nodes, 1
            if od < 1:
                raise ValueError(f"{num_devices} devices cannot hold an on-demand node and "
                                 f"{c.spot_nodes} spot nodes; raise num_cpu_devices or lower "
                                 "deployment.spot_nodes")
        nodes = (("od0", "on_demand", od),) + tuple(
            (f"spot{i}", "spot", per_node) for i in range(c.spot_nodes))
        now = self.clock.now()
        upcoming = self.events.events[self.events.position:]
        events = [SimEvent(e.time - now, e.kind, e.node,
                           deadline=None if e.deadline is None else e.deadline - now,
                           abrupt=e.abrupt)
                  for e in upcoming if 0.0 <= e.time - now <= horizon_s]
        step = self.cost.rollout_step(8, sp=1) / 8
        return {"pool": PoolConfig(nodes=nodes),
                "cost": StepCost(sample_step_s=step, call_overhead_s=0.0,
                                 commit_s=self.cost_cfg.collective_latency_s),
                "events": events,
                "down_at_start": [f"spot{i}" for i in range(c.spot_nodes)
                                  if f"spot{i}" not in self.alive_nodes],
                "sample_step_s": step}

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"clock": self.clock.state_dict(), "events": self.events.state_dict(),
                "alive_nodes": sorted(self.alive_nodes), "stats": dict(self.stats)}

    def load_state_dict(self, s: dict) -> None:
        self.clock.load_state_dict(s["clock"])
        self.events.load_state_dict(s["events"])
        self.alive_nodes = set(s["alive_nodes"])
        self.stats = dict(s["stats"])

    def assumptions(self) -> list:
        return self.cost.describe()
