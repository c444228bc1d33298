"""The run's Ray spot hosts (``deployment.transport='ray'``): one fleet, three kinds of work.

:class:`RayFleet` owns the spot host actors (:mod:`spotlight_jax.cluster.ray_hosts`): one per
spot node, started on first use, replaced when found dead, each told the policy version to
install; a version's weights are published into the object store once, and hosts pull them from
there (a host that joins late pulls the latest, never from the trainer's devices). The rollout
phase (``runner.rollouts.RayRollouts``) and exploration (:class:`RayExplorer`) hand the same
hosts requests through a queue the runner owns; a shared update (:class:`RayShards`) hands them
gradient shards as actor calls between those requests.

:class:`RayExplorer` is ``spotlight``'s explorer on those hosts (the
:class:`~spotlight_jax.explore.explorer.Explorer` protocol): while the trainer runs update k, the
hosts score exploration candidates with θ_k, the weights they hold. Each candidate is a request
of the pull scheduler (kind ``explore``: its commits carry the latent only), committed every
``deployment.commit_every`` steps, so a host's notice or loss hands its candidates to another
host from their last commit. A host
rewards the candidates it completes itself (its own VAE for a latent model); the runner receives
(prompt, seed, reward) per candidate. When the mode trains on the candidates' own trajectories
(``spotlight_pipelined``) the hosts retain them, and only the chosen candidates' travel
(:meth:`RayExplorer.select`). With ``deployment.ray_explore_deadline`` exploration runs
on the wall clock: the plan's budget is the update's duration predicted from the last ones times
the hosts' measured candidate rate (:meth:`RayExplorer.plan_budget`), and the candidates not
finished when the update ends are dropped, never waited for (exploration never lengthens the
critical path); without it (a fixed plan from the cost model, as the tests compare) the trainer's
devices finish whatever no host can. A completed candidate whose steps ran on a policy version
other than the one asked for is rejected, never used.
"""
from __future__ import annotations

import functools
import threading
import time

import numpy as np
from absl import logging

from spotlight_jax import sched
from spotlight_jax.cluster import ray_hosts
from spotlight_jax.sched.requests import pixels

# how each serving thread's loop may end (ray_hosts.serve); hosts that left otherwise are gone
_STILL_UP = ("done", "stopped")


class RayFleet:
    """The spot host actors of a run over ``state`` (a ``RunState``)."""

    def __init__(self, state):
        self.state = state
        self.hosts: list = []             # live spot host workers (ray_hosts.RayWorker)
        self.starting: list = []          # (actor, info ref) of hosts still starting
        self._next_host = 0
        self._published = None            # (version, object ref) of the last weights
        self.where = None                 # the Ray cluster joined (ray_hosts.connect)
        self._base = None                 # the base's object ref (LoRA runs), put once
        self.publish_bytes = 0            # bytes of the last published version
        self._counts = {"started": 0, "dead": 0}   # since the last take_counts()

    def worker_config(self) -> dict:
        """The hosts' ``WorkerConfig``: a mode that trains on explored candidates has them
        retain their trajectories (fetched for the chosen ones only)."""
        d = self.state.deploy
        keep = bool(getattr(getattr(self.state, "mode", None), "keep_candidates", False))
        return {"commit_every": d.cfg.commit_every, "steps_per_call": 1, "microbatch": 4,
                "retain": keep}

    def publish(self, version: int, params) -> object:
        """The object ref of ``version`` (``params``, the sampling weights), put into the
        object store once: with LoRA only the trainer's sampling factors (the hosts merge them
        into their resident base), else the full weights. ``publish_bytes`` is its size."""
        if self._published is None or self._published[0] != version:
            tr = self.state.trainer
            rank = int(getattr(tr.cfg, "lora_rank", 0) or 0)
            if rank:
                ref, self.publish_bytes = ray_hosts.publish_policy(
                    lora=tr.sampling_trainable(), scale=tr.cfg.lora_alpha / rank)
            else:
                ref, self.publish_bytes = ray_hosts.publish_policy(full=params)
            self._published = (version, ref, bool(rank))
        return self._published[1]

    def _base_ref(self):
        """The frozen base in the object store, put once per run (hosts that cannot load it
        themselves pull it when they join): what a LoRA version is merged into, and the
        reference a gradient shard's KL term needs (a shared update, LoRA or not)."""
        if self._base is None:
            self._base = ray_hosts.publish(self.state.base_state)
        return self._base

    def connect(self) -> None:
        """Joins ``deployment.ray_address`` (default ``RAY_ADDRESS``), else starts a local Ray
        instance with a CPU per spot host and the spot resource on it."""
        if self.where is None:
            s, d = self.state, self.state.deploy
            res = s.settings.ray_spot_resource
            self.where = ray_hosts.connect(
                s.settings.ray_address, local_cpus=d.cfg.spot_nodes,
                local_resources={res: d.cfg.spot_nodes} if res else None)

    def top_up(self, version: int, params) -> tuple[int, int]:
        """Has every live host hold ``version`` (``params``, published once), starts hosts for
        the missing spot nodes and admits those that are up; returns (started, found dead).

        A host still starting does not hold the phase up: it joins a later one (on a real
        cluster its replacement may wait for a new node). The phase waits for the hosts it just
        started only up to ``deployment.ray_host_wait_s`` seconds, or, on a local instance this
        process started (which has every host's resources), until they are up."""
        d = self.state.deploy
        self.connect()
        ref = self.publish(version, params)
        lost = self._install(ref, version)
        missing = d.cfg.spot_nodes - len(self.hosts) - len(self.starting)
        for _ in range(max(missing, 0)):
            self._launch()
        wait = self.state.settings.ray_host_wait_s
        if missing > 0 and wait <= 0 and self.where == "local":
            wait = 600.0
        lost += self._admit(wait if missing > 0 else 0.0)
        lost += self._install(ref, version)
        self._counts["started"] += max(missing, 0)
        self._counts["dead"] += lost
        return max(missing, 0), lost

    def take_counts(self) -> dict:
        """Hosts started and found dead (idle, starting or being handed weights) since the last
        call: each counted once, whichever phase's row reports it."""
        out, self._counts = self._counts, {"started": 0, "dead": 0}
        return out

    def _launch(self) -> None:
        s, d = self.state, self.state.deploy
        i, self._next_host = self._next_host, self._next_host + 1
        res = s.settings.ray_spot_resource
        actor, info = ray_hosts.launch_host(
            f"spot{i}", s.spec.plain(), cpu_devices=d.cfg.spot_devices_per_node,
            worker=self.worker_config(), resources={res: 1} if res else None)
        self.starting.append((actor, info))

    def _admit(self, timeout_s: float) -> int:
        """Hosts whose start finished (within ``timeout_s``) join the fleet; returns how many
        died while starting."""
        if not self.starting:
            return 0
        import ray  # noqa: PLC0415 - the optional cluster extra
        refs = [info for _, info in self.starting]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(timeout_s, 0.0))
        ready = set(ready)
        died, still = 0, []
        for actor, info in self.starting:
            if info not in ready:
                still.append((actor, info))
                continue
            try:
                self.hosts.append(ray_hosts.RayWorker(actor, ray.get(info)))
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                # a lost node, or a host that could not start (its error, first line)
                logging.warning("a spot host died while starting: %s",
                                str(e).strip().splitlines()[0] if str(e).strip() else e)
                died += 1
        self.starting = still
        return died

    def _install(self, ref, version: int, hosts=None) -> int:
        """``version`` (and, for LoRA or a shared update, the base) onto each of ``hosts``
        (default: every live host) that lacks it; drops the dead ones from the fleet and
        returns how many."""
        hosts = self.hosts if hosts is None else hosts
        alive, lost = [], 0
        base = self._published[2] or self.state.shared_update.enabled
        for w in hosts:
            try:
                if base and not w.has_base:
                    w.set_base(self._base_ref())
                if w.policy_version != version:
                    w.set_policy(ref, version)
                alive.append(w)
            except ray_hosts.WorkerLost:
                lost += 1
        dead = {id(w) for w in hosts} - {id(w) for w in alive}
        self.hosts = [w for w in self.hosts if id(w) not in dead]
        return lost

    def serve(self, queue, *, stop: threading.Event | None = None,
              rewards: dict | None = None, poll_s: float = 0.2) -> dict:
        """Every host pulls from ``queue`` (one thread each) until it is drained, ``stop`` is
        set or the host leaves; a host that finishes starting meanwhile installs the current
        version and joins at once; hosts that left are dropped. Returns how each loop ended,
        the request-steps the hosts computed and how many joined mid-phase."""
        steps_before = {w.group_id: w.steps for w in self.hosts}
        stats: dict = {}
        threads = ray_hosts.serve_in_threads(self.hosts, queue, stop=stop, rewards=rewards,
                                             out=stats)[0]
        joined = 0
        while alive := [t for t in threads if t.is_alive()]:
            alive[0].join(timeout=poll_s)
            if self.starting and not queue.all_done and not (stop is not None and stop.is_set()):
                new = self._join_now()
                joined += len(new)
                steps_before.update({w.group_id: w.steps for w in new})
                threads += ray_hosts.serve_in_threads(new, queue, stop=stop, rewards=rewards,
                                                      out=stats)[0]
        left = {g: st["left"] for g, st in stats.items()}
        computed = sum(w.steps - steps_before[w.group_id] for w in self.hosts)
        self.hosts = [w for w in self.hosts if left.get(w.group_id, "done") in _STILL_UP]
        return {"left": left, "steps": computed, "joined": joined,
                "lost": sum(v == "lost" for v in left.values()),
                "noticed": sum(v == "notice" for v in left.values())}

    def _join_now(self) -> list:
        """Hosts that finished starting, holding the published version: they join the phase
        being served."""
        before = len(self.hosts)
        self._counts["dead"] += self._admit(0.0)
        new = self.hosts[before:]
        version, ref, _ = self._published
        self._counts["dead"] += self._install(ref, version, new)
        return [w for w in new if w in self.hosts]

    @staticmethod
    def accounting(queue, served: dict) -> dict:
        """What a phase's queue says about its requests once the hosts stopped: request-steps
        the hosts computed but never committed (redone elsewhere after a loss, or dropped) and
        commits refused because their request was already complete. Call before any local
        finishing (its commits are not the hosts')."""
        return {"redone_steps": max(served["steps"] - queue.stats["committed_steps"], 0),
                "duplicates": queue.stats["duplicates"]}

    def finish_locally(self, queue, params, version: int) -> int:
        """Runs what is left in ``queue`` on the trainer's devices (no host could); returns the
        calls made."""
        s = self.state
        local = sched.InProcessWorker(
            "od0", sched.SamplerStepper(s.sampler, s.mcfg.text_len,
                                        tokenize=s.prompt_source.tokenize),
            config=sched.WorkerConfig(commit_every=s.deploy.cfg.commit_every, microbatch=4),
            params=params, version=version)
        return local.run(queue)["calls"]

    def final_images(self, latents: np.ndarray) -> np.ndarray:
        """Images of final latents, as a host computes them (the VAE for a latent model)."""
        dec = self.state.decoder
        return pixels(latents) if dec is None else np.asarray(dec.decode(latents))

    def close(self) -> None:
        if self.hosts or self.starting:
            import ray  # noqa: PLC0415 - the optional cluster extra
            for actor in [w.actor for w in self.hosts] + [a for a, _ in self.starting]:
                ray.kill(actor)
            self.hosts, self.starting = [], []


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
