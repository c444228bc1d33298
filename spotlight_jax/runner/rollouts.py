"""One rollout interface, three places to run it: the trainer's devices, the pull scheduler's
emulated pool, or Ray spot hosts.

A rollout phase turns an iteration's prompts and seeds into a training batch (``latents``,
``log_probs``, ``images``, ``tokens``, ``mask``, ``rewards``, ``prompt_ids``, ``seeds``) with the
trainer's current sampling state, charges its emulated duration to the deployment's clock
(:meth:`Rollouts.charge`) and, once the reward phase is charged too, applies the trace events
that fell inside it (:meth:`Rollouts.settle`). Every backend produces the same batch for the same
(prompts, seeds, state): a seed fixes the rollout's noise, wherever it runs.

* :class:`DirectRollouts`: chunked rollouts on the trainer's mesh; time from the cost model's
  capacity-weighted split over the on-demand devices and (``use_spot``) the live spot groups.
* :class:`ScheduledRollouts`: one request per (prompt, seed) through ``spotlight_jax.sched``'s
  simulation of the pull scheduler on the emulated pool (leases, periodic commits, the trace's
  notices and losses inside the phase); time is the simulation's makespan.
* :class:`RayRollouts`: the same requests pulled by Ray spot host actors (real processes, real
  preemption signals); what no host finishes runs on the trainer's devices.
"""
from __future__ import annotations

import contextlib
import logging as pylogging
import time

import jax
import numpy as np

from spotlight_jax import sched
from spotlight_jax.cluster import ray_hosts
from spotlight_jax.diffusion.engine import candidate_seeds
from spotlight_jax.elastic import GroupConfig


def group_seeds(run_seed: int, k: int, num_prompts: int, group_size: int,
                shared_bits: int = 0) -> list[np.ndarray]:
    """The random baseline's seeds: the first G exploration candidates of each prompt slot."""
    return [candidate_seeds(run_seed, k, i, group_size, shared_bits)
            for i in range(num_prompts)]


def rollout_on_groups(setting) -> bool:
    """Resolves ``deployment.rollout_on_groups``: ``'auto'`` computes scheduled rollouts on the
    groups' own devices where they are separate hardware (not the CPU backend, whose emulated
    devices share the same cores; docs/spotlight.md)."""
    if isinstance(setting, bool):
        return setting
    choice = str(setting).lower()
    if choice not in ("auto", "true", "false"):
        raise ValueError(f"deployment.rollout_on_groups={setting!r}: use 'true', 'false' or "
                         "'auto'")
    return jax.default_backend() != "cpu" if choice == "auto" else choice == "true"


def with_group_ids(batch: dict, seeds_per_prompt) -> dict:
    """Adds ``prompt_ids`` (the group of each trajectory) and the flat ``seeds``."""
    batch["prompt_ids"] = np.repeat(np.arange(len(seeds_per_prompt)),
                                    [len(ss) for ss in seeds_per_prompt])
    batch["seeds"] = np.concatenate([np.asarray(ss, np.uint32) for ss in seeds_per_prompt])
    return batch


def flat_requests(prompts, seeds_per_prompt) -> list[tuple[str, int]]:
    return [(p, int(s)) for p, ss in zip(prompts, seeds_per_prompt) for s in ss]


@contextlib.contextmanager
def quiet(*names):
    """Raises the given loggers to WARNING for a block (the emulated pool of a scheduled
    rollout phase would log its node losses and joins at every iteration)."""
    loggers = [pylogging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(pylogging.WARNING)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


class Rollouts:
    """A rollout phase backend over a :class:`~spotlight_jax.runner.state.RunState`."""

    # whether the batch's rewards were computed, and charged, where it was sampled (the
    # iteration then charges no reward phase)
    rewarded = False

    def __init__(self, state, use_spot: bool = False):
        self.state, self.use_spot = state, use_spot

    def rollout(self, k: int, prompts, seeds_per_prompt) -> tuple[dict, dict]:
        """The batch of ``prompts`` x their seeds, and the backend's numbers for the row."""
        raise NotImplementedError

    def charge(self, n: int, info: dict) -> None:
        """Emulated time of a phase not simulated request by request: the cost model's
        capacity-weighted split, every live group busy until the phase ends."""
        d = self.state.deploy
        dur = d.rollout_s(n, self.use_spot)
        with d.clock.concurrent() as phase:
            phase.run("rollout", d.od, dur)
            if self.use_spot:
                phase.run("rollout", d.spot_group(), dur)

    def settle(self, n: int, row: dict, spot_mode: bool) -> None:
        """Applies the trace events up to now; an abrupt loss while spot groups were busy costs
        the work since their last commit."""
        d = self.state.deploy
        d.advance(busy_spot_phase_s=d.rollout_s(n, True) if spot_mode else 0.0)

    def batch_from_results(self, results, rids, flat, seeds_per_prompt) -> dict:
        """A training batch from a drained queue's finished requests."""
        s = self.state
        trajs = [results[r].trajectory() for r in rids]
        batch = {key: np.stack([t[key] for t in trajs])
                 for key in ("latents", "log_probs", "images")}
        if s.decoder is not None:       # a latent model: the requests hold latents, not pixels
            batch["images"] = np.asarray(s.decoder.decode(batch["latents"][:, -1]))
        flat_prompts = [p for p, _ in flat]
        batch["tokens"], batch["mask"] = s.prompt_source.tokenize(flat_prompts, s.mcfg.text_len)
        batch["rewards"] = np.asarray(s.engine.reward_fn(batch["images"], flat_prompts),
                                      np.float32)
        return with_group_ids(batch, seeds_per_prompt)

    def requests(self, k: int, flat) -> tuple[list[str], list[sched.Request]]:
        T = self.state.train_sampler_cfg.num_steps
        rids = [f"k{k:05d}r{i:04d}" for i in range(len(flat))]
        return rids, [sched.Request(rid=r, prompt=p, seed=s, num_steps=T, policy_version=k)
                      for r, (p, s) in zip(rids, flat)]

    def close(self) -> None:
        pass


class ReadyBatch(Rollouts):
    """A phase with nothing to roll out: the batch was sampled during the previous update
    (``spotlight_pipelined``). No time is charged, and no spot rollout was in flight; the spot
    groups rewarded the candidates while exploring (their exploration charge includes it), so
    the iteration charges no reward phase either."""

    rewarded = True

    def rollout(self, k, prompts, seeds_per_prompt):
        raise RuntimeError("a ready batch is not rolled out")

    def charge(self, n, info):
        pass

    def settle(self, n, row, spot_mode):
        super().settle(n, row, spot_mode=False)


class DirectRollouts(Rollouts):
    """Chunked rollouts on the trainer's mesh (rewards of a chunk overlap the next chunk)."""

    def rollout(self, k, prompts, seeds_per_prompt):
        s = self.state
        flat = [p for p, ss in zip(prompts, seeds_per_prompt) for _ in range(len(ss))]
        seeds = np.concatenate([np.asarray(ss, np.uint32) for ss in seeds_per_prompt])
        batch = s.engine.run(s.trainer.sampling_state(), flat, seeds)
        return with_group_ids(batch, seeds_per_prompt), {}


class ScheduledRollouts(Rollouts):
    """The rollout phase through the pull scheduler: one request per (prompt, seed), pulled by
    the on-demand node and the live spot groups, committed every ``deployment.commit_every``
    steps; the trace's notices and losses during the phase hit in-flight work (a notice commits
    and hands requests back, an abrupt loss rolls them back to the last commit) and another
    group resumes it. The queue is drained when the phase ends, so checkpoints (between
    iterations) never hold in-flight requests.

    With ``on_groups`` each SP group computes its requests on its own devices (weights placed
    there when it forms, attention laid out by its SP strategy, one segment program per group
    layout, kept across iterations); otherwise every group computes on the trainer's device with
    the run's sampler (one program), the groups differing only in identity and emulated speed.
    """

    def __init__(self, state, on_groups: bool):
        super().__init__(state, use_spot=True)
        self.samplers = (sched.SamplerCache(state.graphdef, state.image_shape,
                                            state.train_sampler_cfg) if on_groups else None)
        self.steppers: list = []           # this phase's steppers (on_groups)

    def rollout(self, k, prompts, seeds_per_prompt):
        s = self.state
        d = s.deploy
        flat = flat_requests(prompts, seeds_per_prompt)
        horizon = 20 * d.rollout_s(len(flat), use_spot=True) + 3600.0
        setup = d.scheduler_setup(len(s.devices), horizon)
        q = sched.RequestQueue(s.image_shape)
        rids, reqs = self.requests(k, flat)
        q.submit(reqs)
        params = s.trainer.sampling_state()
        self.steppers = []
        with quiet("spotlight_jax.elastic", "spotlight_jax.sched"):  # a pool per phase
            sim = sched.Simulation(
                q, self._stepper, setup["events"],
                sched.SimConfig(pool=setup["pool"],
                                groups=GroupConfig(heads=s.mcfg.num_heads,
                                                   sp_degree=d.cfg.spot_sp),
                                worker=sched.WorkerConfig(commit_every=d.cfg.commit_every,
                                                          microbatch=4),
                                cost=setup["cost"],
                                check_invariants=False),   # checked per event in the sched tests
                policy=lambda node: (params, k), devices=s.devices,
                down_at_start=setup["down_at_start"])
            rep = sim.run()
        if not q.all_done:
            raise RuntimeError(f"iteration {k}: the scheduler finished with requests left "
                               f"({q.summary()}); no group could make progress")
        rep.check_accounting()
        batch = self.batch_from_results(q.results(), rids, flat, seeds_per_prompt)
        info = {"sched_makespan_s": rep.makespan, "sched_commits": rep.commits,
                "sched_wasted_steps": rep.wasted_steps, "sched_lost_steps": rep.lost_steps,
                "sched_events": rep.num_events,
                "sched_idle_tail": (rep.idle_tail_device_s / rep.alive_device_s
                                    if rep.alive_device_s else 0.0),
                "sched_lost_work_s": rep.wasted_steps * setup["sample_step_s"],
                "sched_spot_busy_device_s": rep.busy_by_role.get("spot", 0.0)}
        if self.samplers is not None:
            # devices that really computed segments this phase (one group per device set)
            info["sched_group_devices"] = len({dev for st in self.steppers if st.calls
                                               for dev in st.group.device_ids})
        return batch, info

    def _stepper(self, group):
        s = self.state
        if self.samplers is None:
            return sched.SamplerStepper(s.sampler, s.mcfg.text_len,
                                        tokenize=s.prompt_source.tokenize)
        stepper = sched.SamplerStepper(self.samplers.get(group), s.mcfg.text_len, group,
                                       tokenize=s.prompt_source.tokenize)
        self.steppers.append(stepper)
        return stepper

    def charge(self, n, info):
        d = self.state.deploy
        with d.clock.concurrent() as phase:
            phase.run("rollout", d.od, info["sched_makespan_s"])
            spot = d.spot_group()
            phase.charge(spot, info["sched_spot_busy_device_s"] / spot.num_devices, "rollout")

    def settle(self, n, row, spot_mode):
        # the scheduler measured the work preemptions cost (abrupt losses since the last
        # commit); the trace events it saw are applied to the deployment here
        d = self.state.deploy
        d.advance()
        d.stats["lost_work_s"] += row["sched_lost_work_s"]


class RayRollouts(Rollouts):
    """The rollout phase on real spot hosts (``deployment.transport='ray'``): one request per
    (prompt, seed) in a queue owned here, pulled by the run's :class:`~spotlight_jax.runner.
    ray_fleet.RayFleet` (one host actor per spot node, started on first use and whenever fewer
    are alive than the deployment wants; this iteration's weights published once and pulled by
    every host). A host that dies hands its requests back (they resume from their last commit
    on another host); whatever is left when no host remains runs on the trainer's devices, which
    never leave."""

    def __init__(self, state):
        super().__init__(state, use_spot=True)

    @property
    def hosts(self) -> list:
        return self.state.ray_fleet.hosts

    def rollout(self, k, prompts, seeds_per_prompt):
        s = self.state
        fleet = s.ray_fleet
        t0 = time.perf_counter()
        params = s.trainer.sampling_state()
        fleet.top_up(k, params)
        flat = flat_requests(prompts, seeds_per_prompt)
        queue = ray_hosts.LockedQueue(sched.RequestQueue(s.image_shape,
                                                         sched.QueueConfig(lease_s=3600.0)))
        rids, reqs = self.requests(k, flat)
        queue.submit(reqs)
        served = fleet.serve(queue)
        acc = fleet.accounting(queue, served)
        fallback = 0
        if not queue.all_done:   # every host left: the trainer's devices finish the phase
            fallback = fleet.finish_locally(queue, params, k)
        results = queue.results()
        mixed = sum(set(results[r].state.versions) != {k} for r in rids)
        if len(results) != len(rids) or mixed:
            raise RuntimeError(f"iteration {k}: {len(results)} of {len(rids)} rollouts complete, "
                               f"{mixed} with steps of another policy version: refusing to "
                               "train on a short or mixed batch")
        batch = self.batch_from_results(results, rids, flat, seeds_per_prompt)
        counts = fleet.take_counts()
        info = {"ray_hosts_started": counts["started"],
                "ray_hosts_lost": counts["dead"] + served["lost"],
                "ray_hosts_lost_busy": served["lost"], "ray_hosts_live": len(fleet.hosts),
                "ray_hosts_starting": len(fleet.starting),
                "ray_publish_bytes": fleet.publish_bytes,
                "ray_hosts_noticed": served["noticed"], "ray_hosts_joined": served["joined"],
                "ray_request_steps": served["steps"], "ray_fallback_calls": fallback,
                "ray_redone_steps": acc["redone_steps"], "ray_duplicates": acc["duplicates"],
                "ray_rollout_wall_s": time.perf_counter() - t0}
        return batch, info
