"""Advantages of a batch of rewards, shared by both objectives: per group (one prompt's
rollouts) the mean removed, divided by the group's or the batch's std, clipped; or, for a reward
that is a mean of parts, each part normalised on its own (``decoupled``). The trainer computes
them from its own config (``PolicyTrainer.advantages``)."""
from __future__ import annotations

import numpy as np


def advantages(rewards, prompt_ids, *, global_std: bool = False, clip: float = 5.0,
               eps: float = 1e-4) -> np.ndarray:
    """``(r - mean_prompt) / (std + 1e-4)`` with per-prompt or global std, clipped to ±clip.

    A group whose rewards are all equal gets advantage exactly 0 (it carries no signal).
    """
    r = np.asarray(rewards, np.float64)
    ids = np.asarray(prompt_ids)
    adv = np.zeros_like(r)
    gstd = r.std() if global_std else None
    for pid in np.unique(ids):
        sel = ids == pid
        group = r[sel]
        if np.all(group == group[0]):
            continue
        std = gstd if global_std else group.std()
        adv[sel] = (group - group.mean()) / (std + eps)
    return np.clip(adv, -clip, clip).astype(np.float32)


def decoupled_advantages(parts, prompt_ids, *, weights=None, clip: float = 5.0,
                         eps: float = 1e-4) -> np.ndarray:
    """Advantages of a reward that is the mean of parts, each part normalised on its own.

    ``parts`` is ``[B, K]`` (NaN where a part does not apply; a group's rows share one prompt, so
    NaN columns are whole groups'). Per group: each applicable part's advantage is
    ``(p - mean) / (std + eps)`` (0 for a part constant within the group), those are averaged
    over the applicable parts and the average is normalised again within the group, so every
    group weighs as much as with :func:`advantages` and only the direction inside it changes
    (multi-reward decoupled normalisation, as in GDPO). ``weights`` ``[K]`` (a reward mix's term
    weights; default equal) make the average ``sum_k w_k a_k / sum_k |w_k|`` over the applicable
    parts: a negative weight pushes its part down. Clipped to ±clip.
    """
    p = np.asarray(parts, np.float64)
    ids = np.asarray(prompt_ids)
    if p.ndim != 2 or p.shape[0] != ids.shape[0]:
        raise ValueError(f"parts must be [B, K] with B = {ids.shape[0]} prompt ids, got "
                         f"shape {p.shape}")
    applies = ~np.isnan(p)
    # a part that does not apply is constant (0) within its group: advantage 0, not counted
    per_part = np.stack([advantages(np.nan_to_num(p[:, k]), ids, clip=np.inf, eps=eps)
                         for k in range(p.shape[1])], axis=1)
    w = np.ones(p.shape[1]) if weights is None else np.asarray(weights, np.float64)
    if w.shape != (p.shape[1],):
        raise ValueError(f"weights must be [K] with K = {p.shape[1]} parts, got shape {w.shape}")
    mean = ((per_part * applies) @ w) / np.maximum(applies @ np.abs(w), 1e-12)
    return advantages(mean, ids, clip=clip, eps=eps)


def group_stats(rewards, prompt_ids) -> dict:
    """Mean within-group reward std (``group_std``) and the share of groups whose rewards are all
    equal (``zero_var_groups``: they get advantage 0 and teach nothing). What seed exploration
    is meant to raise and lower."""
    r, ids = np.asarray(rewards, np.float64), np.asarray(prompt_ids)
    groups = [r[ids == pid] for pid in np.unique(ids)]
    return {"group_std": float(np.mean([g.std() for g in groups])),
            "zero_var_groups": float(np.mean([np.all(g == g[0]) for g in groups]))}
