"""The state of one post-training run: what every mode steps on.

A :class:`RunState` holds the trainer's mesh, the samplers, the objective's trainer, the rollout
engine and explorer, the emulated deployment, the planner, the metric writer, and the mode
object (``spotlight_jax.runner.modes``) that defines an iteration. Everything random is a
function of (seed, iteration), and the full state (policy, optimizer, EMA, planner, next seeds,
clock, trace cursor, history) is checkpointed (``checkpointing``), so a resumed run repeats the
same numbers. Evaluations, plots and exports are ``outputs``, called by the loop's hooks.
"""
from __future__ import annotations

import jax
import numpy as np
from absl import logging

from spotlight_jax import rewards, utilization, world
from spotlight_jax.config import RunSpec
from spotlight_jax.diffusion import Sampler
from spotlight_jax.diffusion.engine import RolloutEngine
from spotlight_jax.explore.explorer import LocalExplorer
from spotlight_jax.explore.planner import Planner, PlannerConfig
from spotlight_jax.metrics import MetricWriter
from spotlight_jax.parallel.sharding import shard_state
from spotlight_jax.runner.modes import MODES, make_mode
from spotlight_jax.runner.ray_fleet import RayFleet, RayShards
from spotlight_jax.runner.rollouts import (
    DirectRollouts,
    RayRollouts,
    ScheduledRollouts,
    rollout_on_groups,
)
from spotlight_jax.runner.shared_update import SharedUpdate


def iteration_prompts(prompts, k: int, n: int, seed: int):
    """The ``n`` training prompts of iteration ``k`` (a pure function of (seed, k))."""
    rng = np.random.default_rng([seed, k, 17])
    return [prompts[i] for i in rng.choice(len(prompts), n, replace=False)]


def eval_prompts(val: list[str], n: int) -> list[str]:
    """The held-out prompts: the same ``n`` of the validation pool ``val`` for every run and
    evaluation."""
    rng = np.random.default_rng(1234)
    return [val[i] for i in sorted(rng.choice(len(val), min(n, len(val)), replace=False))]


def prompt_kind(prompt: str) -> str:
    """The planner's prompt cluster: the synthetic world's prompt kind, or one cluster
    ('other') for prompts outside its grammar (a real model's prompt file)."""
    try:
        return world.grammar.kind_of(prompt)
    except ValueError:
        return "other"


class RunState:
    """State and helpers of one post-training run in ``workdir``.

    ``spec``: the run's :class:`~spotlight_jax.config.RunSpec`. ``devices``: the trainer's
    devices (default: ``trainer_devices`` of this process's, 0 = all). ``trainer``: a
    multi-process trainer job's ``TrainerJob``, whose update runs on its own mesh while this one
    holds the sampling weights.
    """

    def __init__(self, spec: RunSpec, workdir, graphdef, base, devices=None, trainer=None):
        if not isinstance(spec, RunSpec):
            raise TypeError(f"RunState takes a RunSpec (RunSpec.from_config(config)), not "
                            f"{type(spec).__name__}")
        self.spec = spec
        self.settings = st = spec.settings
        self.workdir = workdir
        # This process's devices: the runner never places work on another process's devices
        # (in a multi-process trainer job only the trainer's collectives span them).
        self.devices = list(jax.local_devices())
        self.mesh = spec.build_mesh(devices if devices is not None else spec.trainer_devices())
        base = shard_state(base, self.mesh)
        self.base_state = base                  # the frozen base (LoRA's reference policy)
        self.mcfg = spec.model
        self.train_sampler_cfg = spec.sampler
        self.image_shape = (self.mcfg.image_size,) * 2 + (self.mcfg.channels,)
        self.graphdef = graphdef
        self.trainer = (trainer if trainer is not None
                        else spec.make_trainer(graphdef, base, mesh=self.mesh))
        # MFU's denominator: one device's peak (datasheet, or a measured matmul on a CPU) x the
        # devices the update runs on
        self.peak_flops, peak_source = utilization.device_peak(self.mesh.devices.flat[0])
        self.update_devices = int((self.mesh if trainer is None else trainer.mesh).devices.size)
        logging.info("MFU against %.4g TFLOP/s per device (%s) x %d update device(s)",
                     self.peak_flops / 1e12, peak_source, self.update_devices)
        self.reward_parts = self._reward_parts()
        self._terms_fn = (rewards.get_terms(st.reward) if rewards.mix.is_mix(st.reward)
                          else None)
        # a latent model's VAE (None for pixels) and the attention layout on the trainer's mesh
        self.decoder = spec.image_decoder()
        self.attn = spec.attention_spec(self.mesh)
        self.sampler = Sampler(graphdef, self.image_shape, self.train_sampler_cfg, self.attn,
                               mesh=self.mesh, decoder=self.decoder)
        self.eval_sampler = Sampler(graphdef, self.image_shape,
                                    spec.eval_sampler, self.attn,
                                    mesh=self.mesh, decoder=self.decoder)
        # the prompts and their model inputs: the world's tokenizer or an embedding file
        self.prompt_source = spec.prompt_source()
        self.train_prompts = self.prompt_source.train_prompts
        if not self.prompt_source.val_prompts:
            raise ValueError(f"prompts.embeddings_file={spec.embeddings_file!r}: has "
                             "no held-out prompts (split 'val') to evaluate on; re-run python "
                             "-m spotlight_jax.encode_prompts with --val_prompts")
        self.val_prompts = eval_prompts(self.prompt_source.val_prompts, st.eval_prompts)
        self.engine = RolloutEngine(self.sampler, self.mcfg.text_len, rewards.get(st.reward),
                                    chunk=max(st.group_size, 32),
                                    tokenize=self.prompt_source.tokenize)
        rewards.get(st.eval_reward)             # an unknown name fails here, not at eval 0
        self.explorer = LocalExplorer(self.engine)
        self.deploy = spec.make_deployment()
        self.shared_update = SharedUpdate(
            self.deploy, lambda n: self.trainer.shard_units(self.trainer.cfg, n))
        self.planner = Planner(PlannerConfig(group_size=st.group_size,
                                             algorithm=st.explore.algorithm,
                                             max_extra_per_prompt=st.explore.max_extra_per_prompt,
                                             seed=st.seed),
                               key_fn=prompt_kind if st.explore.cluster_by_kind else None)
        self.direct = DirectRollouts(self)
        self.ray_fleet = RayFleet(self) if st.transport == "ray" else None
        # a shared update over Ray: the hosts compute their share of the shards for real
        self.ray_shards = (RayShards(self.ray_fleet)
                           if self.ray_fleet is not None and self.shared_update.enabled
                           else None)
        self.spot_rollouts = self._spot_rollouts()
        self.writer = MetricWriter(workdir, "rl", wandb=st.wandb,
                                   wandb_project=st.wandb_project, run_config=spec.plain())
        self.key = jax.random.key(st.seed)
        self.iteration = 0
        self.history: list[dict] = []
        self.next_seeds: list[list[int]] | None = None   # spotlight: S_{k+1}
        self.mode = make_mode(st.mode, self, base)

    def _reward_parts(self):
        """The reward's components, where the trainer's advantages need them (the config
        validated the choice); a mix's are its terms, computed with them."""
        name = self.settings.reward
        if not self.trainer.needs_reward_parts or rewards.mix.is_mix(name):
            return None
        return rewards.get_components(name)

    def reward_terms(self, batch, prompts) -> dict[str, np.ndarray]:
        """A reward mix's clipped terms ``{name: [B]}`` for ``batch`` (kept in it as
        ``reward_terms``: logged per iteration, and the decoupled advantages' parts); ``{}`` for
        a plain reward or a batch without its images."""
        if "reward_terms" not in batch:
            if self._terms_fn is None or "images" not in batch:
                return {}
            batch["reward_terms"] = self._terms_fn(
                batch["images"], [prompts[i] for i in batch["prompt_ids"]])[1]
        return batch["reward_terms"]

    def _spot_rollouts(self):
        """The rollout backend with spot devices: Ray spot hosts (``transport='ray'``), the pull
        scheduler's emulated pool when the devices hold it (one per spot node plus one
        on-demand; the emulated devices carry group identities), else direct rollouts with the
        same time accounting."""
        st = self.settings
        if st.transport not in ("emulated", "ray"):
            raise ValueError(f"deployment.transport={st.transport!r}: choose 'emulated' or "
                             "'ray'")
        if st.transport == "ray":
            return RayRollouts(self)
        need = 1 + self.deploy.cfg.spot_nodes
        if st.scheduler and len(self.devices) >= need:
            return ScheduledRollouts(self, rollout_on_groups(st.rollout_on_groups))
        if st.scheduler and getattr(MODES.get(st.mode), "uses_spot", False):
            logging.warning("deployment.scheduler: %d device(s) cannot hold the scheduler's pool "
                            "(%d needed: one on-demand and one per spot node); rollouts run "
                            "directly with the same emulated-time accounting",
                            len(self.devices), need)
        return DirectRollouts(self, use_spot=True)

    @property
    def scheduler_on(self) -> bool:
        """Whether spot rollouts go through the pull scheduler's emulated pool."""
        return isinstance(self.spot_rollouts, ScheduledRollouts)

    # -- what every mode uses ------------------------------------------------------------------
    def step(self, k: int) -> dict:
        """Iteration ``k`` of the run's mode; returns its metrics row."""
        return self.mode.step(self, k)

    def prompts(self, k: int) -> list[str]:
        st = self.settings
        return iteration_prompts(self.train_prompts, k, st.prompts_per_iter, st.seed)

    def rollout(self, prompts, seeds_per_prompt) -> dict:
        """The batch of ``prompts`` x seeds on the trainer's devices (no time charged)."""
        return self.direct.rollout(self.iteration, prompts, seeds_per_prompt)[0]

    def train_on(self, batch, k: int, prompts, generator=None, shared=None) -> dict:
        """The objective's update on ``batch`` (advantages computed here); ``generator``: the
        trainer's :meth:`generator` of the policy that sampled it, when that is not the current
        sampling policy; ``shared``: the :class:`~spotlight_jax.runner.shared_update.UpdatePlan`
        of a shared update (its shards summed in order: the same update to float rounding)."""
        parts = weights = None
        terms = self.reward_terms(batch, prompts)
        if self.trainer.needs_reward_parts and terms:
            parts = np.stack(list(terms.values()), axis=1)
            weights = rewards.component_weights(self.settings.reward)
        elif self.reward_parts is not None:
            parts = self.reward_parts(batch["images"], [prompts[i] for i in batch["prompt_ids"]])
        adv = self.trainer.advantages(batch["rewards"], batch["prompt_ids"], parts, weights)
        train = {key: batch[key] for key in self.trainer.batch_keys}
        train["advantages"] = adv
        if shared is not None:
            return self.trainer.update_sharded(train, self.key, k,
                                               shards=self.shared_update.shards(shared),
                                               run=(self.ray_shards.runner(shared)
                                                    if self.ray_shards is not None
                                                    else self.shared_update.runner(shared)),
                                               generator=generator)
        if generator is None:       # a trainer with the plain update(batch, key, step) serves
            return self.trainer.update(train, self.key, k)
        return self.trainer.update(train, self.key, k, generator=generator)

    def close(self):
        self.mode.close()
        self.spot_rollouts.close()
        if self.ray_fleet is not None:
            self.ray_fleet.close()
