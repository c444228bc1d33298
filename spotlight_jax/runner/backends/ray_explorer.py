"""``spotlight``'s explorer on the run's Ray spot hosts (:class:`RayExplorer`, the
:class:`~spotlight_jax.explore.explorer.Explorer` protocol): while the trainer runs update k, the
hosts of the :class:`~spotlight_jax.runner.backends.ray_fleet.RayFleet` score exploration
candidates with θ_k, the weights they hold. Each candidate is a request of the pull scheduler
(kind ``explore``: its commits carry the latent only), committed every
``deployment.commit_every`` steps, so a host's notice or loss hands its candidates to another
host from their last commit. A host rewards the candidates it completes itself (its own VAE for a
latent model); the runner receives (prompt, seed, reward) per candidate. When the mode trains on
the candidates' own trajectories (``spotlight_pipelined``) the hosts retain them, and only the
chosen candidates' travel (:meth:`RayExplorer.select`). With ``deployment.ray_explore_deadline``
exploration runs on the wall clock: the plan's budget is the update's duration predicted from
the last ones times the hosts' measured candidate rate (:meth:`RayExplorer.plan_budget`), and
the candidates not finished when the update ends are dropped, never waited for (exploration
never lengthens the critical path); without it (a fixed plan from the cost model, as the tests
compare) the trainer's devices finish whatever no host can. A completed candidate whose steps
ran on a policy version other than the one asked for is rejected, never used.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from spotlight_jax import sched
from spotlight_jax.cluster import ray_hosts
from spotlight_jax.runner.backends.ray_fleet import RayFleet


class RayExplorer:
    """Scores candidate seeds on the Ray spot hosts with the weights :meth:`pull` installed (the
    stale θ_k; the ``state`` argument of :meth:`score` is not used)."""

    def __init__(self, fleet: RayFleet, deadline: bool):
        self.fleet = fleet
        self.deadline = bool(deadline)
        self.version: int | None = None
        self._params = None
        self._stop = threading.Event()
        self.queue = None                 # the last exploration's queue (its accounting)
        self._windows: list[float] = []   # measured update wall seconds
        self._rates: list[float] = []     # measured candidates per second, all hosts
        self.last: dict = {}              # the last exploration's numbers

    def pull(self, params, version: int) -> tuple[float, int]:
        """Has every host hold ``version`` (published to the object store once; hosts that
        died are replaced). Returns (seconds, bytes of the published version)."""
        t0 = time.perf_counter()
        self.fleet.top_up(version, params)
        self.version, self._params = int(version), params
        self._stop.clear()
        self.queue = None
        self.last = dict.fromkeys(("explore_hosts", "explore_hosts_started",
                                   "explore_hosts_dead", "explore_hosts_joined", "explore_lost",
                                   "explore_dropped", "explore_rejected"), 0)
        return time.perf_counter() - t0, self.fleet.publish_bytes

    def update_done(self, update_s: float | None = None) -> None:
        """The update this exploration overlaps has ended (after ``update_s`` wall seconds):
        with a deadline, candidates not finished now are dropped."""
        if update_s is not None:
            self._windows.append(float(update_s))
        if self.deadline:
            self._stop.set()

    def _rid(self, prompt: int, candidate: int) -> str:
        return f"v{self.version:05d}p{prompt:03d}c{candidate:04d}"

    def _requests(self, prompts, seeds_per_prompt, kind: str) -> list[sched.Request]:
        """One request per candidate, prompt after prompt: a deadline then leaves a few prompts
        fully explored rather than every prompt with fewer than G scored (a prompt's selection
        gains only from candidates beyond its G)."""
        T = self.fleet.state.train_sampler_cfg.num_steps
        return [sched.Request(rid=self._rid(i, j), prompt=prompts[i],
                              seed=int(s), num_steps=T, kind=kind, policy_version=self.version)
                for i, ss in enumerate(seeds_per_prompt) for j, s in enumerate(ss)]

    def plan_budget(self, budget_s: float, per_candidate_s: float,
                    base_candidates: int) -> tuple[float, float, float | None]:
        """The planner's ``(budget_s, per_candidate_s, capacity)``: with a deadline and
        measurements, the wall seconds the next update is predicted to take (median of the last
        three), the seconds per candidate at the hosts' measured rate (median of the last three
        explorations, all hosts together), and the candidates that fit in that window; the
        planner spends the window on extras as if the base candidates were free, and only the
        prompts whose whole pools fit are scored (``exploration.within_capacity``). Else the
        cost model's numbers as given, every candidate scored."""
        if not (self.deadline and self._windows and self._rates):
            return budget_s, per_candidate_s, None
        per = 1.0 / float(np.median(self._rates[-3:]))
        window = float(np.median(self._windows[-3:]))
        return window, per, window / per

    def score(self, state, prompts, seeds_per_prompt, keep_trajectories: bool = False):
        """Per-prompt reward arrays (NaN for a candidate dropped at the deadline) and, with
        ``keep_trajectories``, the candidates' rollout batch (a dropped candidate's rows are
        zeros). ``self.last`` holds this call's numbers for the iteration's row."""
        del state
        if self.version is None:
            raise RuntimeError("RayExplorer.score before pull: no policy version on the hosts")
        s, fleet = self.fleet.state, self.fleet
        t0 = time.perf_counter()
        # exploration requests either way: their commits carry the latent only; with
        # ``keep_trajectories`` the hosts retain each trajectory and :meth:`select` fetches the
        # chosen candidates' (WorkerConfig.retain)
        reqs = self._requests(prompts, seeds_per_prompt, "explore")
        queue = ray_hosts.LockedQueue(sched.RequestQueue(s.image_shape,
                                                         sched.QueueConfig(lease_s=3600.0)))
        queue.submit(reqs)
        self.queue = queue
        host_rewards: dict[str, float] = {}
        served = fleet.serve(queue, stop=self._stop, rewards=host_rewards)
        acc = fleet.accounting(queue, served)
        fallback = 0
        if not queue.all_done and not self.deadline:
            # a fixed plan: the trainer's devices finish it (with a deadline the unfinished
            # candidates are dropped: exploration never takes the trainer's time)
            fallback = fleet.finish_locally(queue, self._params, self.version)
        results = queue.results()
        wrong = [r for r, q in results.items() if set(q.state.versions) != {self.version}]
        for r in wrong:
            del results[r]
        rewards = self._rewards(results, host_rewards)
        by_id = {q.rid: q for q in reqs}
        per_prompt = []
        for i, ss in enumerate(seeds_per_prompt):
            rids = [self._rid(i, j) for j in range(len(ss))]
            per_prompt.append(np.asarray([rewards.get(r, np.nan) for r in rids], np.float32))
        done_by = {c.group_id for r, c in queue.completed().items() if r in results}
        elapsed = time.perf_counter() - t0
        T = s.train_sampler_cfg.num_steps
        if served["steps"] and elapsed > 0:
            self._rates.append(served["steps"] / T / elapsed)
        counts = fleet.take_counts()
        self.last = {"explore_hosts": len(done_by - {"od0"}),
                     "explore_hosts_started": counts["started"],
                     "explore_hosts_dead": counts["dead"],
                     "explore_hosts_joined": served["joined"],
                     "explore_lost": served["lost"] + served["noticed"],
                     "explore_dropped": len(reqs) - len(results),
                     "explore_rejected": len(wrong),
                     "explore_fallback_calls": fallback,
                     "explore_request_steps": served["steps"],
                     # computed, never committed: lost with a host, or unfinished at the deadline
                     "explore_wasted_steps": acc["redone_steps"],
                     "explore_duplicates": acc["duplicates"],
                     "explore_s": elapsed}
        if not keep_trajectories:
            return per_prompt
        order = [self._rid(i, j) for i, ss in enumerate(seeds_per_prompt)
                 for j in range(len(ss))]
        where = {r: c.group_id for r, c in queue.completed().items() if r in results}
        return per_prompt, {"order": order, "results": results, "requests": by_id,
                            "rewards": rewards, "where": where}

    def select(self, kept, rows) -> dict:
        """The chosen candidates' rollout batch: each trajectory fetched from the host that
        ran it (retained there; only these travel), or, where that host is gone or resumed
        the candidate from another's commit, re-sampled on the trainer's devices with the
        version's weights (the same seed and weights: the same trajectory). Counts both in
        ``self.last`` (``explore_fetched``, ``explore_resampled``, ``explore_fetch_bytes``)."""
        order, results, rewards = kept["order"], kept["results"], kept["rewards"]
        rids = [order[i] for i in np.asarray(rows)]
        missing_result = [r for r in rids if r not in results]
        if missing_result:
            raise ValueError(f"select: candidates {missing_result[:3]} were not completed; a "
                             "mode trains only on scored candidates")
        trajs: dict[str, dict] = {}
        hosts = {w.group_id: w for w in self.fleet.hosts}
        by_host: dict[str, list[str]] = {}
        for r in rids:
            by_host.setdefault(kept["where"].get(r, ""), []).append(r)
        for group, mine in by_host.items():
            w = hosts.get(group)
            if w is None:
                continue
            try:
                trajs.update(w.trajectories(mine))
            except ray_hosts.WorkerLost:
                pass
        fetched = len(trajs)
        nbytes = sum(a.nbytes for t in trajs.values() for a in t.values())
        rest = [r for r in rids if r not in trajs]
        if rest:
            trajs.update(self._resample([kept["requests"][r] for r in rest]))
        self.last.update(explore_fetched=fetched, explore_resampled=len(rest),
                         explore_fetch_bytes=int(nbytes))
        return self._batch(rids, trajs, kept["requests"], rewards)

    def _resample(self, reqs) -> dict[str, dict]:
        """Trajectories of ``reqs`` sampled on the trainer's devices with this version's
        weights (as rollout requests through a local worker)."""
        s = self.fleet.state
        again = [sched.Request(rid=q.rid, prompt=q.prompt, seed=q.seed, num_steps=q.num_steps,
                               kind="rollout", policy_version=self.version) for q in reqs]
        queue = sched.RequestQueue(s.image_shape, sched.QueueConfig(lease_s=3600.0))
        queue.submit(again)
        self.fleet.finish_locally(queue, self._params, self.version)
        done = queue.results()
        return {q.rid: {k: v for k, v in done[q.rid].trajectory().items() if k != "images"}
                for q in again}

    def _rewards(self, results, host_rewards) -> dict[str, float]:
        """Each completed candidate's reward: the host's, or (finished on the trainer's devices)
        computed here."""
        out = {r: host_rewards[r] for r in results if r in host_rewards}
        rest = [r for r in results if r not in out]
        if rest:
            s = self.fleet.state
            images = self.fleet.final_images(np.stack([results[r].state.latent for r in rest]))
            scores = np.asarray(s.engine.reward_fn(images, [results[r].prompt for r in rest]),
                                np.float32)
            out.update({r: float(x) for r, x in zip(rest, scores)})
        return out

    def _batch(self, order, trajs, by_id, rewards) -> dict:
        """The rollout batch of the candidates ``order`` (each in ``trajs``)."""
        s = self.fleet.state
        batch = {key: np.stack([trajs[r][key] for r in order]) for key in ("latents", "log_probs")}
        batch["images"] = self.fleet.final_images(batch["latents"][:, -1])
        flat_prompts = [by_id[r].prompt for r in order]
        batch["tokens"], batch["mask"] = s.prompt_source.tokenize(flat_prompts, s.mcfg.text_len)
        batch["rewards"] = np.asarray([rewards.get(r, np.nan) for r in order], np.float32)
        return batch
