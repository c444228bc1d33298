"""The rollout phase on the run's Ray spot hosts (:class:`RayRollouts`)."""
from __future__ import annotations

import time

from spotlight_jax import sched
from spotlight_jax.cluster import ray_hosts
from spotlight_jax.runner.backends.rollouts import Rollouts, flat_requests


class RayRollouts(Rollouts):
    """The rollout phase on real spot hosts (``deployment.transport='ray'``): one request per
    (prompt, seed) in a queue owned here, pulled by the run's ``backends.ray_fleet.RayFleet``
    (one host actor per spot node, started on first use and whenever fewer are alive than the
    deployment wants; this iteration's weights published once and pulled by
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
