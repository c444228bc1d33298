"""The modes (contract, ``config.mode``): one small class each, ``step(state, k) -> row``.

One iteration k of every mode is: a rollout phase (prompts P_k, G seeds each) -> rewards -> the
objective's update, each phase charged to the deployment's emulated clock. The modes differ in
where rollouts run and which seeds they use; the objective (``rl.objective``: flow_grpo / nft)
is an orthogonal axis that no mode branches on (the trainer's ``sampling_state`` /
``batch_keys`` / ``update`` hide it).

* ``baseline``: G random seeds per prompt (pure functions of (run seed, k)); rollouts on the
  on-demand devices.
* ``explore_sync``: G + extra candidate seeds per prompt are rolled out with the current policy
  on the critical path; each prompt's max-variance G-subset is trained on directly (those
  rollouts *are* the training rollouts, never run twice).
* ``spot_rollout``: as ``baseline``, with spot devices helping with rollouts; they idle while
  the on-demand devices train.
* ``spotlight``: rollouts of P_k from the seeds S_k chosen last iteration, on on-demand + spot
  devices; then *concurrently* the update θ_k -> θ_{k+1} on the on-demand devices and
  exploration of candidate seeds for P_{k+1} with the stale θ_k on the spot devices, as many as
  the bandit planner fits into the training time; S_{k+1} = max-variance G-subsets. Training
  stays on-policy: the next rollout re-runs the chosen seeds with θ_{k+1}. With no spot device
  alive it degrades to ``baseline`` and says so.
* ``spotlight_pipelined``: as ``spotlight``, but the explored candidates' own rollouts are the
  next iteration's batch, so rollouts leave the critical path (the batch is one update staler;
  the loss uses the policy that sampled it).
"""
from __future__ import annotations

import time

import jax
import numpy as np
from absl import logging

from spotlight_jax import registry
from spotlight_jax.diffusion import batches
from spotlight_jax.emulation import utilization
from spotlight_jax.rl import group_stats
from spotlight_jax.runner import update
from spotlight_jax.runner.backends.emulated_fleet import STAT_KEYS as FLEET_KEYS
from spotlight_jax.runner.backends.rollouts import ReadyBatch, group_seeds
from spotlight_jax.runner.exploration import (
    SpotExploration,
    explore,
    extras_budget_s,
)

WALL_CLOCK_KEYS = frozenset({
    "time", "time_rollout", "time_train", "rl_time_s", "explore_wall_s", "train_wall_s",
    "overlap_wall_s", "explore_overlap", "pull_s", "fleet_regroup_s", "fleet_regroup_max_s",
    "train_images_per_s", "rollout_images_per_s", "rollout_tokens_per_s", "train_tflops",
    "train_mfu", "rollout_tflops"})
"""The fields of a history row measured on this process's wall clock: they differ between two
runs of the same config (and between a resumed run and an uninterrupted one); every other field
is a function of the config, the seed and the trace."""


def throughput(s, n: int, rollout_s: float, train_s: float, rolled_out: bool) -> dict:
    """This process's wall-clock throughput of the iteration's phases: images per second of the
    rollout phase (with their rewards) and of the update, the transformer tokens per second
    the rollouts pushed (each image: ``num_steps`` forwards of its image and prompt tokens,
    twice under CFG), and the model TFLOP/s of both (``utilization``) with the update's MFU
    on the trainer's devices. A ready batch (nothing rolled out) reports no rollout
    throughput."""
    cfg = s.train_sampler_cfg
    out = {"train_images_per_s": n / train_s if train_s > 0 else 0.0}
    if train_s > 0:
        flops = utilization.update_flops(s.trainer.work, s.mcfg, n)
        out.update(train_tflops=flops / train_s / 1e12,
                   train_mfu=utilization.mfu(flops, train_s, s.peak_flops, s.update_devices))
    if rolled_out and rollout_s > 0:
        tokens = (s.mcfg.num_patches + s.mcfg.text_len) * cfg.num_steps
        out.update(rollout_images_per_s=n / rollout_s,
                   rollout_tokens_per_s=n * tokens * s.mcfg.passes(cfg.guidance) / rollout_s,
                   rollout_tflops=utilization.rollout_flops(s.mcfg, cfg, n) / rollout_s / 1e12)
    return out


class Mode:
    """One iteration: rollout phase, reward, settle the trace, train phase, broadcast."""

    name = ""
    uses_spot = False          # spot devices help with this mode's rollouts (its registry spec)

    def __init__(self, state, base):
        self._degraded_logged = False
        self._iteration_start = 0.0     # the clock when the current iteration began

    # -- the phases a mode may change -----------------------------------------------------------
    def seeds(self, s, k: int, prompts) -> list:
        st = s.settings
        return group_seeds(st.seed, k, len(prompts), st.group_size,
                           s.train_sampler_cfg.shared_init_bits)

    def rollout_phase(self, s, k: int, prompts) -> tuple[dict, dict, object]:
        """The training batch, its row entries, and the backend that settles the phase."""
        backend = s.spot_rollouts if self.uses_spot and s.deploy.spot_devices > 0 else s.direct
        batch, info = backend.rollout(k, prompts, self.seeds(s, k, prompts))
        backend.charge(len(batch["rewards"]), info)
        return batch, info, backend

    def reward_phase(self, s, n: int, backend, info: dict) -> None:
        """Decodes and scores the batch's ``n`` images on the devices that hold them, at the
        one price every phase pays (``Deployment.reward_s``); nothing when the backend's batch
        arrived rewarded (a ready batch: its spot groups' exploration charge holds it)."""
        if backend.rewarded:
            return
        d = s.deploy
        seconds = d.reward_s(n, backend.reward_devices())
        with d.clock.concurrent() as phase:
            phase.run("reward", d.od, seconds)
            if backend.use_spot and d.spot_devices > 0:
                phase.run("reward", d.spot_group(), seconds)

    def train_phase(self, s, k: int, batch, prompts, train_s: float) -> tuple[dict, dict]:
        """The update (and whatever runs concurrently with it); returns (metrics, row info)."""
        with s.deploy.clock.concurrent() as phase:
            phase.run("train", s.deploy.od, train_s)
            return update.train_on(s, batch, k, prompts), {}

    def new_row(self, s, k: int) -> dict:
        return {"iteration": k + 1}

    def sync(self, s, row: dict | None = None) -> None:
        """Brings mode-owned device state in line with the deployment (after events)."""

    def close(self) -> None:
        pass

    def extra_state(self) -> dict | None:
        """Host arrays this mode adds to a checkpoint (None: nothing)."""
        return None

    def load_extra_state(self, s, arrays: dict | None) -> None:
        """Restores what :meth:`extra_state` saved (None: the checkpoint holds nothing)."""

    # -- the iteration --------------------------------------------------------------------------
    def step(self, s, k: int) -> dict:
        d, clock = s.deploy, s.deploy.clock
        prompts = s.prompts(k)
        n = s.settings.prompts_per_iter * s.settings.group_size
        self._log_degraded(d.spot_devices > 0)
        row = self.new_row(s, k)
        self._iteration_start = clock.now()
        t0 = time.time()
        batch, info, backend = self.rollout_phase(s, k, prompts)
        row.update(info)
        backend.settle(row)
        self.sync(s, row)
        self.reward_phase(s, n, backend, info)
        t1 = time.time()
        m, train_info = self.train_phase(s, k, batch, prompts, d.train_s(n))
        t2 = time.time()
        if self.uses_spot and d.spot_devices > 0:
            clock.run("broadcast", d.spot_group(), d.cost.broadcast())
        d.advance()
        self.sync(s, row)
        row.update(train_samples=int(batch["rewards"].shape[0]),    # the batch trained on
                   reward_mean=float(batch["rewards"].mean()),
                   reward_std=float(batch["rewards"].std()),
                   **group_stats(batch["rewards"], batch["prompt_ids"]), **m, **train_info,
                   **{f"reward_{name}": float(np.mean(v))          # a reward mix's terms
                      for name, v in update.reward_terms(s, batch, prompts).items()},
                   time_rollout=t1 - t0, time_train=t2 - t1,
                   **throughput(s, n, t1 - t0, t2 - t1, rolled_out=not row.get("pipelined")),
                   vtime_s=clock.now(), dollars=d.dollars(), spot_alive=d.spot_devices,
                   spot_util=clock.utilisation("spot"), **dict(d.stats))
        s.iteration = k + 1
        return row

    def _log_degraded(self, spot_ok: bool) -> None:
        if self.uses_spot and not spot_ok and not self._degraded_logged:
            logging.warning("no spot device is alive: running as baseline until one joins")
            self._degraded_logged = True
        if spot_ok:
            self._degraded_logged = False


class BaselineMode(Mode):
    name = "baseline"


class SpotRolloutMode(Mode):
    name = "spot_rollout"


class ExploreSyncMode(Mode):
    name = "explore_sync"

    def rollout_phase(self, s, k, prompts):
        d, st = s.deploy, s.settings
        G, P = st.group_size, len(prompts)
        per = d.od_seconds_per_candidate()
        budget = st.explore.sync_extra_per_prompt * P * per
        cands, chosen, ebatch, info = explore(s, k, prompts, budget, per, explorer=s.explorer,
                                              params=s.trainer.sampling_state(), keep=True)
        batch = dict(ebatch)                         # the chosen candidates' rollouts
        batch["prompt_ids"] = np.repeat(np.arange(P), G)
        d.clock.run("explore_sync", d.od, d.rollout_s(info["explore_candidates"], use_spot=False))
        return batch, info, s.direct

    def reward_phase(self, s, n, backend, info):
        """Every candidate was scored to choose the batch: their rewards, not just the batch's."""
        super().reward_phase(s, info["explore_candidates"], backend, info)


class SpotlightMode(Mode):
    name = "spotlight"

    def __init__(self, state, base):
        super().__init__(state, base)
        self.spot = SpotExploration(state, base)

    @property
    def fleet(self):
        return self.spot.fleet

    def seeds(self, s, k, prompts):
        if s.next_seeds is not None:
            return [np.asarray(ss, np.uint32) for ss in s.next_seeds]
        return super().seeds(s, k, prompts)

    keep_candidates = False     # the explored rollouts themselves are wanted (pipelined)
    batch_generator = None      # the trainer's generator of the batch being trained on

    def train_phase(self, s, k, batch, prompts, train_s):
        d, st = s.deploy, s.settings
        stale = s.trainer.sampling_state()                # θ_k, before the update
        generator = s.trainer.generator() if self.keep_candidates else None
        with d.clock.concurrent() as phase:
            if d.spot_devices == 0:
                phase.run("train", d.od, train_s)
                self.explored(s, k, None)
                return update.train_on(s, batch, k, prompts, generator=self.batch_generator), {}
            per = d.spot_seconds_per_candidate()
            base_candidates = st.prompts_per_iter * st.group_size
            shared, shard_s, window = None, 0.0, train_s
            if s.shared_update.enabled:     # the spot groups compute some of the update
                n = len(batch["rewards"])
                steps = s.trainer.work.shard_units(n)[0]
                shared = s.shared_update.plan(
                    n, k * steps, spot_work_s=base_candidates * per,
                    other_s=d.clock.now() - self._iteration_start + d.cost.broadcast(),
                    progress=self.exploration_progress(s, k, per, base_candidates))
                shard_s, window = shared.spot_device_s, shared.seconds
            phase.run("train", d.od, window)
            # the spot time of the update's window that its shards leave to exploration
            budget = max(extras_budget_s(st.explore.budget_frac * window, d.spot_devices,
                                         base_candidates, per) - shard_s, 0.0)
            plan_budget, plan_per, capacity = self.spot.plan_budget(budget, per,
                                                                    base_candidates)
            pulled, pull_s, pull_bytes = self.spot.pull(stale, k)
            future = self.spot.submit(pulled, k + 1, s.prompts(k + 1), plan_budget, plan_per,
                                      keep=self.keep_candidates, capacity=capacity)
            t_train = time.perf_counter()
            m = update.train_on(s, batch, k, prompts, generator=self.batch_generator, shared=shared)
            t_train = (t_train, time.perf_counter())
            self.spot.update_done(t_train[1] - t_train[0])
            (cands, chosen, cbatch, info), t_explore = future.result()
            info.update(self.spot.info())
            handover = self.charge_exploration(s, phase, info["explore_candidates"] * per
                                               + shard_s, info)
        if handover > 0:        # no spot node was left: the trainer finishes the candidates
            d.clock.run("explore", d.od, handover / d.od.num_devices)
        if shared is not None:
            info.update(shared.info())
            if s.ray_shards is not None:    # where the shards really ran (the Ray hosts)
                info.update(s.ray_shards.take_counts())
        self.explored(s, k, (cands, chosen, cbatch, generator, info))
        overlap = max(min(t_train[1], t_explore[1]) - max(t_train[0], t_explore[0]), 0.0)
        explore_s = t_explore[1] - t_explore[0]
        info.update(explore_wall_s=explore_s, train_wall_s=t_train[1] - t_train[0],
                    overlap_wall_s=overlap, pull_s=pull_s, pull_bytes=pull_bytes,
                    explore_budget_s=plan_budget,
                    # the share of the exploration's wall time inside the update's window
                    explore_overlap=overlap / explore_s if explore_s > 0 else 1.0)
        info.setdefault("explore_hosts", len(self.spot.fleet.groups) if self.fleet else 1)
        info.setdefault("explore_lost", 0)
        info.setdefault("explore_dropped", 0)
        return m, info

    def charge_exploration(self, s, phase, work_device_s: float, info: dict) -> float:
        """Charges the exploration's (and the update's shards') ``work_device_s`` on the spot
        nodes into ``phase``: on the emulated spot nodes with the trace's events inside the
        update's window (``Deployment.charge_spot_work``: a loss costs the work it interrupts,
        a join its regroup); the Ray hosts' own deadline bounds theirs. Returns the
        device-seconds left for the on-demand devices."""
        d = s.deploy
        if self.spot.ray is not None:
            phase.run("explore", d.spot_group(), work_device_s / max(d.spot_devices, 1))
            return 0.0
        spot = d.charge_spot_work(phase, "explore", work_device_s)
        info.update(explore_lost_device_s=spot.lost_device_s, explore_stall_s=spot.stalled_s,
                    explore_handover_device_s=spot.handover_device_s)
        return spot.handover_device_s

    def exploration_progress(self, s, k: int, per: float, base_candidates: int):
        """``progress(plan)`` for the ``payoff`` split: the expected learning progress of
        iteration k+1 relative to one trained on its base seeds, ``(1 + g / v) ** exponent``,
        where ``g`` is the planner's expected gain in selected-group variance per prompt for the
        exploration budget the plan's window leaves (as :meth:`train_phase` computes it) and
        ``v`` the base candidates' variance. None while the planner has observed no pool."""
        d, st = s.deploy, s.settings
        prompts = s.prompts(k + 1)
        v = s.planner.base_variance(prompts)
        if v is None or v <= 0:
            return None
        exponent = d.cfg.update_payoff_exponent
        gain = s.planner.gain_of_budget(prompts, per)      # the posteriors once, every share

        def progress(plan):
            budget = max(extras_budget_s(st.explore.budget_frac * plan.seconds, d.spot_devices,
                                         base_candidates, per) - plan.spot_device_s, 0.0)
            g = gain(budget) / len(prompts)
            return (1.0 + g / v) ** exponent

        return progress

    def explored(self, s, k: int, result) -> None:
        """What exploration during update k found (None: no spot device was alive): the seeds
        S_{k+1} of each prompt's max-variance G-subset."""
        if result is None:
            s.next_seeds = None
            return
        cands, chosen = result[:2]
        s.next_seeds = [[int(x) for x in cc[i]] for cc, i in zip(cands, chosen)]

    def new_row(self, s, k):
        row = super().new_row(s, k)
        row["policy_lag"] = 0        # updates between the batch's sampling policy and θ_k
        if self.spot.fleet is not None:       # every fleet counter present, zeros included
            row.update(dict.fromkeys(FLEET_KEYS, 0))
        return row

    def sync(self, s, row=None):
        self.spot.sync(row)

    def close(self):
        self.spot.close()


class SpotlightPipelinedMode(SpotlightMode):
    """``spotlight`` with the rollouts off the critical path: the candidates the spot devices
    sample with the sampling policy during update k, and score, *are* iteration k+1's training
    batch (each prompt's max-variance G-subset), so iteration k+1 starts training at once. The
    batch is one update staler than the policy it trains; the trainer is told which policy
    sampled it (its ``generator``: nft's v_old is that θ_old's with ``rl.nft.anchor='sampler'``,
    the current θ_old's by default; Flow-GRPO's PPO ratio takes the rollouts' own log-probs).
    Without a ready batch (the first iteration, or no spot device alive during the last update)
    the iteration rolls out synchronously, as ``spotlight``.
    The ready batch and its generator are checkpointed with the iteration (``extra_state``).
    """

    name = "spotlight_pipelined"
    keep_candidates = True

    def __init__(self, state, base):
        super().__init__(state, base)
        self.pending = None     # (iteration, batch, generator) sampled for that iteration

    def rollout_phase(self, s, k, prompts):
        if self.pending is not None and self.pending[0] == k:
            _, batch, self.batch_generator = self.pending
            self.pending = None
            return batch, {"pipelined": 1, "policy_lag": 1}, ReadyBatch(s)
        if self.pending is not None:
            raise RuntimeError(f"the ready batch is for iteration {self.pending[0]}, not {k}")
        self.batch_generator = None
        batch, info, backend = super().rollout_phase(s, k, prompts)
        return batch, {**info, "pipelined": 0}, backend

    def explored(self, s, k, result):
        super().explored(s, k, result)
        self.pending = None
        if result is None:
            logging.info("spotlight_pipelined: no spot device explored during update %d; "
                         "iteration %d rolls out on the trainer", k, k + 1)
            return
        cands, chosen, cbatch, generator = result[:4]
        if cbatch is None or (len(result) > 4 and result[4].get("explore_short")):
            short = result[4].get("explore_short", len(cands)) if len(result) > 4 else len(cands)
            logging.info("spotlight_pipelined: %d prompt(s) had fewer than G candidates scored "
                         "when update %d ended; iteration %d rolls out on the trainer",
                         short, k, k + 1)
            return
        batch = dict(cbatch)                         # the chosen candidates' rollouts
        batch["prompt_ids"] = np.repeat(np.arange(len(cands)), [len(i) for i in chosen])
        batch["seeds"] = np.concatenate([np.asarray(cc, np.uint32)[i]
                                         for cc, i in zip(cands, chosen)])
        self.pending = (k + 1, batch, generator)

    # -- checkpointed with the iteration ---------------------------------------------------------
    def extra_state(self) -> dict | None:
        """Host arrays of the ready batch and its generator (None when there is none)."""
        if self.pending is None:
            return None
        k, batch, generator = self.pending
        out = {"iteration": np.asarray(k, np.int64),
               **{f"batch/{key}": np.asarray(v)
                  for key, v in batches.flatten(batch).items()}}   # tokens may be a pytree
        if generator is not None:
            out.update({f"generator/{i:05d}": np.asarray(x)
                        for i, x in enumerate(jax.tree.leaves(generator))})
        return out

    def load_extra_state(self, s, arrays: dict | None) -> None:
        self.pending = None
        if arrays is None:
            return
        batch = batches.unflatten({key[6:]: v for key, v in arrays.items()
                                  if key.startswith("batch/")})
        leaves = [arrays[key] for key in sorted(arrays) if key.startswith("generator/")]
        generator, like = None, s.trainer.generator() if leaves else None
        if like is not None:    # None: the current anchor needs no saved sampler
            treedef = jax.tree.structure(like)
            generator = jax.tree.unflatten(treedef, [
                jax.device_put(x, getattr(ref, "sharding", None))
                for x, ref in zip(leaves, jax.tree.leaves(like))])
        self.pending = (int(arrays["iteration"]), batch, generator)


def _bind(*classes) -> dict[str, type[Mode]]:
    """One class per mode of :data:`registry.MODES`, in its order; each class takes whether it
    uses spot devices from its spec."""
    by_name = {c.name: c for c in classes}
    if len(by_name) != len(classes) or set(by_name) != set(registry.mode_names()):
        raise RuntimeError(f"mode classes {sorted(c.name for c in classes)} do not match "
                           f"registry.MODES {sorted(registry.mode_names())}")
    for c in classes:
        c.uses_spot = registry.mode_spec(c.name).uses_spot
    return {name: by_name[name] for name in registry.mode_names()}


MODES = _bind(BaselineMode, ExploreSyncMode, SpotRolloutMode, SpotlightMode,
              SpotlightPipelinedMode)


def make_mode(name: str, state, base) -> Mode:
    if registry.mode_spec(name) is registry.COMPARE:
        raise ValueError("mode='compare' runs several modes: use runner.run_compare")
    return MODES[name](state, base)
