"""How much a stale policy's seed ranking agrees with the current one's (numpy only).

Spotlight explores the seeds of iteration k+1 with θ_k while θ_{k+1} is being trained, so the
seeds it selects were ranked by weights one (or more) updates old. ``ranking_agreement`` compares
the rewards of the *same* (prompt, seed) candidates under a fresh and a stale policy, per prompt:

* ``tau`` / ``rho``: Kendall tau-b and Spearman rho of the two reward vectors;
* ``overlap``: |S_fresh ∩ S_stale| / G for the max-variance G-subsets each policy would select
  (a random G-subset overlaps G/N in expectation);
* ``retained``: (var_fresh(S_stale) - var_fresh(R)) / (var_fresh(S_fresh) - var_fresh(R)), the
  share of the achievable variance gain over the random baseline subset R (the first G seeds)
  that stale selection keeps, measured under the fresh policy (1 = as good as fresh exploration,
  0 = no better than random seeds, < 0 = worse).

Prompts whose rewards are constant under either policy have no ranking; they are counted in
``skipped`` and left out of the means.
"""
from __future__ import annotations

import numpy as np

from spotlight_jax.explore.selection import max_variance_subset, subset_variance
from spotlight_jax.explore.stats import bootstrap_mean_ci, kendall_tau_b, spearman_rho

__all__ = ["ranking_agreement", "summarize_agreement"]


def ranking_agreement(fresh, stale, group_size: int) -> dict:
    """Per-prompt agreement of ``stale`` with ``fresh`` (lists of 1-D reward arrays, one per
    prompt, same candidates in the same order). Returns lists ``tau, rho, overlap, retained``
    (one entry per compared prompt) and ``skipped`` (prompts without a ranking)."""
    if len(fresh) != len(stale):
        raise ValueError(f"{len(fresh)} fresh vs {len(stale)} stale prompts")
    out = {"tau": [], "rho": [], "overlap": [], "retained": [], "skipped": 0}
    for f, s in zip(fresh, stale):
        f, s = np.asarray(f, np.float64), np.asarray(s, np.float64)
        if f.shape != s.shape or f.ndim != 1:
            raise ValueError(f"reward vectors of one prompt differ in shape: {f.shape} vs "
                             f"{s.shape}")
        if len(f) <= group_size:
            raise ValueError(f"need more than group_size={group_size} candidates per prompt, "
                             f"got {len(f)}")
        if np.all(f == f[0]) or np.all(s == s[0]):
            out["skipped"] += 1
            continue
        out["tau"].append(kendall_tau_b(f, s))
        out["rho"].append(spearman_rho(f, s))
        sel_f = max_variance_subset(f, group_size)
        sel_s = max_variance_subset(s, group_size)
        out["overlap"].append(len(set(sel_f.tolist()) & set(sel_s.tolist())) / group_size)
        best = subset_variance(f, sel_f)
        base = subset_variance(f, np.arange(group_size))
        got = subset_variance(f, sel_s)
        out["retained"].append((got - base) / (best - base) if best > base else 1.0)
    return out


def summarize_agreement(agreement: dict) -> dict:
    """Means with 95% bootstrap CIs of every per-prompt list in ``ranking_agreement``'s output."""
    res = {"skipped": agreement["skipped"]}
    for key in ("tau", "rho", "overlap", "retained"):
        vals = [v for v in agreement[key] if np.isfinite(v)]
        res[key] = bootstrap_mean_ci(vals) if vals else None
    return res
