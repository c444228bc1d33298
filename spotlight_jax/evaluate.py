"""Held-out evaluation: ODE samples of fixed (prompt, seed) pairs scored by a reward."""
from __future__ import annotations

import numpy as np

from spotlight_jax import rewards, world
from spotlight_jax.diffusion import Sampler, batches
from spotlight_jax.rewards import constraint_breakdown, missing_credit
from spotlight_jax.rewards.edit import edit_summary
from spotlight_jax.rewards.geneval import exact_scores
from spotlight_jax.rewards.motion import motion_summary


def eval_grid(prompts, num_seeds: int, seed_offset: int = 1_000_000):
    """Fixed evaluation pairs: each prompt with seeds ``seed_offset + j`` (not used in training)."""
    ps = [p for p in prompts for _ in range(num_seeds)]
    seeds = np.array([seed_offset + j for _ in prompts for j in range(num_seeds)], np.uint32)
    return ps, seeds


def generate(sampler: Sampler, state, prompts, seeds, text_len: int, batch_size: int = 64,
             tokenize=world.tokenize):
    """Images ``[N, H, W, C]`` for (prompt, seed) pairs, in batches of ``batch_size``.

    The last batch is padded to the full size so every call reuses one compiled program.
    ``tokenize``: the run's prompt source's (default the world's tokenizer).
    """
    out = []
    for ps, ss, n in batches.padded_chunks(prompts, seeds, batch_size):
        tokens, mask = tokenize(ps, text_len)
        imgs = sampler.rollout(state, tokens, mask, ss)["images"]
        out.append(np.asarray(imgs)[:n])
    return np.concatenate(out)


def paired_gain(scores, baseline) -> dict[str, float]:
    """The mean per-sample gain of ``scores`` over ``baseline`` (the same prompts and seeds, in
    the same order) and its 95% t-interval half-width."""
    from scipy import stats  # noqa: PLC0415

    scores, baseline = np.asarray(scores, np.float64), np.asarray(baseline, np.float64)
    if scores.ndim != 1 or scores.shape != baseline.shape or len(scores) < 2:
        raise ValueError(f"a paired gain needs two evaluations of the same samples: "
                         f"{scores.shape} vs {baseline.shape}")
    d = scores - baseline
    half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return {"gain_paired": float(d.mean()), "gain_paired_ci95": half}


def evaluate(sampler: Sampler, state, prompts, *, num_seeds: int, text_len: int,
             reward: rewards.Reward | None = None, batch_size: int = 64,
             tokenize=world.tokenize, baseline=None):
    """Mean reward, its 95% interval half-width, a reward mix's terms (``reward_<name>``) and
    the per-constraint breakdown. ``reward``: the run's resolved held-out reward (default
    ``geneval_lite``). ``baseline``: an earlier evaluation's per-sample ``scores`` of the same
    prompts and seeds (the result holds ``scores``): adds the paired gain over it
    (``gain_paired``) and its 95% interval half-width (``gain_paired_ci95``, a t-interval of
    the per-sample differences: the same prompt and noise before and after)."""
    reward = reward if reward is not None else rewards.resolve("geneval_lite")
    ps, seeds = eval_grid(prompts, num_seeds)
    images = generate(sampler, state, ps, seeds, text_len, batch_size, tokenize)
    scores, terms = reward.scored(images, ps)
    scores = np.asarray(scores, np.float64)
    result = {"reward": float(scores.mean()),
              "reward_ci95": float(1.96 * scores.std(ddof=1) / np.sqrt(len(scores))),
              "scores": scores}
    if baseline is not None:
        result.update(paired_gain(scores, baseline))
    if reward.is_mix:                               # each term of a mix, clipped, unweighted
        result.update({f"reward_{name}": float(np.mean(v)) for name, v in terms.items()})
    if reward.name == "video_motion":             # its parts and the strict success rate
        result.update(motion_summary(images, ps))
    if reward.name == "edit_lite":                # the edit done, the rest kept, per kind
        result.update(edit_summary(images, ps))
    if reward.name == "geneval_lite":
        graded = constraint_breakdown(images, ps)            # one detection for both views
        for k, v in exact_scores(graded).items():
            v = np.asarray(v, np.float64)
            if np.isfinite(v).any():
                result[f"acc_{k}"] = float(np.nanmean(v))
        # where the reward's shortfall from 1 is, per constraint (the shares sum to 1 - reward)
        result.update({f"missing_{k}": v for k, v in missing_credit(graded).items()})
    return result, images, ps
