"""The training rollout engine every mode samples with: trajectories for (prompt, seed) pairs,
scored as they finish, and the candidate seeds of a prompt slot.

``RolloutEngine`` samples in equal chunks (``batches.padded_chunks``: one compiled program serves
every call) and scores chunk ``i`` in a thread pool while chunk ``i + 1`` samples, so a slow
reward never stalls sampling. ``candidate_seeds`` is a pure function of (run seed, iteration,
prompt slot): the first G are a plain run's seeds, exploration only ever adds to them.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

import jax
import numpy as np

from spotlight_jax.diffusion import batches
from spotlight_jax.diffusion.rollout import Sampler


class RolloutEngine:
    """Samples trajectories for (prompt, seed) pairs and scores them."""

    def __init__(self, sampler: Sampler, text_len: int, reward_fn: Callable, chunk: int,
                 tokenize: Callable):
        """``reward_fn(images, prompts) -> [N]`` (``rewards.get(name)``); ``tokenize(prompts,
        text_len) -> (tokens, mask)``: the run's prompt source's."""
        self.sampler, self.text_len, self.chunk = sampler, text_len, chunk
        self.tokenize = tokenize
        self.reward_fn = reward_fn
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)

    def run(self, state, prompts, seeds) -> dict:
        """Returns numpy ``latents, log_probs, images, tokens, mask, rewards`` for every pair.

        Every chunk has the same size (the last is padded) so one compiled program serves all.
        """
        outs, futures = [], []
        for ps, ss, n in batches.padded_chunks(prompts, seeds, self.chunk):
            tokens, mask = self.tokenize(ps, self.text_len)
            out = self.sampler.rollout(state, tokens, mask, ss)
            # an explicit read, which waits for this chunk only
            out = {k: np.asarray(v)[:n] for k, v in jax.device_get(out).items()}
            out["tokens"], out["mask"] = batches.take(tokens, slice(0, n)), mask[:n]
            futures.append(self.pool.submit(self.reward_fn, out["images"], ps[:n]))
            outs.append(out)
        batch = batches.concat(outs)           # tokens may be a pytree (diffusion.prompt)
        batch["rewards"] = np.concatenate([f.result() for f in futures]).astype(np.float32)
        return batch


def candidate_seeds(run_seed: int, iteration: int, prompt_index: int, n: int,
                    shared_bits: int = 0) -> np.ndarray:
    """Candidate seeds of one prompt slot of one iteration: a pure function of its arguments.

    The first ``G`` candidates are the ones the baseline mode uses, so exploration only ever
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
