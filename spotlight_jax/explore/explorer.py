"""Scoring candidate seeds with a (possibly stale) policy.

A seed fixes a rollout's whole noise sequence (initial noise and every SDE step's noise), so a
candidate's reward under policy θ is the reward of the rollout ``(prompt, seed, θ)``. The default
scorer is the training SDE rollout itself (``diffusion.engine.RolloutEngine``): with Flow-GRPO's
SDE the first step's noise washes out the initial noise, so an ODE rollout from the initial noise
alone does not rank seeds (Kendall tau ~0 was measured). Cheaper scorers (fewer steps, lower
noise) are a ``SamplerConfig`` away, but should only be used with their tau against the training
rollout measured (``python -m spotlight_jax.studies.staleness_study``).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax
import numpy as np

from spotlight_jax.diffusion import batches
from spotlight_jax.diffusion.engine import RolloutEngine


@runtime_checkable
class Explorer(Protocol):
    """What the runner asks of every explorer (:class:`LocalExplorer` on the trainer's
    process, ``runner.backends.emulated_fleet.FleetExplorer`` on the emulated spot fleet)."""

    def score(self, state, prompts, seeds_per_prompt, keep_trajectories: bool = False):
        """Rewards of ``seeds_per_prompt[i]``, prompt ``i``'s candidate seeds, under ``state``:
        a list of reward arrays (one per prompt) and, with ``keep_trajectories``, a handle on
        the candidates' trajectories for :meth:`select`."""

    def select(self, kept, rows) -> dict:
        """The rollout batch (host arrays, as ``RolloutEngine.run`` returns) of the kept
        candidates ``rows`` (indices in ``score``'s flat order, prompt after prompt): only
        those a mode trains on. An explorer whose candidates ran elsewhere fetches just
        these."""


def take_rows(batch: dict, rows) -> dict:
    """:meth:`Explorer.select` of an explorer whose ``kept`` handle is the whole batch."""
    return batches.take(jax.tree.map(np.asarray, batch), np.asarray(rows))


class LocalExplorer:
    """Rewards of candidate seeds for a batch of prompts under a given policy state, sampled on
    this process's devices by a :class:`RolloutEngine`."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine

    def score(self, state, prompts, seeds_per_prompt, keep_trajectories: bool = False):
        """``seeds_per_prompt[i]`` are prompt ``i``'s candidates. Returns a list of reward
        arrays (one per prompt) and, with ``keep_trajectories``, the full rollout batch (so a
        caller exploring with the *current* policy can train on it without re-running)."""
        flat_p = [p for p, ss in zip(prompts, seeds_per_prompt) for _ in range(len(ss))]
        flat_s = np.concatenate([np.asarray(s, np.uint32) for s in seeds_per_prompt])
        batch = self.engine.run(state, flat_p, flat_s)
        splits = np.cumsum([len(s) for s in seeds_per_prompt])[:-1]
        per_prompt = np.split(batch["rewards"], splits)
        return (per_prompt, batch) if keep_trajectories else per_prompt

    def select(self, kept, rows) -> dict:
        return take_rows(kept, rows)
