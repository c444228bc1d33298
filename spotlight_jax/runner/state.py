"""The state of one post-training run: what every mode steps on.

A :class:`RunState` holds what ``runner.build.build_run`` made for the run (the trainer's mesh,
the samplers, the objective's trainer, the resolved rewards, the rollout engine and explorer,
the emulated deployment, the planner, the transports, the metric writer, the mode object that
defines an iteration) and what changes as it runs (iteration, history, next seeds, key). It
builds nothing. Everything random is a function of (seed, iteration), and the full state
(policy, optimizer, EMA, planner, next seeds, clock, trace cursor, history) is checkpointed
(``checkpointing``), so a resumed run repeats the same numbers. The update is ``update``;
evaluations, plots and exports are ``outputs``, called by the loop's hooks.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from spotlight_jax.runner.backends.scheduled import ScheduledRollouts

if TYPE_CHECKING:       # types only: the modules below hold the state, they are not its parts
    from spotlight_jax.config import RunSpec
    from spotlight_jax.config.settings import RunSettings
    from spotlight_jax.diffusion import Sampler, SamplerConfig
    from spotlight_jax.diffusion.engine import RolloutEngine
    from spotlight_jax.emulation.deployment import Deployment
    from spotlight_jax.explore.explorer import Explorer
    from spotlight_jax.explore.planner import Planner
    from spotlight_jax.io.metrics import MetricWriter
    from spotlight_jax.models import AttentionSpec
    from spotlight_jax.models.factory import ModelConfig
    from spotlight_jax.models.vae.latent_vae import LatentVAE
    from spotlight_jax.prompt_embeddings.source import PromptSource
    from spotlight_jax.rewards import Reward
    from spotlight_jax.rl.policy import Trainer
    from spotlight_jax.runner.backends.ray_fleet import RayFleet
    from spotlight_jax.runner.backends.ray_shards import RayShards
    from spotlight_jax.runner.backends.rollouts import DirectRollouts, Rollouts
    from spotlight_jax.runner.modes import Mode
    from spotlight_jax.runner.shared_update import SharedUpdate


def iteration_prompts(prompts, k: int, n: int, seed: int):
    """The ``n`` training prompts of iteration ``k`` (a pure function of (seed, k))."""
    rng = np.random.default_rng([seed, k, 17])
    return [prompts[i] for i in rng.choice(len(prompts), n, replace=False)]


@dataclasses.dataclass(eq=False)
class RunState:
    """State of one post-training run in ``workdir`` (made by ``runner.build.build_run``).

    ``spec``/``settings``: the run's ``RunSpec`` and its runner settings. ``devices``: this
    process's devices (the runner never places work on another process's). ``base_state``: the
    frozen base on the trainer's mesh (LoRA's reference policy). ``reward``/``eval_reward``: the
    training and held-out rewards, resolved once (``rewards.Reward``). ``peak_flops`` x
    ``update_devices``: MFU's denominator. The transports (``direct``, ``spot_rollouts``,
    ``ray_fleet``, ``ray_shards``) and the ``mode`` are set once the state exists, since they
    hold it.
    """

    spec: RunSpec
    settings: RunSettings
    workdir: str
    devices: list[jax.Device]
    mesh: Mesh
    base_state: nnx.State
    graphdef: nnx.GraphDef
    mcfg: ModelConfig
    train_sampler_cfg: SamplerConfig
    image_shape: tuple[int, ...]
    trainer: Trainer
    peak_flops: float
    update_devices: int
    reward: Reward
    eval_reward: Reward
    decoder: LatentVAE | None
    attn: AttentionSpec
    sampler: Sampler
    eval_sampler: Sampler
    prompt_source: PromptSource
    train_prompts: list[str]
    val_prompts: list[str]
    engine: RolloutEngine
    explorer: Explorer
    deploy: Deployment
    shared_update: SharedUpdate
    planner: Planner
    writer: MetricWriter
    key: jax.Array
    # the transports and the mode, which hold the state (set by build_run)
    direct: DirectRollouts | None = None
    spot_rollouts: Rollouts | None = None
    ray_fleet: RayFleet | None = None
    ray_shards: RayShards | None = None
    mode: Mode | None = None
    # what changes as the run goes
    iteration: int = 0
    history: list[dict] = dataclasses.field(default_factory=list)
    next_seeds: list[list[int]] | None = None       # spotlight: S_{k+1}, per prompt

    @property
    def scheduler_on(self) -> bool:
        """Whether spot rollouts go through the pull scheduler's emulated pool."""
        return isinstance(self.spot_rollouts, ScheduledRollouts)

    def step(self, k: int) -> dict:
        """Iteration ``k`` of the run's mode; returns its metrics row."""
        return self.mode.step(self, k)

    def prompts(self, k: int) -> list[str]:
        st = self.settings
        return iteration_prompts(self.train_prompts, k, st.prompts_per_iter, st.seed)

    def rollout(self, prompts, seeds_per_prompt) -> dict:
        """The batch of ``prompts`` x seeds on the trainer's devices (no time charged)."""
        return self.direct.rollout(self.iteration, prompts, seeds_per_prompt)[0]

    def close(self):
        self.mode.close()
        self.spot_rollouts.close()
        if self.ray_fleet is not None:
            self.ray_fleet.close()
