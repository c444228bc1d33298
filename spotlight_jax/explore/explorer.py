"""Scoring candidate seeds with a (possibly stale) policy.

A seed fixes a rollout's whole noise sequence (initial noise and every SDE step's noise), so a
candidate's reward under policy θ is the reward of the rollout ``(prompt, seed, θ)``. The default
scorer is the training SDE rollout itself: with Flow-GRPO's SDE the first step's noise washes out
the initial noise, so an ODE rollout from the initial noise alone does not rank seeds (Kendall tau
~0 was measured). Cheaper scorers (fewer steps, lower noise) are a ``SamplerConfig`` away, but
should only be used with their tau against the training rollout measured
(``python -m spotlight_jax.bench.staleness_study``).

``RolloutEngine`` is the shared sample-and-score loop: it samples in chunks and scores chunk ``i``
in a thread pool while chunk ``i + 1`` samples, so a slow reward never stalls sampling.
"""
from __future__ import annotations

import concurrent.futures

import numpy as np

from spotlight_jax import rewards, world
from spotlight_jax.diffusion import Sampler, prompt


class RolloutEngine:
    """Samples trajectories for (prompt, seed) pairs and scores them."""

    def __init__(self, sampler: Sampler, text_len: int, reward: str, chunk: int,
                 tokenize=world.tokenize):
        """``tokenize(prompts, text_len) -> (tokens, mask)``: the run's prompt source's
        (``spotlight_jax.prompt_embeddings``; default the world's tokenizer)."""
        self.sampler, self.text_len, self.chunk = sampler, text_len, chunk
        self.tokenize = tokenize
        self.reward_fn = rewards.get(reward)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)

    def run(self, state, prompts, seeds) -> dict:
        """Returns numpy ``latents, log_probs, images, tokens, mask, rewards`` for every pair.

        Every chunk has the same size (the last is padded) so one compiled program serves all.
        """
        outs, futures = [], []
        for ps, ss, n in padded_chunks(prompts, seeds, self.chunk):
            tokens, mask = self.tokenize(ps, self.text_len)
            out = self.sampler.rollout(state, tokens, mask, ss)
            out = {k: np.asarray(v)[:n] for k, v in out.items()}   # waits for this chunk only
            out["tokens"], out["mask"] = prompt.take(tokens, slice(0, n)), mask[:n]
            futures.append(self.pool.submit(self.reward_fn, out["images"], ps[:n]))
            outs.append(out)
        batch = prompt.concat(outs)            # tokens may be a pytree (diffusion.prompt)
        batch["rewards"] = np.concatenate([f.result() for f in futures]).astype(np.float32)
        return batch


def padded_chunks(prompts, seeds, chunk: int):
    """``(prompts, seeds, n)`` chunks of exactly ``chunk`` pairs, the last padded with copies of
    its last pair (``n`` real ones), so one compiled batch size serves every call."""
    prompts, seeds = list(prompts), np.asarray(seeds, np.uint32)
    for i in range(0, len(prompts), chunk):
        ps, ss = prompts[i:i + chunk], seeds[i:i + chunk]
        n = len(ps)
        if n < chunk:
            ps = ps + [ps[-1]] * (chunk - n)
            ss = np.concatenate([ss, np.repeat(ss[-1:], chunk - n)])
        yield ps, ss, n


def candidate_seeds(run_seed: int, iteration: int, prompt_index: int, n: int,
                    shared_bits: int = 0) -> np.ndarray:
    """Candidate seeds of one prompt slot of one iteration: a pure function of its arguments.

    The first ``G`` candidates are the ones plain Flow-GRPO would use, so exploration only ever
    adds seeds to the random baseline's group. With ``shared_bits = b > 0`` (a sampler with
    ``shared_init_bits = b``) the slot's seeds are ``(h << b) | j`` for one random ``h`` and
    ``j = 0..n-1``: they share ``x_T`` and differ in their SDE noise.
    """
    rng = np.random.default_rng([run_seed, iteration, prompt_index, 31])
    if not shared_bits:
        return rng.integers(0, 2**31 - 1, size=n, dtype=np.int64).astype(np.uint32)
    if n > 2**shared_bits:
        raise ValueError(f"{n} candidate seeds per prompt slot do not fit in {shared_bits} "
                         f"shared-noise bits (at most {2**shared_bits}); lower "
                         "explore.max_extra_per_prompt or rl.group_size")
    high = int(rng.integers(0, 2**(31 - shared_bits)))
    return ((np.uint64(high) << np.uint64(shared_bits)) | np.arange(n, dtype=np.uint64)).astype(
        np.uint32)


class Explorer:
    """Rewards of candidate seeds for a batch of prompts under a given policy state."""

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
