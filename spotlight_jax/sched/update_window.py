"""Who computes which gradient shard of a shared update, and when the update ends.

The update's shards (``rl.shards``) are requests of kind ``'shard'`` in a
:class:`~spotlight_jax.sched.queue.RequestQueue`: one per shard, all at the policy version being
trained, so only a group holding exactly those weights may take one, and the queue completes
each exactly once. :func:`simulate_window` plays one update window on a virtual clock, as the
scheduler's simulation does for rollouts:

* The trainer's group and the live spot groups pull one shard at a time; spot groups take at
  most ``spot_quota`` shards (the planner's split: the rest of their time explores).
  A shard takes a group ``shard_s`` seconds (its compute, and for a spot group its gradient's
  transfer to the trainer).
* ``notice`` (deadline known): a group that can finish its shard before the deadline does; one
  that cannot hands it back at once (``release``): whoever is free recomputes it.
* ``loss`` (abrupt): the group's shard is lost; the trainer learns of it ``heartbeat_s`` later
  (a missed heartbeat) and the shard is pending again.
* A straggler bound: an idle trainer with nothing pending takes over a spot group's shard whose
  result is due later than the trainer could recompute it (the lease is revoked; a late result
  from the revoked group is dropped as stale), so the step never waits on a spot group longer
  than the trainer's own recomputation would take (plus the heartbeat of a silent loss).
* Joins inside the window: a new node still has to pull the weights and compile; its groups
  take no shard of this update (they explore, or serve the next one).

The report says when every shard was in (``seconds``), who computed each one, the attempts lost
and the spot seconds the shards used (what is left of the window explores). Every attempt is
accounted for: ``attempts == shards + lost + dropped`` (:meth:`WindowReport.check_accounting`).
"""
from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from spotlight_jax.sched.queue import QueueConfig, RequestQueue
from spotlight_jax.sched.requests import Commit, Request
from spotlight_jax.sched.sim import SimEvent

TRAINER = "trainer"


@dataclasses.dataclass(frozen=True)
class ShardGroup:
    """A group that can compute shards: ``node`` (a trace node name; the trainer's is never
    preempted), ``devices`` and ``shard_s`` (seconds per shard, transfer included)."""

    gid: str
    node: str
    devices: int
    shard_s: float

    def __post_init__(self):
        if not self.shard_s > 0:
            raise ValueError(f"group {self.gid!r}: shard_s={self.shard_s!r} must be > 0")


@dataclasses.dataclass
class WindowReport:
    """One update window (see the module docstring). ``computed_by[i]``: the group whose result
    of shard ``i`` was accepted; ``spot_busy_s[gid]``: seconds a spot group spent on shards
    (lost attempts included)."""

    shards: int
    seconds: float = 0.0
    computed_by: dict[int, str] = dataclasses.field(default_factory=dict)
    order: list[int] = dataclasses.field(default_factory=list)    # completion order
    attempts: int = 0
    lost: int = 0            # attempts thrown away by a notice hand-back or a loss
    dropped: int = 0         # results refused (a revoked straggler's, or a duplicate)
    wasted_s: float = 0.0    # group-seconds of the attempts lost or dropped
    spot_busy_s: dict[str, float] = dataclasses.field(default_factory=dict)
    log: list[tuple[float, str]] = dataclasses.field(default_factory=list)

    @property
    def spot_shards(self) -> int:
        return sum(1 for g in self.computed_by.values() if g != TRAINER)

    def spot_device_s(self, devices: dict[str, int]) -> float:
        """Device-seconds the spot groups spent on shards (``devices``: each group's)."""
        return sum(s * devices[g] for g, s in self.spot_busy_s.items())

    def check_accounting(self) -> None:
        """Raises AssertionError unless each shard was accepted once and every attempt is a
        completion, a lost attempt or a dropped result."""
        assert sorted(self.computed_by) == list(range(self.shards)), self.computed_by
        assert sorted(self.order) == list(range(self.shards)), self.order
        assert self.attempts == self.shards + self.lost + self.dropped, (
            self.attempts, self.shards, self.lost, self.dropped)


def simulate_window(shards: int, groups: Sequence[ShardGroup], *, version: int,
                    spot_quota: int | None = None, events: Sequence[SimEvent] = (),
                    heartbeat_s: float = 1.0, spot_ready_s: float = 0.0) -> WindowReport:
    """Plays one shared update of ``shards`` shards on ``groups`` (the first one, id
    :data:`TRAINER`, is the trainer's mesh) under ``events`` (times relative to the window's
    start). ``spot_quota``: most shards the spot groups may take (None: no limit; 0: the
    trainer computes everything). ``spot_ready_s``: when the spot groups hold the step's
    weights (their broadcast). Deterministic."""
    if not groups or groups[0].gid != TRAINER:
        raise ValueError(f"the first group must be the trainer's (gid {TRAINER!r})")
    quota = shards if spot_quota is None else max(int(spot_quota), 0)
    return _Window(shards, list(groups), version, quota, list(events), heartbeat_s,
                   spot_ready_s).run()


class _Window:
    def __init__(self, shards, groups, version, quota, events, heartbeat_s, spot_ready_s):
        self.groups = {g.gid: g for g in groups}
        self.report = WindowReport(shards=shards)
        self.version, self.quota, self.heartbeat_s = version, quota, heartbeat_s
        self.queue = RequestQueue((1,), QueueConfig(lease_s=float("inf"), sizing="fixed",
                                                    fixed_batch=1))
        self.queue.submit(Request(rid=f"shard{i:05d}", prompt="", seed=i, num_steps=1,
                                  kind="shard", policy_version=version)
                          for i in range(shards))
        self.alive = {g.gid for g in groups}
        self.leaving: set[str] = set()        # noticed: no new shard, the running one ends
        self.revoked: set[tuple[str, str]] = set()
        self.busy: dict[str, tuple[str, str, float]] = {}   # gid -> (lease, rid, due)
        self.spot_taken = 0
        self.now = 0.0
        self.heap: list = []
        self.seq = 0
        self.spot_ready_s = spot_ready_s
        if spot_ready_s > 0:
            self._push(spot_ready_s, "ready", None)
        for e in events:
            self._push(e.time, e.kind, e)

    def _push(self, t, kind, payload):
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def _log(self, what: str) -> None:
        self.report.log.append((self.now, what))

    def run(self) -> WindowReport:
        self._pull_idle()
        while not self.queue.all_done:
            if not self.heap:
                raise RuntimeError(f"the update window stalled with shards "
                                   f"{self.queue.pending()} pending and no group to take them")
            t, _, kind, payload = heapq.heappop(self.heap)
            self.now = max(self.now, t)
            getattr(self, f"_on_{kind}")(payload)
            self._pull_idle()
        self.report.seconds = self.now
        for gid, (_, _, due) in self.busy.items():   # revoked stragglers still running
            spent = self.groups[gid].shard_s - (due - self.now)
            self.report.dropped += 1
            self.report.wasted_s += spent
            self.report.spot_busy_s[gid] = self.report.spot_busy_s.get(gid, 0.0) + spent
        self.queue.check_invariants()
        return self.report

    # -- pulling ---------------------------------------------------------------------------------
    def _pull_idle(self) -> None:
        for gid, g in self.groups.items():
            if gid not in self.alive or gid in self.busy or gid in self.leaving:
                continue
            spot = gid != TRAINER
            if spot and (self.spot_taken >= self.quota or self.now < self.spot_ready_s):
                continue
            lease = self.queue.pull(gid, g.devices, self.version, self.now, max_requests=1)
            if lease is None:
                if not spot:
                    self._take_over_straggler(g)
                continue
            rid = lease.requests[0].rid
            self.spot_taken += spot
            self._start(g, lease.lease_id, rid)

    def _start(self, g: ShardGroup, lease_id: str, rid: str) -> None:
        due = self.now + g.shard_s
        self.busy[g.gid] = (lease_id, rid, due)
        self.report.attempts += 1
        self._push(due, "done", (g.gid, lease_id, rid))

    def _take_over_straggler(self, trainer: ShardGroup) -> None:
        """The idle trainer recomputes the spot shard due last, when it would finish it
        sooner than the spot group will deliver it."""
        late = [(due, gid, lease, rid) for gid, (lease, rid, due) in self.busy.items()
                if gid != TRAINER and due > self.now + trainer.shard_s
                and (lease, rid) not in self.revoked]
        if not late:
            return
        due, gid, lease, rid = max(late)
        self.queue.release(lease, self.now, [rid])
        self.revoked.add((lease, rid))
        self._log(f"trainer takes over {rid} from {gid} (due {due:.3f} s)")
        taken = self.queue.pull(TRAINER, trainer.devices, self.version, self.now,
                                max_requests=1)
        if taken is not None:
            self._start(trainer, taken.lease_id, taken.requests[0].rid)

    # -- events ----------------------------------------------------------------------------------
    def _on_done(self, payload) -> None:
        gid, lease_id, rid = payload
        if self.busy.get(gid, (None, None))[:2] != (lease_id, rid):
            return                                   # the group was lost meanwhile
        g = self.groups[gid]
        del self.busy[gid]
        if gid != TRAINER:
            self.report.spot_busy_s[gid] = self.report.spot_busy_s.get(gid, 0.0) + g.shard_s
        c = Commit(rid=rid, start=0, step=1, latent=None, policy_version=self.version)
        verdict = self.queue.commit(lease_id, c, self.now)
        if verdict == "completed":
            i = int(rid[5:])
            self.report.computed_by[i] = gid
            self.report.order.append(i)
        else:                                        # a revoked straggler, or a duplicate
            self.report.dropped += 1
            self.report.wasted_s += g.shard_s
            self._log(f"{gid}'s result for {rid} dropped ({verdict})")

    def _groups_on(self, node: str) -> list[str]:
        return [gid for gid, g in self.groups.items() if g.node == node and gid != TRAINER]

    def _on_notice(self, e: SimEvent) -> None:
        deadline = e.deadline if e.deadline is not None else e.time
        for gid in self._groups_on(e.node):
            if gid not in self.alive or gid in self.leaving:
                continue
            self.queue.leave(gid)
            self.leaving.add(gid)
            busy = self.busy.get(gid)
            if busy is not None and busy[2] > deadline:      # cannot finish: hand it back
                self._lose(gid, busy, at=self.now, why="notice")
            self._log(f"notice on {e.node}: {gid} takes no more shards")

    def _on_loss(self, e: SimEvent) -> None:
        for gid in self._groups_on(e.node):
            busy = self.busy.get(gid)
            if gid in self.alive and busy is not None:
                self._lose(gid, busy, at=self.now + self.heartbeat_s, why="loss")
            self.alive.discard(gid)
            self.queue.leave(gid)
        self._log(f"loss of {e.node}")

    def _lose(self, gid: str, busy, at: float, why: str) -> None:
        lease, rid, due = busy
        g = self.groups[gid]
        spent = g.shard_s - max(due - self.now, 0.0)
        self.report.spot_busy_s[gid] = self.report.spot_busy_s.get(gid, 0.0) + spent
        self.report.lost += 1
        self.report.wasted_s += spent
        del self.busy[gid]
        self.spot_taken -= 1          # the lost attempt does not use up the spot quota
        self._push(at, "requeue", (lease, rid, why))

    def _on_requeue(self, payload) -> None:
        lease, rid, why = payload
        back = self.queue.release(lease, self.now, [rid])
        if back:
            self._log(f"{rid} back to pending ({why})")

    def _on_ready(self, _) -> None:
        pass                                         # the spot groups pull next

    def _on_join(self, e: SimEvent) -> None:
        self._log(f"join of {e.node}: no shard of this update (it pulls weights, compiles)")

    def _on_stall(self, e: SimEvent) -> None:
        pass

    _on_corrupt = _on_stall
