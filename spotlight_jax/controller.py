"""The controller: runs post-training iterations for every mode on top of the library layers.

Modes (contract, ``config.mode``), one iteration k each:

* ``flow_grpo``: prompts P_k, G random seeds each (pure functions of (run seed, k)); rollouts with
  the current policy on the on-demand devices (chunked; rewards of chunk i run in a thread pool
  while chunk i+1 samples) -> GRPO advantages -> GRPO update.
* ``explore_sync``: before the rollout, G + extra candidate seeds per prompt are rolled out with
  the current policy on the critical path; the max-variance G-subset of each prompt is trained on
  directly (those rollouts *are* on-policy training rollouts, never run twice).
* ``spot_rollout``: as ``flow_grpo``, with spot devices helping with rollouts; they idle while
  the on-demand devices train.
* ``spotlight``: rollouts of P_k from the seeds S_k chosen last iteration, on on-demand + spot
  devices; then *concurrently* the GRPO update θ_k -> θ_{k+1} on the on-demand devices and
  exploration of candidate seeds for P_{k+1} with the stale θ_k on the spot devices, as many as
  the bandit planner fits into the training time; S_{k+1} = max-variance G-subsets; the planner
  learns from the explored pools. Training stays on-policy: the next rollout re-runs the chosen
  seeds with θ_{k+1}. With no spot device alive it degrades to ``flow_grpo`` and says so.
  The exploration really runs concurrently with the update: θ_k is copied device to device
  onto a mesh of devices the trainer does not use (``builders.explore_mesh``) and scored in a
  worker thread while the main thread dispatches the update (JAX releases the GIL while
  programs run); the row records both wall intervals and their overlap. Both are pure
  functions of their inputs, so the results do not depend on the interleaving.

Every mode then runs a periodic held-out evaluation (ODE sampler, fixed seeds) and a periodic
checkpoint of the full state (policy, optimizer, EMA, planner, next seeds, clock, trace cursor).
The learning is real computation; the time and dollar axes come from ``spotlight_jax.emulation``
(a virtual clock charged by a cost model and a spot trace), so a CPU run reproduces the
deployment's timeline.

Everything random is a function of (config.seed, iteration), and the full state (policy,
optimizer, EMA, iteration, history) is checkpointed, so a resumed run repeats the same numbers.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging as pylogging
import os
import time

import jax
import numpy as np
from absl import logging
from jax.sharding import NamedSharding, PartitionSpec
from tqdm.auto import tqdm

from spotlight_jax import rewards, world
from spotlight_jax.builders import (
    build_mesh,
    eval_reward,
    explore_mesh,
    fleet_devices,
    make_trainer,
    model_config,
    objective,
    rl_config,
    sampler_config,
)
from spotlight_jax.checkpoint import RunCheckpointer
from spotlight_jax.diffusion import Sampler
from spotlight_jax.emulation import Deployment
from spotlight_jax.evaluate import evaluate
from spotlight_jax.explore import max_variance_subset
from spotlight_jax.explore.explorer import Explorer, RolloutEngine, candidate_seeds
from spotlight_jax.explore.planner import Planner, PlannerConfig
from spotlight_jax.metrics import MetricWriter
from spotlight_jax.plots import plot_curves, save_grid
from spotlight_jax.rewards import get_components
from spotlight_jax.rl import (
    advantages,
    decoupled_advantages,
    group_stats,
)
from spotlight_jax.spot_fleet import STAT_KEYS as FLEET_KEYS
from spotlight_jax.spot_fleet import FleetExplorer

MODES = ("flow_grpo", "explore_sync", "spot_rollout", "spotlight")


def iteration_prompts(prompts, k: int, n: int, seed: int):
    """The ``n`` training prompts of iteration ``k`` (a pure function of (seed, k))."""
    rng = np.random.default_rng([seed, k, 17])
    return [prompts[i] for i in rng.choice(len(prompts), n, replace=False)]


def rollout_on_groups(setting) -> bool:
    """Resolves ``deployment.rollout_on_groups``: ``'auto'`` computes scheduled rollouts on the
    groups' own devices where they are separate hardware (not the CPU backend, whose emulated
    devices share the same cores: measured 1.45x slower per rollout phase on 2 cores, plus one
    segment compile per group layout)."""
    if isinstance(setting, bool):
        return setting
    choice = str(setting).lower()
    if choice not in ("auto", "true", "false"):
        raise ValueError(f"deployment.rollout_on_groups={setting!r}: use 'true', 'false' or "
                         "'auto'")
    return jax.default_backend() != "cpu" if choice == "auto" else choice == "true"


def group_seeds(run_seed: int, k: int, num_prompts: int, group_size: int,
                shared_bits: int = 0) -> list[np.ndarray]:
    """The random baseline's seeds: the first G exploration candidates of each prompt slot."""
    return [candidate_seeds(run_seed, k, i, group_size, shared_bits)
            for i in range(num_prompts)]


class Run:
    """State and helpers of one post-training run in ``workdir``."""

    def __init__(self, config, workdir, graphdef, base, devices=None, trainer=None):
        if config.mode not in MODES:
            raise ValueError(f"unknown mode {config.mode!r}; choose one of {MODES}")
        self.config, self.workdir, self.mode = config, workdir, config.mode
        # This process's devices: the controller never places work on another process's
        # devices (in a multi-process trainer job only the trainer's collectives span them).
        self.devices = list(jax.local_devices())
        # The trainer's mesh: parameters placed by the rule table, batches split over data/fsdp.
        # With a ``trainer`` given (a multi-process ``cluster.job.TrainerJob``), the update runs
        # on that trainer's own mesh and this one holds the sampling weights.
        if devices is None and config.get("trainer_devices", 0):
            devices = self.devices[:config.trainer_devices]
        self.mesh = build_mesh(config, devices if devices is not None else self.devices)
        base = shard_state(base, self.mesh)
        self.mcfg = model_config(config)
        self.rl = rl_config(config)
        self.reward_parts = None
        if self.rl.advantage == "decoupled":
            if self.rl.global_std:
                raise ValueError("rl.advantage='decoupled' normalises within each group; it "
                                 "cannot be combined with rl.global_std=True")
            self.reward_parts = get_components(config.rl.reward)
        elif self.rl.advantage != "reward":
            raise ValueError(f"rl.advantage={self.rl.advantage!r}: use 'reward' or 'decoupled'")
        self.train_sampler_cfg = sampler_config(config)
        image_shape = (self.mcfg.image_size,) * 2 + (self.mcfg.channels,)
        self.graphdef = graphdef
        self.trainer = (trainer if trainer is not None
                        else make_trainer(config, graphdef, base, mesh=self.mesh))
        self.sampler = Sampler(graphdef, image_shape, self.train_sampler_cfg, mesh=self.mesh)
        self.eval_sampler = Sampler(graphdef, image_shape, sampler_config(config, evaluation=True),
                                    mesh=self.mesh)
        wcfg = world.WorldConfig(image_size=self.mcfg.image_size)
        self.train_prompts = world.train_prompts(wcfg)
        val = world.val_prompts(wcfg)
        rng = np.random.default_rng(1234)
        n_eval = min(config.rl.eval_prompts, len(val))
        self.val_prompts = [val[i] for i in sorted(rng.choice(len(val), n_eval, replace=False))]
        self.engine = RolloutEngine(self.sampler, self.mcfg.text_len, config.rl.reward,
                                    chunk=max(config.rl.group_size, 32))
        rewards.get(eval_reward(config))            # an unknown name fails here, not at eval 0
        self.explorer = Explorer(self.engine)
        self.deploy = Deployment(config)
        self.transport = config.deployment.get("transport", "emulated")
        if self.transport not in ("emulated", "ray"):
            raise ValueError(f"deployment.transport={self.transport!r}: choose 'emulated' or "
                             "'ray'")
        # spotlight: stale-weight exploration on devices disjoint from the trainer's, in a
        # worker thread concurrent with the update (the trainer's devices if none are free).
        # With the emulated transport the spot nodes are a SpotFleet on those devices, which the
        # trace's preemptions and joins regroup (deployment.fleet; else one data-parallel mesh).
        self.explore_mesh = None
        self.spot_explorer = self.explorer
        self.fleet = None
        self._explore_pool = None
        dc = config.deployment
        want_fleet = (self.mode == "spotlight" and self.transport == "emulated"
                      and dc.get("fleet", True))
        layout = (fleet_devices(self.mesh, self.devices, dc.spot_nodes, dc.spot_devices_per_node)
                  if want_fleet else None)
        if layout is not None:
            devs, per_node = layout
            self.fleet = FleetExplorer(
                devs, dc.spot_nodes, per_node, graphdef, base, self.mcfg,
                self.train_sampler_cfg, sp_degree=dc.spot_sp, reward=config.rl.reward,
                chunk=self.engine.chunk, alive_nodes=self.deploy.alive_nodes)
            self.spot_explorer = self.fleet
            logging.info("spotlight: %d spot nodes x %d devices as a SpotFleet (groups %s); "
                         "precompiled in %.1fs", dc.spot_nodes, per_node,
                         [g.device_ids for _, _, g in self.fleet.groups], self.fleet.setup_s)
        elif want_fleet:
            logging.warning("spotlight: %d device(s) cannot hold %d spot nodes besides the "
                            "trainer's; exploring on one mesh without regroups",
                            len(self.devices), dc.spot_nodes)
        if self.mode == "spotlight" and self.fleet is None:
            self.explore_mesh = explore_mesh(self.mesh, self.devices,
                                             batch_multiple=self.engine.chunk)
            if self.explore_mesh is not None:
                sampler = Sampler(graphdef, image_shape, self.train_sampler_cfg,
                                  mesh=self.explore_mesh)
                self.spot_explorer = Explorer(RolloutEngine(
                    sampler, self.mcfg.text_len, config.rl.reward, chunk=self.engine.chunk))
            else:
                logging.warning("spotlight: the trainer uses every device; exploration shares "
                                "its devices")
        if self.mode == "spotlight":
            self._explore_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="explore")
        self.writer = MetricWriter(workdir, "rl")
        self.ckpt = RunCheckpointer(os.path.join(workdir, "checkpoints"),
                                    config.checkpoint.max_to_keep,
                                    this_process_only=jax.process_count() > 1)
        self.key = jax.random.key(config.seed)
        self.iteration = 0
        self.history: list[dict] = []
        self.next_seeds: list[list[int]] | None = None   # spotlight: S_{k+1}
        e = config.explore
        key_fn = world.grammar.kind_of if e.cluster_by_kind else None
        self.planner = Planner(PlannerConfig(group_size=config.rl.group_size,
                                             algorithm=e.algorithm,
                                             max_extra_per_prompt=e.max_extra_per_prompt,
                                             seed=config.seed), key_fn=key_fn)
        self._degraded_logged = False
        # The pull scheduler's pool needs a device per spot node plus one on-demand device (the
        # emulated devices carry group identities). A runtime with fewer (one GPU) runs the same
        # rollouts directly, with the same time accounting.
        need = 1 + self.deploy.cfg.spot_nodes
        self.spot_hosts: list = []             # transport 'ray': live spot host workers
        self._next_host = 0
        self._published = None                 # (version, object ref) of the last weights
        self.scheduler_on = bool(config.deployment.scheduler) and len(self.devices) >= need
        self._group_samplers = None
        self.group_steppers: list = []         # this phase's steppers (rollout_on_groups)
        if self.scheduler_on and rollout_on_groups(config.deployment.get("rollout_on_groups",
                                                                          "auto")):
            from spotlight_jax.sched import SamplerCache  # noqa: PLC0415
            self._group_samplers = SamplerCache(graphdef, image_shape, self.train_sampler_cfg)
        if (config.deployment.scheduler and not self.scheduler_on
                and self.mode in ("spot_rollout", "spotlight")):
            logging.warning("deployment.scheduler: %d device(s) cannot hold the scheduler's pool "
                            "(%d needed: one on-demand and one per spot node); rollouts run "
                            "directly with the same emulated-time accounting",
                            len(self.devices), need)

    # -- checkpointing -------------------------------------------------------------------------
    def _tree(self):
        parts = {p: getattr(self.trainer, p) for p in self.trainer.state_parts}
        return {p: {} if v is None else v for p, v in parts.items()}

    def save(self):
        self.ckpt.save(self.iteration, self._tree(), {
            "iteration": self.iteration, "history": self.history, "mode": self.mode,
            "objective": objective(self.config),
            "next_seeds": self.next_seeds, "planner": self.planner.state_dict(),
            "deployment": self.deploy.state_dict()})

    def maybe_restore(self) -> bool:
        meta = self.ckpt.latest_meta()
        if meta is not None:
            # checkpoints from before rl.objective existed are Flow-GRPO runs
            saved = meta.get("objective", "flow_grpo")
            if saved != objective(self.config):
                raise ValueError(
                    f"{self.ckpt.directory} holds a rl.objective={saved!r} run, this config "
                    f"trains rl.objective={objective(self.config)!r}; use another --workdir or "
                    f"--config.rl.objective={saved}")
        got = self.ckpt.restore(self._tree())
        if got is None:
            return False
        step, tree, meta = got
        for part in self.trainer.state_parts:
            if getattr(self.trainer, part) is not None:
                setattr(self.trainer, part, tree[part])
        self.iteration, self.history = int(meta["iteration"]), list(meta["history"])
        self.next_seeds = meta.get("next_seeds")
        if "planner" in meta:
            self.planner.load_state_dict(meta["planner"])
        if "deployment" in meta:
            self.deploy.load_state_dict(meta["deployment"])
            self.sync_fleet()
        logging.info("resumed from iteration %d in %s", step, self.ckpt.directory)
        return True

    # -- phases --------------------------------------------------------------------------------
    def prompts(self, k: int) -> list[str]:
        c = self.config
        return iteration_prompts(self.train_prompts, k, c.rl.prompts_per_iter, c.seed)

    def rollout(self, prompts, seeds_per_prompt) -> dict:
        flat = [p for p, ss in zip(prompts, seeds_per_prompt) for _ in range(len(ss))]
        seeds = np.concatenate([np.asarray(ss, np.uint32) for ss in seeds_per_prompt])
        batch = self.engine.run(self.trainer.sampling_state(), flat, seeds)
        return _with_group_ids(batch, seeds_per_prompt)

    def scheduled_rollout(self, k: int, prompts, seeds_per_prompt) -> tuple[dict, dict]:
        """The rollout phase through the pull scheduler: one request per (prompt, seed), pulled
        by the on-demand node and the live spot groups, committed every
        ``deployment.commit_every`` steps; the trace's notices and losses during the phase hit
        in-flight work (a notice commits and hands requests back, an abrupt loss rolls them back
        to the last commit) and another group resumes it. The queue is drained when the phase
        ends, so checkpoints (between iterations) never hold in-flight requests.

        Returns the batch (as ``rollout``) and the scheduler's numbers for the metrics.
        """
        from spotlight_jax import sched  # noqa: PLC0415
        from spotlight_jax.elastic import GroupConfig  # noqa: PLC0415

        d = self.deploy
        flat = [(p, int(s)) for p, ss in zip(prompts, seeds_per_prompt) for s in ss]
        T = self.train_sampler_cfg.num_steps
        horizon = 20 * d.rollout_s(len(flat), use_spot=True) + 3600.0
        setup = d.scheduler_setup(len(self.devices), horizon)
        image_shape = (self.mcfg.image_size,) * 2 + (self.mcfg.channels,)
        q = sched.RequestQueue(image_shape)
        rids = [f"k{k:05d}r{i:04d}" for i in range(len(flat))]
        q.submit([sched.Request(rid=r, prompt=p, seed=s, num_steps=T, policy_version=k)
                  for r, (p, s) in zip(rids, flat)])
        state = self.trainer.sampling_state()
        self.group_steppers = []
        with _quiet("spotlight_jax.elastic", "spotlight_jax.sched"):  # a pool per phase
            sim = sched.Simulation(
                q, self._group_stepper, setup["events"],
                sched.SimConfig(pool=setup["pool"],
                                groups=GroupConfig(heads=self.mcfg.num_heads,
                                                   sp_degree=d.cfg.spot_sp),
                                worker=sched.WorkerConfig(commit_every=d.cfg.commit_every,
                                                          microbatch=4),
                                cost=setup["cost"],
                                check_invariants=False),   # checked per event in the sched tests
                policy=lambda node: (state, k), devices=self.devices,
                down_at_start=setup["down_at_start"])
            rep = sim.run()
        if not q.all_done:
            raise RuntimeError(f"iteration {k}: the scheduler finished with requests left "
                               f"({q.summary()}); no group could make progress")
        rep.check_accounting()
        batch = self._batch_from_results(q.results(), rids, flat, seeds_per_prompt)
        info = {"sched_makespan_s": rep.makespan, "sched_commits": rep.commits,
                "sched_wasted_steps": rep.wasted_steps, "sched_lost_steps": rep.lost_steps,
                "sched_events": rep.num_events,
                "sched_idle_tail": (rep.idle_tail_device_s / rep.alive_device_s
                                    if rep.alive_device_s else 0.0),
                "sched_lost_work_s": rep.wasted_steps * setup["sample_step_s"],
                "sched_spot_busy_device_s": rep.busy_by_role.get("spot", 0.0)}
        if self._group_samplers is not None:
            # devices that really computed segments this phase (one group per device set)
            info["sched_group_devices"] = len({d for st in self.group_steppers if st.calls
                                               for d in st.group.device_ids})
        return batch, info

    def _group_stepper(self, group):
        """The scheduler's stepper for an SP group. With ``deployment.rollout_on_groups`` the
        group runs its requests on its own devices (weights placed there when it forms,
        attention laid out by its SP strategy, one segment program per group layout, kept
        across iterations); otherwise every group computes on the trainer's device with the
        run's sampler (one program), the groups differing only in identity and emulated speed.
        """
        from spotlight_jax import sched  # noqa: PLC0415
        if self._group_samplers is None:
            return sched.SamplerStepper(self.sampler, self.mcfg.text_len)
        stepper = sched.SamplerStepper(self._group_samplers.get(group), self.mcfg.text_len,
                                       group)
        self.group_steppers.append(stepper)
        return stepper

    def _charge_shared_rollout(self, n: int, use_spot: bool) -> None:
        """Emulated time of a rollout phase not run through the scheduler simulation: the
        cost model's capacity-weighted split, every live group busy until the phase ends."""
        d = self.deploy
        dur = d.rollout_s(n, use_spot)
        with d.clock.concurrent() as phase:
            phase.run("rollout", d.od, dur)
            if use_spot:
                phase.run("rollout", d.spot_group(), dur)

    def ray_rollout(self, k: int, prompts, seeds_per_prompt) -> tuple[dict, dict]:
        """The rollout phase on real spot hosts (``deployment.transport='ray'``): one request
        per (prompt, seed) in a queue owned here, pulled by Ray spot host actors (one per spot
        node, started on first use and whenever fewer are alive than the deployment wants),
        each served by a thread; this iteration's weights are published once and pulled by
        every host. A host that dies hands its requests back (they resume from their last
        commit on another host); whatever is left when no host remains runs on the trainer's
        devices, which never leave."""
        from spotlight_jax import sched  # noqa: PLC0415
        from spotlight_jax.cluster import spot  # noqa: PLC0415

        d = self.deploy
        t0 = time.perf_counter()
        state = self.trainer.sampling_state()
        if self._published is None or self._published[0] != k:
            self._published = (k, spot.publish(state))
        started = lost_idle = 0
        for _ in range(3):   # top up to the wanted hosts; drop any that died since last phase
            while len(self.spot_hosts) < d.cfg.spot_nodes:
                i, self._next_host = self._next_host, self._next_host + 1
                self.spot_hosts.append(spot.start_host(
                    f"spot{i}", self.config, cpu_devices=d.cfg.spot_devices_per_node,
                    worker={"commit_every": d.cfg.commit_every, "steps_per_call": 1,
                            "microbatch": 4},
                    resources={res: 1} if (res := self.config.deployment.get(
                        "ray_spot_resource", "")) else None))
                started += 1
            alive = []
            for w in self.spot_hosts:
                try:
                    if w.policy_version != k:
                        w.set_policy(self._published[1], k)
                    alive.append(w)
                except spot.WorkerLost:
                    lost_idle += 1
            self.spot_hosts = alive
            if len(alive) == d.cfg.spot_nodes:
                break
        flat = [(p, int(s)) for p, ss in zip(prompts, seeds_per_prompt) for s in ss]
        T = self.train_sampler_cfg.num_steps
        image_shape = (self.mcfg.image_size,) * 2 + (self.mcfg.channels,)
        queue = spot.LockedQueue(sched.RequestQueue(image_shape,
                                                    sched.QueueConfig(lease_s=3600.0)))
        rids = [f"k{k:05d}r{i:04d}" for i in range(len(flat))]
        queue.submit([sched.Request(rid=r, prompt=p, seed=s, num_steps=T, policy_version=k)
                      for r, (p, s) in zip(rids, flat)])
        steps_before = {w.group_id: w.steps for w in self.spot_hosts}
        threads, stats = spot.serve_in_threads(self.spot_hosts, queue)
        for t in threads:
            t.join()
        left = {g: s["left"] for g, s in stats.items()}
        computed = sum(w.steps - steps_before[w.group_id] for w in self.spot_hosts)
        self.spot_hosts = [w for w in self.spot_hosts if left.get(w.group_id) == "done"]
        fallback = 0
        if not queue.all_done:   # every host left: the trainer's devices finish the phase
            local = sched.InProcessWorker(
                "od0", sched.SamplerStepper(self.sampler, self.mcfg.text_len),
                config=sched.WorkerConfig(commit_every=d.cfg.commit_every, microbatch=4),
                params=state, version=k)
            fallback = local.run(queue)["calls"]
        batch = self._batch_from_results(queue.results(), rids, flat, seeds_per_prompt)
        info = {"ray_hosts_started": started, "ray_hosts_lost": lost_idle + sum(
                    v == "lost" for v in left.values()),
                "ray_hosts_noticed": sum(v == "notice" for v in left.values()),
                "ray_request_steps": computed, "ray_fallback_calls": fallback,
                "ray_rollout_wall_s": time.perf_counter() - t0}
        return batch, info

    def _batch_from_results(self, results, rids, flat, seeds_per_prompt) -> dict:
        """A training batch (as ``rollout``) from a drained queue's finished requests."""
        trajs = [results[r].trajectory() for r in rids]
        batch = {key: np.stack([t[key] for t in trajs]) for key in ("latents", "log_probs",
                                                                     "images")}
        flat_prompts = [p for p, _ in flat]
        batch["tokens"], batch["mask"] = world.tokenize(flat_prompts, self.mcfg.text_len)
        batch["rewards"] = np.asarray(self.engine.reward_fn(batch["images"], flat_prompts),
                                      np.float32)
        return _with_group_ids(batch, seeds_per_prompt)

    def explore(self, state, prompts, budget_s: float, per_candidate_s: float, keep=False,
                explorer=None):
        """Plans candidates per prompt within ``budget_s`` device-seconds, scores them with
        ``state`` (on ``explorer``'s devices; default the trainer's), selects each prompt's
        max-variance G-subset, and updates the planner."""
        k_next = self.iteration
        G = self.config.rl.group_size
        plan = self.planner.plan(prompts, budget_s, per_candidate_s)
        cands = [candidate_seeds(self.config.seed, k_next, i, plan[p],
                                 self.train_sampler_cfg.shared_init_bits)
                 for i, p in enumerate(prompts)]
        out = (explorer or self.explorer).score(state, prompts, cands, keep_trajectories=keep)
        rewards, batch = out if keep else (out, None)
        chosen, gains = [], []
        for p, r in zip(prompts, rewards):
            self.planner.update(p, r)
            idx = max_variance_subset(r, G)
            chosen.append(idx)
            gains.append(float(np.var(r[idx]) - np.var(r[:G])))
        n = int(sum(len(c) for c in cands))
        info = {"explore_candidates": n, "explore_extra": n - G * len(prompts),
                "explore_var_gain": float(np.mean(gains))}
        return cands, chosen, batch, info

    def pull_weights(self, state):
        """θ_k onto the exploration mesh (replicated): device-to-device copies, the spot
        groups' weight pull. Returns ``(state, seconds, bytes)``."""
        if self.fleet is not None:
            return state, *self.fleet.pull(state)
        if self.explore_mesh is None:
            return state, 0.0, 0
        t0 = time.perf_counter()
        spec = NamedSharding(self.explore_mesh, PartitionSpec())
        placed = jax.block_until_ready(jax.tree.map(lambda x: jax.device_put(x, spec), state))
        nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(state))
        return placed, time.perf_counter() - t0, nbytes * self.explore_mesh.size

    def _explore_concurrently(self, state, prompts, budget_s, per_candidate_s):
        """Submits stale-weight exploration to the worker thread; returns a future of
        ``(explore(...) result, (start, end) wall times)``."""
        def work():
            t0 = time.perf_counter()
            out = self.explore(state, prompts, budget_s, per_candidate_s,
                               explorer=self.spot_explorer)
            return out, (t0, time.perf_counter())
        return self._explore_pool.submit(work)

    def sync_fleet(self, row: dict | None = None) -> None:
        """Applies the deployment's alive spot nodes to the SpotFleet (real regroups; see
        :mod:`spotlight_jax.spot_fleet`) and adds what they measured to ``row``."""
        if self.fleet is None:
            return
        got = self.fleet.sync(self.deploy.alive_nodes, self.trainer.sampling_state)
        if row is not None:
            for key, v in got.items():
                row[key] = max(row.get(key, 0), v) if key.endswith("max_s") else (
                    row.get(key, 0) + v)

    def close(self):
        if self.fleet is not None:
            self.fleet.close()
        if self._explore_pool is not None:
            self._explore_pool.shutdown(wait=True)
            self._explore_pool = None
        if self.spot_hosts:
            import ray  # noqa: PLC0415
            for w in self.spot_hosts:
                ray.kill(w.actor)
            self.spot_hosts = []

    def train_on(self, batch, k: int, prompts) -> dict:
        if self.reward_parts is not None:
            flat = [prompts[i] for i in batch["prompt_ids"]]
            adv = decoupled_advantages(self.reward_parts(batch["images"], flat),
                                       batch["prompt_ids"], clip=self.rl.adv_clip)
        else:
            adv = advantages(batch["rewards"], batch["prompt_ids"],
                             global_std=self.rl.global_std, clip=self.rl.adv_clip)
        train = {key: batch[key] for key in self.trainer.batch_keys}
        train["advantages"] = adv
        return self.trainer.update(train, self.key, k)

    def evaluate(self, k: int) -> dict:
        c = self.config
        res, images, _ = evaluate(self.eval_sampler, self.trainer.eval_state(), self.val_prompts,
                                  num_seeds=c.rl.eval_seeds, text_len=self.mcfg.text_len,
                                  reward=eval_reward(c))
        os.makedirs(os.path.join(self.workdir, "samples"), exist_ok=True)
        # one image per validation prompt (first seed), same prompts every time
        save_grid(os.path.join(self.workdir, "samples", f"val_{k:05d}.png"),
                  images[::c.rl.eval_seeds][:32], cols=8, captions=self.val_prompts[:32])
        return res

    # -- one iteration -------------------------------------------------------------------------
    def step(self, k: int) -> dict:
        c, d, clock = self.config, self.deploy, self.deploy.clock
        G, P = c.rl.group_size, c.rl.prompts_per_iter
        prompts = self.prompts(k)
        n = P * G
        spot_ok = d.spot_devices > 0
        if self.mode in ("spot_rollout", "spotlight") and not spot_ok and not self._degraded_logged:
            logging.warning("no spot device is alive: running as flow_grpo until one joins")
            self._degraded_logged = True
        if spot_ok:
            self._degraded_logged = False
        row: dict = {"iteration": k + 1}
        if self.fleet is not None:
            row.update(dict.fromkeys(FLEET_KEYS, 0))
        scheduled = False
        t0 = time.time()
        # ---- rollout phase -------------------------------------------------------------------
        if self.mode == "explore_sync":
            budget = c.explore.sync_extra_per_prompt * P * d.od_seconds_per_candidate()
            cands, chosen, ebatch, info = self.explore(
                self.trainer.sampling_state(), prompts, budget, d.od_seconds_per_candidate(),
                keep=True)
            offsets = np.cumsum([0] + [len(cc) for cc in cands])[:-1]
            sel = np.concatenate([o + i for o, i in zip(offsets, chosen)])
            batch = {kk: v[sel] for kk, v in ebatch.items()}
            batch["prompt_ids"] = np.repeat(np.arange(P), G)
            n_roll = info["explore_candidates"]
            clock.run("explore_sync", d.od, d.rollout_s(n_roll, use_spot=False))
            row.update(info)
        else:
            if self.mode == "spotlight" and self.next_seeds is not None:
                seeds = [np.asarray(ss, np.uint32) for ss in self.next_seeds]
            else:
                seeds = group_seeds(c.seed, k, P, G, self.train_sampler_cfg.shared_init_bits)
            use_spot = self.mode in ("spot_rollout", "spotlight") and spot_ok
            scheduled = use_spot and self.scheduler_on and self.transport != "ray"
            if use_spot and self.transport == "ray":
                batch, ray_info = self.ray_rollout(k, prompts, seeds)
                row.update(ray_info)
                self._charge_shared_rollout(n, use_spot)
            elif scheduled:
                batch, sched_info = self.scheduled_rollout(k, prompts, seeds)
                row.update(sched_info)
                with clock.concurrent() as phase:
                    phase.run("rollout", d.od, sched_info["sched_makespan_s"])
                    spot = d.spot_group()
                    phase.charge(spot, sched_info["sched_spot_busy_device_s"] / spot.num_devices,
                                 "rollout")
            else:
                batch = self.rollout(prompts, seeds)
                self._charge_shared_rollout(n, use_spot)
        clock.run("reward", d.od, d.reward_s(n))
        t1 = time.time()
        if scheduled:
            # the scheduler measured the work preemptions cost (abrupt losses since the last
            # commit); the trace events it saw are applied to the deployment here
            d.advance()
            d.stats["lost_work_s"] += row["sched_lost_work_s"]
        else:
            d.advance(busy_spot_phase_s=d.rollout_s(n, True) if self.mode in
                      ("spot_rollout", "spotlight") else 0.0)
        self.sync_fleet(row)
        # ---- train (+ concurrent exploration in spotlight mode) ------------------------------
        stale_state = self.trainer.sampling_state()        # θ_k, before the update
        train_s = d.train_s(n)
        explore_info = {}
        with clock.concurrent() as phase:
            phase.run("train", d.od, train_s)
            future = None
            if self.mode == "spotlight" and d.spot_devices > 0:
                self.iteration = k + 1                     # candidates are for iteration k+1
                per = d.spot_seconds_per_candidate()
                budget = extras_budget_s(c.explore.budget_frac * train_s, d.spot_devices,
                                         c.rl.prompts_per_iter * c.rl.group_size, per)
                pulled, pull_s, pull_bytes = self.pull_weights(stale_state)
                future = self._explore_concurrently(pulled, self.prompts(k + 1), budget, per)
            elif self.mode == "spotlight":
                self.next_seeds = None
            t_train = time.perf_counter()
            m = self.train_on(batch, k, prompts)
            t_train = (t_train, time.perf_counter())
            if future is not None:
                (cands, chosen, _, explore_info), t_explore = future.result()
                spent = explore_info["explore_candidates"] * per / max(d.spot_devices, 1)
                phase.run("explore", d.spot_group(), spent)
                self.next_seeds = [[int(s) for s in cc[i]] for cc, i in zip(cands, chosen)]
                overlap = min(t_train[1], t_explore[1]) - max(t_train[0], t_explore[0])
                explore_info.update(
                    explore_wall_s=t_explore[1] - t_explore[0],
                    train_wall_s=t_train[1] - t_train[0], overlap_wall_s=max(overlap, 0.0),
                    pull_s=pull_s, pull_bytes=pull_bytes)
        t2 = time.time()
        if self.mode in ("spot_rollout", "spotlight") and d.spot_devices > 0:
            clock.run("broadcast", d.spot_group(), d.cost.broadcast())
        d.advance()
        self.sync_fleet(row)
        row.update(reward_mean=float(batch["rewards"].mean()),
                   reward_std=float(batch["rewards"].std()),
                   **group_stats(batch["rewards"], batch["prompt_ids"]), **m, **explore_info,
                   time_rollout=t1 - t0, time_train=t2 - t1,
                   vtime_s=clock.now(), dollars=d.dollars(), spot_alive=d.spot_devices,
                   spot_util=clock.utilisation("spot"), **dict(d.stats))
        self.iteration = k + 1
        return row

    def write_phases(self):
        """``phases.json``: the emulated clock's per-phase breakdown and the cost model's
        assumptions (read by the comparison report)."""
        info = {"phases": self.deploy.clock.breakdown(),
                "assumptions": [dataclasses.asdict(a) for a in self.deploy.assumptions()]}
        with open(os.path.join(self.workdir, "phases.json"), "w") as f:
            json.dump(info, f, indent=1, default=str)

    def plot(self):
        evals = [h for h in self.history if "val_reward" in h]
        if not evals:
            return
        x = [h["iteration"] for h in evals]
        series = {"held-out (ODE)": (x, [h["val_reward"] for h in evals])}
        trains = [h for h in self.history if "reward_mean" in h]
        if trains:
            series["train rollouts (SDE)"] = ([h["iteration"] for h in trains],
                                              [h["reward_mean"] for h in trains])
        plot_curves(os.path.join(self.workdir, "reward_curve.png"), series,
                    title=f"{self.mode}: {self.config.rl.reward} (held-out: "
                          f"{eval_reward(self.config)})")


def extras_budget_s(window_s: float, devices: int, base_candidates: int,
                    per_candidate_s: float) -> float:
    """Device-seconds the planner may spend on extra candidates so that the whole exploration
    (the ``base_candidates`` = prompts x G it always scores, plus the extras) fits in
    ``window_s`` seconds on ``devices`` devices: the window's device-seconds minus the base
    candidates' (0 when they alone fill it)."""
    return max(window_s * devices - base_candidates * per_candidate_s, 0.0)


def _with_group_ids(batch: dict, seeds_per_prompt) -> dict:
    """Adds ``prompt_ids`` (the GRPO group of each trajectory) and the flat ``seeds``."""
    batch["prompt_ids"] = np.repeat(np.arange(len(seeds_per_prompt)),
                                    [len(ss) for ss in seeds_per_prompt])
    batch["seeds"] = np.concatenate([np.asarray(ss, np.uint32) for ss in seeds_per_prompt])
    return batch


@contextlib.contextmanager
def _quiet(*names):
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


def shard_state(state, mesh):
    """Places an NNX state on ``mesh`` following the logical-axis rule table."""
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax.parallel.sharding import param_specs  # noqa: PLC0415

    specs = param_specs(state, mesh)
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    leaves, treedef = jax.tree.flatten(nnx.to_pure_dict(state))
    placed = [jax.device_put(a, NamedSharding(mesh, sp)) for a, sp in zip(leaves, flat_specs)]
    out = jax.tree.map(lambda x: x, state)
    nnx.replace_by_pure_dict(out, jax.tree.unflatten(treedef, placed))
    return out


def run(config, workdir: str, graphdef, base, *, base_source: str = "", progress: bool = True,
        devices=None, trainer=None):
    """Runs ``config.rl.iterations`` post-training iterations; returns the history list.

    ``devices``: the trainer's devices (default: all of this process's); the mesh comes from
    ``config.mesh``. ``trainer``: a multi-process trainer job's ``TrainerJob`` (process 0).
    """
    r = Run(config, workdir, graphdef, base, devices, trainer=trainer)
    restored = r.maybe_restore()
    # rows written after the checkpoint (a killed run) are redone: keep each iteration once
    dropped = r.writer.drop_after(r.iteration if restored else -1)
    if dropped:
        logging.info("rl.jsonl: dropped %d row(s) past iteration %d, which this run redoes",
                     dropped, r.iteration)
    c = config
    if r.iteration == 0 and not r.history:
        res = r.evaluate(0)
        r.history.append({"iteration": 0, "vtime_s": 0.0, "dollars": 0.0,
                          **{f"val_{k}": v for k, v in res.items()}})
        r.writer.write(0, **{f"val_{k}": v for k, v in res.items()})
    budget_s = 60.0 * c.rl.get("max_minutes", 0.0)
    spent = sum(h.get("time_rollout", 0.0) + h.get("time_train", 0.0) for h in r.history)
    desc = f"{c.mode} ({objective(c)})"
    if budget_s:
        # the run ends on its time budget, long before rl.iterations: count RL minutes, so the
        # bar's ETA is the run's (evaluations included, as they take their share of the wall)
        bar = tqdm(total=round(budget_s / 60, 2), initial=round(min(spent, budget_s) / 60, 2),
                   unit="RL min", desc=desc, disable=not progress, dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} "
                              "[{elapsed}<{remaining}{postfix}]")
    else:
        bar = tqdm(initial=r.iteration, total=c.rl.iterations, desc=desc, unit="it",
                   disable=not progress, dynamic_ncols=True)
    for k in range(r.iteration, c.rl.iterations):
        row = r.step(k)
        spent += row["time_rollout"] + row["time_train"]
        if budget_s:    # set, not summed: rounded increments would overshoot the total
            bar.n = round(min(spent, budget_s) / 60, 2)
            bar.refresh()
        else:
            bar.update(1)
        out_of_time = bool(budget_s) and spent >= budget_s
        row["rl_time_s"] = spent
        if c.rl.eval_every and (r.iteration % c.rl.eval_every == 0 or out_of_time
                                or r.iteration == c.rl.iterations):
            res = r.evaluate(r.iteration)
            row.update({f"val_{kk}": v for kk, v in res.items()})
        r.history.append(row)
        r.writer.write(r.iteration, **{k2: v for k2, v in row.items() if k2 != "iteration"})
        post = {"reward": f"{row['reward_mean']:.3f}", "kl": f"{row.get('kl', 0.0):.1e}"}
        if c.mode in ("spot_rollout", "spotlight"):
            post.update(spot=row["spot_alive"], preempt=row["preemptions"])
        if budget_s:
            post["it"] = r.iteration
        bar.set_postfix(post)
        if (r.iteration % c.checkpoint.every == 0 or r.iteration == c.rl.iterations
                or out_of_time):
            r.save()
            r.plot()
        if out_of_time:
            logging.info("rl.max_minutes=%s reached after %d iterations", c.rl.max_minutes,
                         r.iteration)
            break
    bar.close()
    r.close()
    r.ckpt.close()
    r.writer.close()
    r.write_phases()
    return r.history
