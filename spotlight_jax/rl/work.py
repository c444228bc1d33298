"""What one update of an objective does, apart from any trainer that does it.

The cost model, the run's utilisation counters, ``--dry_run``, the shared update's planner and a
Ray spot host computing gradient shards all need to know an objective's work (the rows a
gradient pass pushes through the model, how many passes an update makes, how its optimizer
steps cut into shards, what the cost model should charge and say about it) without holding a
trainer. :class:`ObjectiveWork` is that description, from the objective's config and its
rollout sampler; each objective's trainer class supplies the numbers (its static
``update_rows``, ``gradient_passes``, ``shard_units``, ``shard_program``, ``workload``), so
nothing outside ``rl`` branches on the objective's name.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from spotlight_jax.diffusion import SamplerConfig


@dataclasses.dataclass(frozen=True)
class UpdateRows:
    """What one gradient step of an update pushes through the model (what ``--dry_run`` sizes
    the activations from).

    ``grad``: rows whose forward is differentiated (their activations are kept for the
    backward pass). ``forward``: rows through forwards without gradient in the same step (an old
    or reference policy's velocity: transient, one layer at a time). ``guidance``: the CFG scale
    of those forwards (> 1 doubles every row: conditional and unconditional).
    """

    grad: int
    forward: int
    guidance: float = 1.0


def needs_reward_parts(cfg) -> bool:
    """Whether an objective's advantages want the reward's components (``advantage=
    'decoupled'``: each part normalised within its group)."""
    return cfg.advantage == "decoupled"


@dataclasses.dataclass(frozen=True)
class ObjectiveWork:
    """The work of one update of the objective configured by ``cfg`` (an objective's frozen
    config) on rollouts of ``sampler``; ``trainer``: the objective's trainer class."""

    cfg: Any
    sampler: SamplerConfig
    trainer: type

    def update_rows(self, batch: int) -> UpdateRows:
        """The rows one gradient pass of an update on ``batch`` samples pushes through the
        model."""
        return self.trainer.update_rows(self.cfg, self.sampler, batch)

    @property
    def gradient_passes(self) -> int:
        """Gradient passes (each of :meth:`update_rows`) per update: minibatches x epochs."""
        return self.trainer.gradient_passes(self.cfg)

    def shard_units(self, batch: int) -> tuple[int, int]:
        """``(optimizer steps of an update on batch samples, the samples each step's gradient
        shards divide)``: a shared update has one window per step."""
        return self.trainer.shard_units(self.cfg, batch)

    def shard_program(self, graphdef):
        """``program(base, weights, rows)``: one shard's ``(gradient, metric sums)`` for a
        process that holds the same base (a spot host)."""
        return self.trainer.shard_program(graphdef, self.cfg, self.sampler)

    @property
    def needs_reward_parts(self) -> bool:
        """Whether the advantages want the reward's components (``advantage='decoupled'``)."""
        return needs_reward_parts(self.cfg)

    def workload(self, cfg_passes: int) -> dict:
        """The fields of the cost model's ``Workload``: what it charges per rollout and per
        trained sample (``cfg_passes``: the model's forwards per sampling step, 2 under CFG),
        with ``notes``, the assumption rows its report prints about them."""
        return self.trainer.workload(self.cfg, self.sampler, cfg_passes)
