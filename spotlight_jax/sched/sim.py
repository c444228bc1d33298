"""Deterministic discrete-event simulation of the scheduler under spot preemptions.

:class:`Simulation` runs a :class:`~spotlight_jax.sched.queue.RequestQueue` with one
:class:`~spotlight_jax.sched.worker.InProcessWorker` per SP group, groups formed by the elastic
layer (``elastic.form_groups``) on a :class:`~spotlight_jax.elastic.DevicePool` (e.g. 8 emulated CPU
devices = an on-demand node of 4 + two spot nodes of 2), on a virtual clock: each call's duration
comes from the cost model (``cost.StepCost`` or anything with ``rollout_step(batch, sp)``), and
the computation itself is real (the stepper runs when the call "ends"). The same inputs always give
the same run, so chaos tests replay hundreds of events in seconds.

Events (:class:`SimEvent`) come from a spot-trace replay (:func:`events_from_replay`, from
``elastic.traces.replay``) or from :func:`random_schedule`:

* ``notice`` (deadline known): the node's groups finish their current call, commit every
  in-flight request (:meth:`Worker.flush`), release their lease and stop (with
  ``use_notice_lead``, they first keep running calls that still fit before the deadline).
  Nothing is lost when the commit fits before the deadline (otherwise it is counted as an
  overrun and handled as a loss).
* ``loss``: the node's devices die. A group still running (abrupt loss, or a notice overrun) is
  killed; its requests come back when its lease expires, from their last accepted commit. The
  steps computed beyond it (plus the part of the call in progress) are the lost work, at most
  ``commit_every`` steps per request.
* ``join``: the node's devices come back; its groups are re-formed and pull work.
* ``stall`` (network partition): the node's groups keep computing but cannot reach the queue for
  ``duration``; their messages are delivered late, in order, when it ends. Their leases may
  expire meanwhile, so late commits exercise the stale/duplicate paths.
* ``corrupt``: the next commit of each of the node's groups is altered (``fault``: 'shape',
  'dtype', 'step', 'nan', 'version', 'unknown_id'); the queue rejects it and the request is re-run
  from its last good commit.

Accounting (steps are request-steps): ``executed_steps`` (whole steps computed) equals
``total steps of all requests + wasted_steps`` (checked by :meth:`SimReport.check_accounting`), and
each abrupt loss records the steps it threw away (:attr:`SimReport.losses`).
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from spotlight_jax.elastic import DevicePool, GroupConfig, PoolConfig, form_node_groups
from spotlight_jax.sched.queue import RequestQueue
from spotlight_jax.sched.requests import Commit, Request
from spotlight_jax.sched.step_cost import StepCost, capacity_of
from spotlight_jax.sched.worker import InProcessWorker, Stepper, WorkerConfig

EVENT_KINDS = ("join", "notice", "loss", "stall", "corrupt")
FAULTS = ("shape", "dtype", "step", "nan", "version", "unknown_id")
# order of simultaneous events: a call that ends at an event's time ends first
_PRIO = {"call_done": 0, "loss": 1, "join": 2, "notice": 3, "stall": 4, "corrupt": 5,
         "stall_end": 6, "heartbeat": 7, "expire": 8}


@dataclasses.dataclass(frozen=True)
class SimEvent:
    """One external event at virtual time ``time`` on node ``node`` (see module docstring)."""

    time: float
    kind: str
    node: str
    deadline: float | None = None     # notice: time of the loss
    abrupt: bool = False              # loss: no notice came first
    duration: float = 0.0             # stall
    fault: str = ""                   # corrupt

    def __post_init__(self):
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}; one of {EVENT_KINDS}")
        if self.kind == "corrupt" and self.fault not in FAULTS:
            raise ValueError(f"corrupt event needs fault in {FAULTS}, got {self.fault!r}")


def events_from_replay(replay) -> list[SimEvent]:
    """Converts ``elastic.traces.Replay`` events (join/notice/loss) into :class:`SimEvent` s
    (nodes the replay has down at time 0 go to ``Simulation(down_at_start=...)``)."""
    return [SimEvent(e.time, e.kind, e.node, deadline=e.deadline, abrupt=e.abrupt)
            for e in replay.events]


def random_schedule(seed: int, *, spot_nodes: Sequence[str], all_nodes: Sequence[str],
                    horizon_s: float, num_events: int, lead_time_s: tuple[float, float],
                    p_abrupt: float = 0.4, p_stall: float = 0.1, p_corrupt: float = 0.1,
                    stall_s: tuple[float, float] = (1.0, 10.0)) -> list[SimEvent]:
    """A seeded chaos schedule of about ``num_events`` events at uniform random times in
    ``[0, horizon_s)``: preemptions of ``spot_nodes`` (a notice ``lead_time_s`` before the loss,
    or an abrupt loss with probability ``p_abrupt``) and joins of nodes that are down; stalls
    and corrupted commits on any of ``all_nodes``. Every node is up at time 0."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0.0, horizon_s, num_events))
    up = dict.fromkeys(spot_nodes, True)
    busy_until = dict.fromkeys(spot_nodes, -1.0)   # a notice is pending until its loss
    out: list[SimEvent] = []
    for t in times.tolist():
        u = rng.random()
        if u < p_stall:
            node = all_nodes[rng.integers(len(all_nodes))]
            out.append(SimEvent(t, "stall", node, duration=float(rng.uniform(*stall_s))))
            continue
        if u < p_stall + p_corrupt:
            node = all_nodes[rng.integers(len(all_nodes))]
            out.append(SimEvent(t, "corrupt", node, fault=FAULTS[rng.integers(len(FAULTS))]))
            continue
        free = [n for n in spot_nodes if busy_until[n] <= t]
        if not free:
            continue
        node = free[rng.integers(len(free))]
        if up[node]:
            up[node] = False
            if rng.random() < p_abrupt:
                out.append(SimEvent(t, "loss", node, abrupt=True))
            else:
                deadline = t + float(rng.uniform(*lead_time_s))
                out.append(SimEvent(t, "notice", node, deadline=deadline))
                out.append(SimEvent(deadline, "loss", node))
                busy_until[node] = deadline
        else:
            up[node] = True
            out.append(SimEvent(t, "join", node))
    return sorted(out, key=lambda e: (e.time, _PRIO[e.kind], e.node))


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Pool layout, grouping, worker policy, cost model (the queue policy is the queue's own
    ``QueueConfig``; the simulation only sets its ``lease_s``).

    Heartbeats: with ``heartbeat_s=None`` a group heartbeats when a call ends, and
    ``lease_s=None`` sets the lease to ``lease_factor`` x the longest call; with ``heartbeat_s``
    set, a busy group also heartbeats every ``heartbeat_s`` (a background thread in a real
    worker) and the default lease is ``lease_factor x heartbeat_s``. Either way a live group's
    lease never expires; only dead or partitioned groups lose leases, after at most a lease.

    ``use_notice_lead``: on a notice, instead of stopping after the current call, keep running
    calls while the next one plus committing every held request still ends before the deadline
    (the group's devices are paid until then anyway); then commit and stop.
    """

    pool: PoolConfig = PoolConfig()
    groups: GroupConfig = GroupConfig(heads=4)
    worker: WorkerConfig = WorkerConfig()
    cost: object = StepCost()
    lease_s: float | None = None
    lease_factor: float = 3.0
    heartbeat_s: float | None = None
    use_notice_lead: bool = False
    check_invariants: bool = True
    max_time: float = 1e9


@dataclasses.dataclass
class SimReport:
    """What happened: counts, virtual times, device-seconds and lost work."""

    makespan: float = 0.0
    events: Counter = dataclasses.field(default_factory=Counter)   # applied external events
    executed_steps: int = 0          # whole request-steps computed (real rows, not padding)
    required_steps: int = 0          # sum of the requests' num_steps (minus steps done at submit)
    wasted_steps: int = 0            # computed, then thrown away (all causes)
    wasted_by: Counter = dataclasses.field(default_factory=Counter)
    partial_steps: float = 0.0       # fraction of calls in progress when their group was killed
    losses: list = dataclasses.field(default_factory=list)          # per killed group
    notices: list = dataclasses.field(default_factory=list)         # per drained group
    calls: int = 0
    commits: int = 0
    busy_device_s: float = 0.0
    busy_by_role: Counter = dataclasses.field(default_factory=Counter)   # role -> device-s
    commit_device_s: float = 0.0
    alive_device_s: float = 0.0
    idle_tail_device_s: float = 0.0
    group_finish: dict = dataclasses.field(default_factory=dict)    # alive group -> last busy end
    queue: dict = dataclasses.field(default_factory=dict)
    completed: int = 0
    num_requests: int = 0

    @property
    def num_events(self) -> int:
        return sum(self.events.values())

    @property
    def lost_steps(self) -> float:
        """Work lost to abrupt losses (whole + partial steps)."""
        return sum(x["lost_steps"] for x in self.losses)

    def check_accounting(self) -> None:
        """Every computed step is either in a final result or counted as wasted."""
        if self.executed_steps != self.required_steps + self.wasted_steps:
            raise AssertionError(f"executed {self.executed_steps} request-steps != required "
                                 f"{self.required_steps} + wasted {self.wasted_steps} "
                                 f"({dict(self.wasted_by)})")


@dataclasses.dataclass
class _Group:
    gid: str
    node: str
    group: object
    worker: InProcessWorker
    state: str = "idle"                 # idle | busy | stopped
    token: int = 0
    plan: object = None
    call_start: float = 0.0
    call_end: float = 0.0
    draining: bool = False
    deadline: float | None = None
    stalled_until: float = -math.inf
    outbox: list = dataclasses.field(default_factory=list)
    faults: list = dataclasses.field(default_factory=list)
    last_busy_end: float = 0.0


class Simulation:
    """Runs the queue's requests on groups of ``pool`` under ``events`` (see module docstring).

    ``stepper_factory(group)`` makes the stepper of an SP group (``SPGroup``); ``policy(node)``
    gives ``(params, version)`` for a group formed on ``node`` (default: ``(0, 0)``).
    ``down_at_start``: nodes that are not up at time 0 (a replay's nodes not in
    ``initial_alive``). The queue's ``lease_s`` is set to the simulation's.
    """

    def __init__(self, queue: RequestQueue, stepper_factory: Callable[[object], Stepper],
                 events: Sequence[SimEvent] = (), config: SimConfig = SimConfig(),
                 policy: Callable[[str], tuple] | None = None, devices=None,
                 down_at_start: Sequence[str] = ()):
        self.queue, self.config = queue, config
        self.stepper_factory = stepper_factory
        self.policy = policy or (lambda node: (0, 0))
        self.pool = DevicePool(config.pool, devices)
        self.report = SimReport(num_requests=queue.num_requests)
        self.report.required_steps = sum(queue.request(r).remaining for r in queue.pending())
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self._groups: dict[str, _Group] = {}
        self._incarnation = Counter()
        self._expiry_scheduled: set[float] = set()
        for node in down_at_start:
            self.pool.mark_node_lost(node, time=0.0, reason="down at start")
        self.lease_s = config.lease_s or self._default_lease()
        queue.config = dataclasses.replace(queue.config, lease_s=self.lease_s)
        for e in events:
            self._push(e.time, e.kind, e)

    # ---- set-up --------------------------------------------------------------------------
    def _default_lease(self) -> float:
        """``lease_factor`` x the longest call any group can make: its largest batch (the
        microbatch, or the most a pull can give a group of that SP degree) for ``steps_per_call``
        (or ``commit_every``) steps, plus committing it."""
        cfg, cost, qc = self.config, self.config.cost, self.queue.config
        if cfg.heartbeat_s is not None:
            return cfg.lease_factor * cfg.heartbeat_s
        steps = cfg.worker.steps_per_call or cfg.worker.commit_every or max(
            (self.queue.request(r).num_steps for r in self.queue.ids()), default=1)
        longest = 0.0
        for sp in range(1, max(n for _, _, n in cfg.pool.nodes) + 1):
            rows = cfg.worker.microbatch or max(qc.fixed_batch, math.ceil(
                2 * qc.batch_per_capacity * capacity_of(cost, sp)))
            longest = max(longest, steps * cost.rollout_step(rows, sp)
                          + rows * getattr(cost, "commit_s", 0.0))
        return cfg.lease_factor * longest

    def _push(self, t: float, kind: str, payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, _PRIO[kind], self._seq, kind, payload))

    def _form(self, node: str) -> None:
        devices = self.pool.alive_devices(node)
        for g in form_node_groups(node, devices, self.config.groups, log=False):
            self._incarnation[node] += 1
            gid = f"{node}[{g.device_ids[0]}-{g.device_ids[-1]}]#{self._incarnation[node]}"
            params, version = self.policy(node)
            worker = InProcessWorker(gid, self.stepper_factory(g), degree=g.degree,
                                     config=self.config.worker, cost=self.config.cost,
                                     params=params, version=version)
            self._groups[gid] = _Group(gid, node, g, worker, last_busy_end=self.now)

    def _alive_devices(self) -> int:
        return len(self.pool.devices(alive=True))

    def _advance(self, t: float) -> None:
        self.report.alive_device_s += (t - self.now) * self._alive_devices()
        self.now = t

    # ---- main loop -----------------------------------------------------------------------
    def run(self) -> SimReport:
        for node in self.pool.nodes:
            if self.pool.alive_devices(node):
                self._form(node)
        self._pull_idle()
        while not self.queue.all_done:
            if not self._heap:
                break                       # nothing left that could make progress
            t, _, _, kind, payload = heapq.heappop(self._heap)
            if t > self.config.max_time:
                break
            self._advance(t)
            getattr(self, f"_on_{kind}")(payload)
            self._schedule_expiry()
            if self.config.check_invariants:
                self.queue.check_invariants()
        return self._finish()

    def _finish(self) -> SimReport:
        r = self.report
        r.makespan = self.now
        r.completed = len(self.queue.completed())
        r.queue = self.queue.summary()
        for g in self._groups.values():
            # work still held when the run ends (e.g. a partitioned group whose results never
            # arrived): computed, never used
            for steps in g.worker.abandon().values():
                self._waste("held_at_end", steps)
        alive = [g for g in self._groups.values() if g.state != "stopped"]
        r.group_finish = {g.gid: g.last_busy_end for g in alive}
        r.idle_tail_device_s = sum(g.group.degree * (r.makespan - g.last_busy_end) for g in alive)
        self.queue.check_invariants()
        return r

    def _schedule_expiry(self) -> None:
        t = self.queue.next_expiry()
        if t is not None and t not in self._expiry_scheduled:
            self._expiry_scheduled.add(t)
            self._push(t, "expire", None)

    def _live(self, node: str | None = None) -> list[_Group]:
        return [g for g in self._groups.values()
                if g.state != "stopped" and (node is None or g.node == node)]

    # ---- group actions -------------------------------------------------------------------
    def _stalled(self, g: _Group) -> bool:
        return self.now < g.stalled_until

    def _send(self, g: _Group, fn: Callable[[], None]) -> None:
        """Runs a queue interaction now, or queues it until the group's stall ends."""
        if self._stalled(g):
            g.outbox.append(fn)
        else:
            fn()

    def _pull_idle(self) -> None:
        idle = sorted((g for g in self._live() if g.state == "idle" and not g.draining
                       and not self._stalled(g) and g.worker.lease_id is None),
                      key=lambda g: (g.last_busy_end, g.gid))
        for g in idle:
            lease = self.queue.pull(g.gid, g.worker.capacity, g.worker.policy_version, self.now)
            if lease is not None:
                g.worker.load(lease)
                self._start_call(g)

    def _start_call(self, g: _Group) -> None:
        plan = g.worker.plan()
        if plan is None:
            g.state = "idle"
            if g.worker.lease_id is None:
                self._pull_idle()
            return
        dur, commit = self._call_cost(g, plan)
        g.state, g.plan = "busy", plan
        g.call_start, g.call_end = self.now, self.now + dur + commit
        g.token += 1
        self.report.busy_device_s += (dur + commit) * g.group.degree
        self.report.busy_by_role[self.pool.role(g.node)] += (dur + commit) * g.group.degree
        self.report.commit_device_s += commit * g.group.degree
        self._push(g.call_end, "call_done", (g.gid, g.token))
        hb = self.config.heartbeat_s
        if hb is not None:
            for j in range(1, math.ceil((g.call_end - self.now) / hb)):
                self._push(self.now + j * hb, "heartbeat", (g.gid, g.token))

    def _on_heartbeat(self, payload) -> None:
        g = self._groups[payload[0]]
        if g.state == "busy" and g.token == payload[1] and not self._stalled(g):
            self.queue.heartbeat(g.worker.lease_id, self.now)

    def _deliver(self, g: _Group, lease_id: str, commits: Sequence[Commit]) -> None:
        tamper = None
        if g.faults and commits:
            fault = g.faults.pop(0)
            first = commits[0].rid
            tamper = lambda c: _corrupt(c, fault) if c.rid == first else c
        res = g.worker.deliver(self.queue, commits, self.now, lease_id=lease_id, tamper=tamper)
        self.report.commits += len(commits)
        for status, wasted in res.values():
            self._waste(status, wasted)

    def _waste(self, cause: str, steps: int) -> None:
        if steps:
            self.report.wasted_steps += steps
            self.report.wasted_by[cause] += steps

    def _heartbeat(self, g: _Group, lease_id: str) -> None:
        if lease_id is not None and g.worker.lease_id == lease_id \
                and not self.queue.heartbeat(lease_id, self.now):
            for steps in g.worker.abandon().values():
                self._waste("lease_lost", steps)

    def _on_call_done(self, payload) -> None:
        gid, token = payload
        g = self._groups[gid]
        if g.state != "busy" or g.token != token:
            return
        plan, lease_id = g.plan, g.worker.lease_id
        held = [r for r in plan.rids if r in g.worker.progress()]
        commits = g.worker.execute(plan)
        g.state, g.plan, g.last_busy_end = "idle", None, self.now
        self.report.calls += 1
        self.report.executed_steps += plan.num * len(held)
        # rows dropped during the call (lease lost meanwhile): device work thrown away
        self.report.partial_steps += plan.num * (len(plan.rids) - len(held))
        if commits:
            self._send(g, lambda: self._deliver(g, lease_id, commits))
        self._send(g, lambda: self._heartbeat(g, lease_id))
        if g.draining:
            if self.config.use_notice_lead and self._fits_before_deadline(g):
                self._start_call(g)
            else:
                self._drain(g)
        else:
            self._start_call(g)
            self._pull_idle()

    def _call_cost(self, g: _Group, plan) -> tuple[float, float]:
        """(compute, commit) seconds of a planned call on group ``g``."""
        cost = self.config.cost
        commit = len(plan.rids) * getattr(cost, "commit_s", 0.0) if plan.commits else 0.0
        return plan.num * cost.rollout_step(plan.batch, g.group.degree), commit

    def _fits_before_deadline(self, g: _Group) -> bool:
        """Whether one more call, then committing every held request, ends by the deadline."""
        plan = g.worker.plan()
        if plan is None or g.deadline is None:
            return False
        dur, commit = self._call_cost(g, plan)
        flush = len(g.worker.progress()) * getattr(self.config.cost, "commit_s", 0.0)
        return self.now + dur + commit + flush <= g.deadline

    def _drain(self, g: _Group) -> None:
        """Notice path: commit everything in flight, release the lease, stop."""
        lease_id = g.worker.lease_id
        commits = g.worker.flush()
        t = self.now + len(commits) * getattr(self.config.cost, "commit_s", 0.0)
        if g.deadline is not None and t > g.deadline:
            self.report.notices.append({"time": self.now, "group": g.gid, "ok": False,
                                        "committed": 0})
            return                              # overrun: the loss at the deadline kills it
        self.report.busy_device_s += (t - self.now) * g.group.degree
        self.report.commit_device_s += (t - self.now) * g.group.degree
        self.report.busy_by_role[self.pool.role(g.node)] += (t - self.now) * g.group.degree
        g.last_busy_end = t

        record = {"time": self.now, "group": g.gid, "ok": True, "committed": len(commits),
                  "requests": len(g.worker.progress()), "lost_steps": 0}
        self.report.notices.append(record)

        def deliver_and_release():
            before = self.report.wasted_steps
            if commits:
                self._deliver(g, lease_id, commits)
            if lease_id is not None:
                self.queue.release(lease_id, self.now)
            for steps in g.worker.abandon().values():
                self._waste("released", steps)
            record["lost_steps"] = self.report.wasted_steps - before
            self.queue.leave(g.gid)
            self._pull_idle()
        g.state = "stopped"
        self._send(g, deliver_and_release)

    def _kill(self, g: _Group, cause: str) -> None:
        """The group's devices are gone: in-flight work beyond accepted commits is lost."""
        in_call: dict[str, float] = {}      # steps of the call in progress, per row
        if g.state == "busy" and g.plan is not None:
            frac = (self.now - g.call_start) / max(g.call_end - g.call_start, 1e-12)
            in_call = dict.fromkeys(g.plan.rids, frac * g.plan.num)
        wasted = g.worker.abandon()
        for steps in wasted.values():
            self._waste(cause, steps)
        per_req = {rid: steps + in_call.get(rid, 0.0) for rid, steps in wasted.items()}
        self.report.partial_steps += sum(in_call.values())
        self.report.losses.append({
            "time": self.now, "group": g.gid, "cause": cause, "requests": len(wasted),
            "lost_steps": sum(per_req.values()),
            "max_lost_per_request": max(per_req.values(), default=0.0),
            "stalled": self._stalled(g) or bool(g.outbox)})
        g.state, g.outbox = "stopped", []
        g.token += 1
        self.queue.leave(g.gid)

    # ---- external events -----------------------------------------------------------------
    def _on_notice(self, e: SimEvent) -> None:
        self.report.events["notice"] += 1
        for g in self._live(e.node):
            g.draining, g.deadline = True, e.deadline
            self.queue.leave(g.gid)
            if g.state == "idle":
                self._drain(g)

    def _on_loss(self, e: SimEvent) -> None:
        self.report.events["abrupt_loss" if e.abrupt else "loss"] += 1
        # live groups, and drained ones whose final messages are still stuck in a stall
        for g in [g for g in self._groups.values() if g.node == e.node
                  and (g.state != "stopped" or g.outbox)]:
            self._kill(g, "notice_overrun" if g.draining else "abrupt_loss")
        self.pool.mark_node_lost(e.node, time=e.time, reason="abrupt" if e.abrupt else "notice")
        self._pull_idle()

    def _on_join(self, e: SimEvent) -> None:
        self.report.events["join"] += 1
        if self._live(e.node):
            return                           # already up (e.g. a replay's redundant join)
        self.pool.mark_node_joined(e.node, time=e.time, reason="join")
        self._form(e.node)
        self._pull_idle()

    def _on_stall(self, e: SimEvent) -> None:
        self.report.events["stall"] += 1
        for g in self._live(e.node):
            g.stalled_until = max(g.stalled_until, self.now + e.duration)
            self._push(g.stalled_until, "stall_end", g.gid)

    def _on_stall_end(self, gid: str) -> None:
        g = self._groups[gid]
        if self._stalled(g):
            return                           # extended by a later stall
        outbox, g.outbox = g.outbox, []
        for fn in outbox:
            fn()
        if g.state == "idle" and not g.draining and g.worker.lease_id is not None:
            self._start_call(g)
        self._pull_idle()

    def _on_corrupt(self, e: SimEvent) -> None:
        self.report.events["corrupt"] += 1
        for g in self._live(e.node):
            g.faults.append(e.fault)

    def _on_expire(self, _) -> None:
        self._expiry_scheduled.discard(self.now)
        if self.queue.expire(self.now):
            self._pull_idle()


def _corrupt(c: Commit, fault: str) -> Commit:
    """A malformed copy of ``c`` (fault injection)."""
    if fault == "shape":
        return dataclasses.replace(c, latent=c.latent.reshape(-1)[:-1].copy())
    if fault == "dtype":
        return dataclasses.replace(c, latent=c.latent.astype(np.float64))
    if fault == "step":
        return dataclasses.replace(c, step=c.step + 10_000)
    if fault == "nan":
        bad = c.latent.copy()
        bad.flat[0] = np.nan
        return dataclasses.replace(c, latent=bad)
    if fault == "version":
        return dataclasses.replace(c, policy_version=c.policy_version + 1)
    if fault == "unknown_id":
        return dataclasses.replace(c, rid=c.rid + "?")
    raise ValueError(f"unknown fault {fault!r}")


# ---- helpers ---------------------------------------------------------------------------------
def make_requests(n: int, *, num_steps: int, prompts: Sequence[str], kind: str = "rollout",
                  policy_version: int = 0, seed0: int = 0, prefix: str = "r") -> list[Request]:
    """``n`` requests with seeds ``seed0 ..`` and prompts cycled from ``prompts``."""
    return [Request(rid=f"{prefix}{i:04d}", prompt=prompts[i % len(prompts)], seed=seed0 + i,
                    num_steps=num_steps, kind=kind, policy_version=policy_version)
            for i in range(n)]


def results_equal(a: dict[str, Request], b: dict[str, Request]) -> list[str]:
    """Ids whose final results differ in any bit (latent, trajectory, log-probs, versions), or
    that are missing on one side; empty when equal."""
    bad = sorted(set(a) ^ set(b))
    for rid in sorted(set(a) & set(b)):
        x, y = a[rid].state, b[rid].state
        same = x.step == y.step and x.versions == y.versions
        for name in ("latent", "initial", "latents", "log_probs"):
            u, v = getattr(x, name), getattr(y, name)
            same = same and ((u is None and v is None) or (
                u is not None and v is not None and u.dtype == v.dtype
                and np.array_equal(u.view(np.uint8), v.view(np.uint8))))
        if not same:
            bad.append(rid)
    return bad
