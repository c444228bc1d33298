"""The rollout phase through the pull scheduler on the emulated pool
(:class:`ScheduledRollouts`)."""
from __future__ import annotations

from spotlight_jax import sched
from spotlight_jax.elastic import GroupConfig
from spotlight_jax.runner.backends.rollouts import Rollouts, flat_requests, quiet

MICROBATCH = 4      # trajectories per scheduled call on a group (one compiled batch shape)


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
        # leases of whole microbatches: a call's batch is padded to the microbatch (one
        # compiled shape), so a smaller lease would pay for rows it does not need
        q = sched.RequestQueue(s.image_shape, sched.QueueConfig(sizing="fixed",
                                                                fixed_batch=MICROBATCH))
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
                                                          microbatch=MICROBATCH),
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
                "sched_calls": rep.calls,
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

    def settle(self, row):
        # the scheduler measured the work preemptions cost (abrupt losses since the last
        # commit); the trace events it saw are applied to the deployment here
        d = self.state.deploy
        d.advance()
        d.stats["lost_work_s"] += row["sched_lost_work_s"]
