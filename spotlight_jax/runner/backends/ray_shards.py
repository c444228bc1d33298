"""A shared update's gradient shards on the run's Ray spot hosts (:class:`RayShards`)."""
from __future__ import annotations

import functools
import time

from spotlight_jax.cluster import ray_hosts
from spotlight_jax.runner.backends.ray_fleet import RayFleet


class RayShards:
    """A shared update's gradient shards on the Ray spot hosts (``deployment.shared_update``
    over ``deployment.transport='ray'``): per optimizer step, the last share of its shards that
    the iteration's plan chose (``fixed``: ``update_spot_share``; ``auto``/``payoff``: the
    split planned for the iteration) go to the live hosts (dealt round-robin; the step's weights
    put into the object store once, each shard's rows with its call) while the trainer computes
    the others. Then, in shard order, a host's result that has arrived is taken; for
    one that has not, the idle trainer starts recomputing it and whichever result is ready first
    is used, so the step never waits on a host longer than the trainer's own recomputation
    takes; a host that died is seen as its call's error and its shard computed here. The
    results are summed in shard order (``ShardedStep.apply``), whoever computed them: the same
    step to float rounding.

    The hosts run the shard calls between their exploration calls (one call at a time per host).
    """

    poll_s = 0.005        # how often an idle trainer looks for a host's result

    def __init__(self, fleet: RayFleet):
        self.fleet = fleet
        self.counts = self._zero()

    @staticmethod
    def _zero() -> dict:
        return {"update_shards": 0, "update_shards_spot": 0, "update_lost": 0,
                "update_dropped": 0, "update_wall_s": 0.0}

    def take_counts(self) -> dict:
        """The shard counts since the last call: shards, those a host computed and the trainer
        used, those lost with a host, those the trainer took over from a slow host, and the
        update's wall seconds (the row entries; they replace the emulated window's counts)."""
        out, self.counts = self.counts, self._zero()
        return out

    def runner(self, plan):
        """``run`` for a trainer's ``update_sharded`` under ``plan`` (the iteration's
        :class:`~spotlight_jax.runner.shared_update.UpdatePlan`): its share on the hosts."""
        return functools.partial(self.run, share=plan.share)

    def run(self, step, share: float) -> dict:
        """One optimizer step with ``share`` of its shards on the live hosts."""
        import ray  # noqa: PLC0415 - the optional cluster extra

        from spotlight_jax.rl.shards import ShardResult  # noqa: PLC0415
        t0 = time.perf_counter()
        hosts = list(self.fleet.hosts)
        quota = round(share * step.shards) if hosts else 0
        remote = list(range(step.shards - quota, step.shards))
        pending = {}
        if remote:
            weights_ref = ray.put(ray_hosts.host_arrays_tree(step.inputs(remote[0])[0]))
            for j, i in enumerate(remote):
                rows = ray_hosts.host_arrays_tree(step.inputs(i)[1])
                pending[i] = hosts[j % len(hosts)].shard(weights_ref, ray.put(rows))
        results = [step.compute(i) for i in range(step.shards) if i not in pending]
        c = self.counts
        for i, ref in sorted(pending.items()):
            ready, local = ray.wait([ref], timeout=0)[0], None
            if not ready:     # the trainer is idle: it recomputes, and the first result wins
                local = step.compute(i)           # dispatched, not waited for
                # a host's result that arrived meanwhile wins a tie: it is already paid for
                ready = ray.wait([ref], timeout=0)[0]
                while not ready and not _is_ready(local):
                    ready = ray.wait([ref], timeout=self.poll_s)[0]
                if not ready:
                    c["update_dropped"] += 1      # the host's result, when it comes, is unused
                    results.append(local)
                    continue
            try:
                grads, metrics = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
                c["update_lost"] += 1             # the host is gone: computed here
                results.append(local if local is not None else step.compute(i))
                continue
            results.append(ShardResult(i, grads, metrics))
            c["update_shards_spot"] += 1
        out = step.apply(results)
        c["update_shards"] += step.shards
        c["update_wall_s"] += time.perf_counter() - t0
        return out


def _is_ready(result) -> bool:
    """Whether every array of a locally dispatched shard result has been computed."""
    import jax  # noqa: PLC0415
    return all(x.is_ready() for x in jax.tree.leaves((result.grads, result.metrics))
               if isinstance(x, jax.Array))
