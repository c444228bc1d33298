"""The objective's update on a batch: its advantages, then the whole update or a shared one.

The advantages are the trainer's to compute from its own config; what they may need of the
reward (a mix's clipped terms, or a reward's registered parts, for ``rl.advantage='decoupled'``)
comes from the run's resolved reward (``run.reward``). A shared update
(``deployment.shared_update``) cuts each optimizer step into gradient shards that the plan
places on the trainer and the spot groups (the Ray hosts compute theirs for real); the shards
are summed in order, the same update to float rounding.
"""
from __future__ import annotations

import numpy as np


def reward_terms(run, batch: dict, prompts) -> dict[str, np.ndarray]:
    """A reward mix's clipped terms ``{name: [B]}`` for ``batch`` (kept in it as
    ``reward_terms``: logged per iteration, and the decoupled advantages' parts); ``{}`` for a
    plain reward or a batch without its images."""
    if "reward_terms" not in batch:
        if not run.reward.is_mix or "images" not in batch:
            return {}
        batch["reward_terms"] = run.reward.scored(
            batch["images"], [prompts[i] for i in batch["prompt_ids"]])[1]
    return batch["reward_terms"]


def advantages(run, batch: dict, prompts) -> np.ndarray:
    """The batch's advantages as the trainer's config asks, with the reward's parts where the
    objective's work needs them: a mix's terms (weighted), else the reward's own parts."""
    parts = weights = None
    if run.trainer.work.needs_reward_parts:
        if run.reward.is_mix:
            terms = reward_terms(run, batch, prompts)
            if terms:
                parts, weights = np.stack(list(terms.values()), axis=1), run.reward.weights
        else:
            parts = run.reward.components()(batch["images"],
                                            [prompts[i] for i in batch["prompt_ids"]])
    return run.trainer.advantages(batch["rewards"], batch["prompt_ids"], parts, weights)


def train_on(run, batch: dict, k: int, prompts, generator=None, shared=None) -> dict:
    """The objective's update on ``batch`` (advantages computed here); ``generator``: the
    trainer's ``generator()`` of the policy that sampled it, when that is not the current
    sampling policy; ``shared``: the :class:`~spotlight_jax.runner.shared_update.UpdatePlan` of a
    shared update. Returns the update's metrics."""
    trainer = run.trainer
    train = {key: batch[key] for key in trainer.batch_keys}
    train["advantages"] = advantages(run, batch, prompts)
    if shared is not None:
        place = (run.ray_shards.runner(shared) if run.ray_shards is not None
                 else run.shared_update.runner(shared))
        return trainer.update_sharded(train, run.key, k,
                                      shards=run.shared_update.shards(shared), run=place,
                                      generator=generator)
    if generator is None:       # a trainer with the plain update(batch, key, step) serves
        return trainer.update(train, run.key, k)
    return trainer.update(train, run.key, k, generator=generator)
