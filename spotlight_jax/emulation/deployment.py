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
from spotlight_jax.emulation.cost_models import Assumption, CostConfig, Workload, make_cost_model
from spotlight_jax.emulation.datasheets import device_spec, tpu_devices
from spotlight_jax.emulation.slices import SliceShape, slice_shape, slice_sizes, topology_chips
from spotlight_jax.emulation.traces import LEAD_TIME_PRESETS, TraceConfig, replay

SHARED_UPDATES = ("off", "fixed", "auto", "payoff")
PRICING_RULE = 2
"""The version of the rule this module prices phases by, recorded in every run's ``phases.json``.
1 (runs before it was recorded): ``baseline``'s rewards charged one image after another on the
critical path, a spot group's at twice one device's price, spot losses only between iterations,
regroups not charged. 2: one price per image on every device, split over the devices that hold
the images (:meth:`Deployment.reward_s`); a loss costs the work it interrupts and a join its
regroup (:meth:`Deployment.spot_phase`)."""


@dataclasses.dataclass(frozen=True)
class ModelSteps:
    """The pull scheduler's step-time model read from the deployment's cost model: a scheduled
    rollout step of ``batch`` trajectories on an SP group of ``sp`` devices costs what the same
    step costs in every other phase (``model.rollout_step``); committing a request costs
    ``commit_s``."""

    model: object
    commit_s: float = 0.0

    def rollout_step(self, batch: int, sp: int = 1) -> float:
        return self.model.rollout_step(batch, sp)


@dataclasses.dataclass(frozen=True)
class SpotPhase:
    """What the live spot nodes take for a phase's work (:meth:`Deployment.spot_phase`):
    ``seconds`` until they finish (or stop: no node left), the device-seconds redone after
    abrupt losses, the seconds no node was working, and the device-seconds left for the
    on-demand devices."""

    seconds: float
    lost_device_s: float
    stalled_s: float
    handover_device_s: float


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
    ``update_payoff_exponent``, against the iteration's seconds).

    ``spot_slice``: on a TPU (``cost.device``), the topology of every spot slice (``"2x4"``,
    ``"2x2x1"``: ``emulation.slices``); one spot node is one slice, so the trace counts slices
    and a loss removes every chip of a slice at once, and ``spot_devices_per_node`` is its
    chips. '' (the only choice on a GPU): nodes of ``spot_devices_per_node`` devices.
    :meth:`spot_slice_shape` checks it against the device and the trace's cloud."""

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
    spot_slice: str = ""

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
        if self.spot_slice:        # its format here; the device's topologies: spot_slice_shape
            try:
                topology_chips(self.spot_slice)
            except ValueError:
                bad("spot_slice", "write a TPU slice topology, chips per axis (e.g. "
                                  "spot_slice='2x4' or '2x2x1'), or '' for GPU nodes")

    def spot_slice_shape(self, device: str, cloud: str) -> SliceShape | None:
        """The spot slice of this deployment on ``device`` (a ``datasheets.DEVICES`` key) with
        the trace's ``cloud``, or None on a GPU. A ValueError naming the field and the fix for:
        a slice on a GPU, a TPU without one, a topology the TPU does not come in, nodes whose
        device count is not the slice's chips, on-demand chips that are no slice of the TPU
        (the trainer is one slice), and a cloud other than GCP (a TPU's 30 s notice)."""
        spec = device_spec(device)
        if not spec.is_tpu:
            if self.spot_slice:
                raise ValueError(f"spot_slice={self.spot_slice!r}: device={device!r} is not a "
                                 "TPU; leave spot_slice empty, or choose a TPU device "
                                 f"({', '.join(tpu_devices())})")
            return None
        if not self.spot_slice:
            raise ValueError(f"spot_slice='': device={device!r} is a TPU, rented in slices; "
                             f"set spot_slice='<topology>', one of "
                             f"{', '.join(spec.topologies)} (one spot node is one slice)")
        try:
            shape = slice_shape(device, self.spot_slice)
        except ValueError as e:
            raise ValueError(str(e).replace("topology=", "spot_slice=", 1)) from None
        if self.spot_devices_per_node != shape.chips:
            raise ValueError(f"spot_devices_per_node={self.spot_devices_per_node}: one spot "
                             f"node is one {shape.describe()}; set "
                             f"spot_devices_per_node={shape.chips}")
        sizes = slice_sizes(device)
        if self.on_demand_devices not in sizes:
            raise ValueError(f"on_demand_devices={self.on_demand_devices}: the on-demand "
                             f"{spec.label} chips are one slice (the trainer's, on ICI), of "
                             f"{', '.join(map(str, sizes))} chips; choose one of these")
        if cloud != "gcp":
            raise ValueError(f"cloud={cloud!r}: a TPU slice is GCP spot capacity, preempted "
                             f"after GCP's {LEAD_TIME_PRESETS['gcp']:g} s notice; set "
                             "cloud='gcp'")
        return shape


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
        self.slice = cfg.spot_slice_shape(cost.device, trace.cloud)
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

    def advance(self):
        """Applies the trace events up to the clock's time to the alive nodes and the event
        counts. What a loss or a join costs the work in flight is charged by the phase it fell
        into (:meth:`spot_phase`, or the pull scheduler's simulation of a rollout phase)."""
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
        self._sync_alive()

    def spot_phase(self, work_device_s: float) -> SpotPhase:
        """How long the live spot nodes take for ``work_device_s`` device-seconds of pulled work
        (rollouts, exploration candidates, gradient shards) starting now, with the trace's
        events inside the phase (read ahead, not consumed: :meth:`advance` applies them):

        * a lost node stops at its loss; without notice it also loses its in-flight work since
          its last commit (``commit_every`` denoising steps of a batch of 8 on each of its
          devices), which the survivors redo; with notice it commits and hands its requests
          back, so nothing is redone;
        * a joined node works from its join plus its regroup (``cost.regroup('grow')``: the
          weights copied device to device onto it);
        * each node is its own SP group, so a loss regroups no survivor.

        Work still queued when no node is left (none regrouping to join) goes to the
        on-demand devices (``SpotPhase.handover_device_s``), which the caller charges after
        they are free."""
        per_node = self.cfg.spot_devices_per_node
        sp = self.cfg.spot_sp
        redo = (per_node * self.cfg.commit_every
                * self.cost.rollout(8, sp=sp) / max(self.num_steps, 1))
        grow = self.cost.regroup("grow")
        now = self.clock.now()
        working = set(self.alive_nodes)
        joining: dict[str, float] = {}          # node -> when it starts working (phase time)
        upcoming = list(self.events.events[self.events.position:])
        while upcoming and upcoming[0].time < now:      # fell in an earlier phase: settled
            e = upcoming.pop(0)
            if e.kind == "join":
                working.add(e.node)
            elif e.kind == "loss":
                working.discard(e.node)
        t, left, lost, stalled, i = 0.0, float(work_device_s), 0.0, 0.0, 0
        while left > 1e-12:
            rate = per_node * len(working)
            next_event = upcoming[i].time - now if i < len(upcoming) else math.inf
            next_join = min(joining.values(), default=math.inf)
            nxt = min(next_event, next_join)
            if rate == 0 and not joining:
                break                   # no node left: the on-demand devices take the rest
            if rate > 0 and t + left / rate <= nxt:
                t += left / rate
                left = 0.0
                break
            if rate == 0:
                stalled += nxt - t
            left -= rate * (nxt - t)
            t = nxt
            if next_join <= next_event:
                node = min(joining, key=joining.get)
                working.add(node)
                del joining[node]
                continue
            e = upcoming[i]
            i += 1
            if e.kind == "join" and e.node not in working:
                joining.setdefault(e.node, t + grow)
            elif e.kind == "loss":
                joining.pop(e.node, None)
                if e.node in working:
                    working.discard(e.node)
                    if e.abrupt:
                        lost += redo
                        left += redo
        return SpotPhase(seconds=t, lost_device_s=lost, stalled_s=stalled,
                         handover_device_s=max(left, 0.0))

    # -- phase durations -------------------------------------------------------------------
    # -- phase durations -------------------------------------------------------------------
    def rollout_split(self, n: int, use_spot: bool) -> tuple[float, float]:
        """Seconds of a rollout phase of ``n`` trajectories on the on-demand devices (data
        parallel) and on the live spot groups (0.0 without ``use_spot``), each taking its
        capacity-weighted share (pull-based sizing balances them)."""
        od_groups = self.cfg.on_demand_devices
        sp = self.cfg.spot_sp
        spot_groups = self.spot_devices // sp if use_spot else 0
        # capacity in trajectories/s of each group type at a batch of 8
        cap_od = 8 / self.cost.rollout(8, sp=1)
        cap_sp = 8 / self.cost.rollout(8, sp=sp)
        total = od_groups * cap_od + spot_groups * cap_sp
        od_s = self.cost.rollout(max(1, math.ceil(n * cap_od / total)), sp=1)
        spot_s = (self.cost.rollout(max(1, math.ceil(n * cap_sp / total)), sp=sp)
                  if spot_groups else 0.0)
        return od_s, spot_s

    def rollout_s(self, n: int, use_spot: bool) -> float:
        """Rollouts of ``n`` trajectories on the on-demand devices plus, when ``use_spot``, the
        live spot groups, every spot node staying up (:meth:`rollout_split`)."""
        return max(self.rollout_split(n, use_spot))

    def charge_spot_work(self, phase, label: str, work_device_s: float) -> SpotPhase:
        """Charges ``work_device_s`` device-seconds of work on the live spot nodes into the
        open ``phase`` as :meth:`spot_phase` prices it: busy under ``label``, then the time the
        nodes lost to the trace (``spot_stall``: no node working, or the survivors redoing an
        abrupt loss's work). Returns the :class:`SpotPhase`; its ``handover_device_s`` is the
        caller's to charge on the on-demand devices."""
        spot = self.spot_phase(work_device_s)
        group = self.spot_group()
        done = work_device_s + spot.lost_device_s - spot.handover_device_s
        busy = min(done / group.num_devices, spot.seconds)
        with phase.sequential() as seq:
            seq.charge(group, busy, label)
            if spot.seconds > busy:
                seq.wait(spot.seconds - busy, "spot_stall")
        self.stats["lost_work_s"] += spot.lost_device_s
        return spot

    def spot_seconds_per_candidate(self) -> float:
        """Device-seconds of one exploration candidate on a spot group: its rollout (batch of
        8, on the group's ``spot_sp`` devices) and its reward (:meth:`reward_s`'s price, the
        same on every device), which the group computes itself (so a candidate's image never
        leaves the group, and a pipelined batch arrives rewarded)."""
        sp = self.cfg.spot_sp
        return sp * self.cost.rollout(8, sp=sp) / 8 + self.cost.reward(1)

    def od_seconds_per_candidate(self) -> float:
        """Device-seconds of one candidate on an on-demand device: its rollout and reward."""
        return self.cost.rollout(8, sp=1) / 8 + self.cost.reward(1)

    def train_s(self, n: int) -> float:
        return self.cost.train(n, self.cfg.on_demand_devices)

    def reward_s(self, n: int, devices: int) -> float:
        """Seconds to decode and score ``n`` images split over the ``devices`` devices that hold
        them. The price is one rule for every device kind and mode: ``cost.reward(1)``
        device-seconds per image, added to the rollouts' device time on the same devices (an
        accelerator that samples the next chunk while a reward runs shares its compute between
        them: the engine's overlap hides the host's wait, not device time)."""
        if devices < 1:
            raise ValueError(f"reward_s: {n} images need at least one device, got {devices}")
        return self.cost.reward(n) / devices

    def dollars(self) -> float:
        return self.cost.dollars(self.clock)

    # -- a rollout phase through the pull scheduler ----------------------------------------
    def scheduler_setup(self, num_devices: int, horizon_s: float) -> dict:
        """What ``sched.Simulation`` needs to run a rollout phase starting now: the pool layout
        (``od0`` + the spot nodes, with the trace's node names), the step-time model from the
        cost model itself (:class:`ModelSteps`), the trace events of the next ``horizon_s``
        seconds in phase-relative time
        (a join once the node has regrouped: ``cost.regroup('grow')`` later), and the spot
        nodes that are down at the start.

        The layout is the deployment's when ``num_devices`` real devices hold it; otherwise
        (8 emulated CPU devices for 4 + 4 x 2) each spot node gets one device and ``od0`` the
        rest: the devices then only carry group identities, time comes from ``cost``.
        """
        from spotlight_jax.elastic import PoolConfig  # noqa: PLC0415
        from spotlight_jax.sched import SimEvent  # noqa: PLC0415

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
        grow = self.cost.regroup("grow")     # a joined node pulls only once it has regrouped
        events = sorted((SimEvent(e.time - now + (grow if e.kind == "join" else 0.0), e.kind,
                                  e.node,
                                  deadline=None if e.deadline is None else e.deadline - now,
                                  abrupt=e.abrupt)
                         for e in upcoming if 0.0 <= e.time - now <= horizon_s),
                        key=lambda e: e.time)
        step = self.cost.rollout_step(8, sp=1) / 8
        return {"pool": PoolConfig(nodes=nodes),
                "cost": ModelSteps(self.cost, commit_s=self.cost_cfg.collective_latency_s),
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
        """The cost model's assumptions, and on a TPU the spot slice's and its notice."""
        rows = self.cost.describe()
        if self.slice is not None:
            spec = device_spec(self.slice.device)
            rows += [Assumption("spot_slice", self.slice.describe(), "",
                                f"config deployment.spot_slice; {spec.topology_source}"),
                     Assumption("slice_preemption", "whole slice, every host at once", "",
                                "GCP: a multi-host TPU slice is preempted as a whole; the "
                                "trace counts slices"),
                     Assumption("preemption_notice", self.replay_lead_s, "s",
                                "config trace.cloud='gcp' (GCP's Spot VM notice)")]
        return rows

    @property
    def replay_lead_s(self) -> float:
        """Seconds from a notice to its loss (the trace's cloud's preset)."""
        return self.trace_cfg.replay_config().lead_time_s
