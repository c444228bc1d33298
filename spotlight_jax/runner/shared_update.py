"""The spot modes' update shared with the live spot groups (``deployment.shared_update``).

Each optimizer step of the update is cut into ``deployment.update_shards`` gradient shards
(``rl.shards``). Who computes which shard, and when the step's gradient is complete, is played
on the emulated clock by the scheduler's update window (``sched.update_window``): the trainer's
mesh and the live spot groups pull shards (the spot groups at most their share of them), the
trace's notices and losses inside the window hand shards back or lose them, and whoever is free
recomputes them. The shards' gradients are then computed for real, once per accepted shard, and
summed in shard order, so the step equals the trainer's own update to float rounding whoever
computed what.

In the emulated transport every shard is computed by this process on the trainer's devices
(the emulated spot devices are busy exploring on the same cores); only the time is charged to
the groups the window assigned. The spot groups' share:

* ``fixed``: ``deployment.update_spot_share`` of the shards.
* ``auto``: the share (in eighths) whose iteration is shortest: the update's window against
  the spot groups' shards plus the exploration the mode needs of them (the next batch's
  candidates); ties go to the smaller share, so exploration keeps the spot time the update
  does not need. What the spot time left buys then goes to the exploration planner.
* ``payoff``: the share with the least expected time per unit of progress. A share buys
  seconds (a shorter window) and costs exploration (the spot time its shards take is not
  explored); the mode passes ``progress(plan)``, the expected learning progress of the
  iteration relative to one without extra candidates: ``(1 + g / v) ** update_payoff_exponent``
  with ``g`` the planner's posterior-mean gain in selected-group variance for the exploration
  budget that share leaves and ``v`` the base candidates' variance, both learned online from
  every explored pool (``Planner.expected_gain``, ``Planner.base_variance``). Before the planner
  has observed a pool the progress is unknown and the choice is ``auto``'s.
"""
from __future__ import annotations

import dataclasses
import math

from spotlight_jax.rl.shards import shard_count
from spotlight_jax.sched import SimEvent
from spotlight_jax.sched.update_window import TRAINER, ShardGroup, WindowReport, simulate_window

AUTO_SHARES = tuple(i / 8 for i in range(9))


@dataclasses.dataclass
class UpdatePlan:
    """The windows of one update's optimizer steps at spot share ``share``: ``seconds`` until
    the last gradient is in, the spot groups' device-seconds on shards, and the row entries."""

    share: float
    windows: list[WindowReport]
    seconds: float
    spot_device_s: float
    trainer_s: float              # the update on the trainer alone
    progress: float = 1.0         # 'payoff': the expected progress the split was chosen for

    def info(self) -> dict:
        return {"update_s": self.seconds, "update_trainer_s": self.trainer_s,
                "update_split": self.share, "update_payoff_progress": self.progress,
                "update_shards": sum(w.shards for w in self.windows),
                "update_shards_spot": sum(w.spot_shards for w in self.windows),
                "update_lost": sum(w.lost for w in self.windows),
                "update_dropped": sum(w.dropped for w in self.windows),
                "update_spot_device_s": self.spot_device_s}


class SharedUpdate:
    """Plans (on the emulated clock) and runs (for real) the shared update of a spot mode."""

    def __init__(self, deploy, shard_units):
        """``deploy``: the emulated deployment (its clock, trace, cost model, live nodes);
        ``shard_units(n)``: the trainer's ``(optimizer steps, samples each step's shards
        divide)`` of an update on ``n`` samples."""
        self.deploy, self.shard_units = deploy, shard_units
        self.cfg = deploy.cfg

    @property
    def enabled(self) -> bool:
        return self.cfg.shared_update != "off"

    # -- planning ------------------------------------------------------------------------------
    def groups(self, n: int, steps: int, shards: int) -> list[ShardGroup]:
        """The trainer's mesh and every live spot group, with their seconds per shard of an
        update on ``n`` samples in ``steps`` optimizer steps of ``shards`` shards."""
        d, c = self.deploy, self.cfg
        per_shard = d.cost.train(n, 1) / (steps * shards)    # device-seconds
        out = [ShardGroup(TRAINER, "od0", c.on_demand_devices,
                          per_shard / c.on_demand_devices)]
        per_node = c.spot_devices_per_node // c.spot_sp
        for node in sorted(d.alive_nodes, key=str):
            for j in range(per_node):
                out.append(ShardGroup(f"{node}/{j}", str(node), c.spot_sp,
                                      per_shard / c.spot_sp + d.cost.gradient()))
        return out

    def events(self, horizon_s: float) -> list[SimEvent]:
        """The trace's events of the next ``horizon_s`` seconds, relative to now."""
        d = self.deploy
        now = d.clock.now()
        return [SimEvent(e.time - now, e.kind, str(e.node),
                         deadline=None if e.deadline is None else e.deadline - now,
                         abrupt=e.abrupt)
                for e in d.events.events[d.events.position:]
                if 0.0 <= e.time - now <= horizon_s]

    def plan(self, n: int, version: int, spot_work_s: float = 0.0, *, other_s: float = 0.0,
             progress=None) -> UpdatePlan:
        """The trainer's update of ``n`` samples (its first optimizer step at ``version``), at
        the configured share, or for ``auto`` the share with the shortest iteration given
        ``spot_work_s`` device-seconds the spot groups must also do during the update. For
        ``payoff``, the share whose iteration (``other_s`` seconds outside the update window
        plus the window) takes the least time per unit of ``progress(plan)``; ``progress``
        None (nothing learned yet) chooses as ``auto``."""
        d = self.deploy
        steps, units = self.shard_units(n)
        shards = shard_count(units, self.cfg.update_shards)
        trainer_s = d.train_s(n)
        args = (n, steps, shards, version, trainer_s)
        if self.cfg.shared_update == "fixed":
            return self._plan_at(self.cfg.update_spot_share, *args)
        spot = max(d.spot_devices, 1)
        weigh = self.cfg.shared_update == "payoff" and progress is not None
        best, best_s = None, math.inf
        for share in AUTO_SHARES:
            p = self._plan_at(share, *args)
            seconds = other_s + max(p.seconds, (p.spot_device_s + spot_work_s) / spot)
            if weigh:
                p.progress = float(progress(p))
            if seconds / p.progress < best_s - 1e-9:
                best, best_s = p, seconds / p.progress
        return best

    def _plan_at(self, share: float, n: int, steps: int, shards: int, version: int,
                 trainer_s: float) -> UpdatePlan:
        groups = self.groups(n, steps, shards)
        devices = {g.gid: g.devices for g in groups}
        quota = round(share * shards)
        # the broadcast of each step's weights to the spot groups that take part
        ready = self.deploy.cost.broadcast() if quota else 0.0
        events = self.events(horizon_s=2 * trainer_s + 3600.0)
        windows, t, spot_s = [], 0.0, 0.0
        for j in range(steps):
            shifted = [dataclasses.replace(
                e, time=e.time - t, deadline=None if e.deadline is None else e.deadline - t)
                for e in events if e.time >= t]
            w = simulate_window(shards, groups, version=version + j,
                                spot_quota=quota, events=shifted, spot_ready_s=ready)
            w.check_accounting()
            windows.append(w)
            t += w.seconds
            spot_s += w.spot_device_s(devices)
            lost = {e.node for e in shifted if e.kind == "loss" and e.time <= w.seconds}
            groups = [g for g in groups if g.gid == TRAINER or g.node not in lost]
        return UpdatePlan(share=share, windows=windows, seconds=t, spot_device_s=spot_s,
                          trainer_s=trainer_s)

    # -- running -------------------------------------------------------------------------------
    @staticmethod
    def shards(plan: UpdatePlan) -> int:
        """Shards per optimizer step of ``plan``."""
        return plan.windows[0].shards

    def runner(self, plan: UpdatePlan):
        """``run(ShardedStep)`` for a trainer's ``update_sharded``: each step's shards computed
        once, in the order the plan's window accepted them, then applied."""
        windows = iter(plan.windows)

        def run(step):
            w = next(windows)
            if w.shards != step.shards:
                raise ValueError(f"the plan has {w.shards} shards per step, the update "
                                 f"{step.shards}")
            return step.apply([step.compute(i) for i in w.order])

        return run
