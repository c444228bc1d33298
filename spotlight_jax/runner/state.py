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
from typing import Any

import numpy as np

from spotlight_jax.runner.backends.scheduled import ScheduledRollouts


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

    spec: Any
    settings: Any
    workdir: str
    devices: list
    mesh: Any
    base_state: Any
    graphdef: Any
    mcfg: Any
    train_sampler_cfg: Any
    image_shape: tuple
    trainer: Any
    peak_flops: float
    update_devices: int
    reward: Any
    eval_reward: Any
    decoder: Any
    attn: Any
    sampler: Any
    eval_sampler: Any
    prompt_source: Any
    train_prompts: list
    val_prompts: list
    engine: Any
    explorer: Any
    deploy: Any
    shared_update: Any
    planner: Any
    writer: Any
    key: Any
    # the transports and the mode, which hold the state (set by build_run)
    direct: Any = None
    spot_rollouts: Any = None
    ray_fleet: Any = None
    ray_shards: Any = None
    mode: Any = None
    # what changes as the run goes
    iteration: int = 0
    history: list = dataclasses.field(default_factory=list)
    next_seeds: list | None = None       # spotlight: S_{k+1}

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
