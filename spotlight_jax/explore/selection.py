"""Max-variance seed selection: which k of a prompt's candidate seeds to train on.

GRPO's advantages are ``(r - mean) / std`` inside a prompt's group, so a group whose rewards
contrast more gives larger, more informative |advantages|. Given the rewards of N explored
candidate seeds, the explorer keeps the k = G whose rewards have the largest (population) variance.

Exactness. For a fixed subset size the variance is maximised by an "extremes" subset: the j lowest
plus the k - j highest values for some j in [0, k]. (Replacing a member y by a value z changes
k * variance by (k - 1) / k * ((z - m')^2 - (y - m')^2), m' the mean of the other k - 1 members. If
a member y lies between two non-members z1 <= y <= z2 in sorted order, one of z1, z2 is at least as
far from m' as y, so swapping it in does not decrease the variance; repeating yields an extremes
subset that is still optimal.) So sorting once and scanning the k + 1 candidates with prefix sums
of x and x^2 is exact and costs O(n log n).

Determinism (documented tie-breaking):
  * the values are ordered by (reward, index) -- a stable sort -- so among equal rewards the lower
    index counts as "lower";
  * among the j whose variance is maximal (within a few ulps of the maximum, so that float rounding
    of mathematically equal candidates cannot flip the choice) the smallest j wins, i.e. the subset
    with the fewest values taken from the bottom;
  * indices are returned sorted ascending.
The output therefore depends only on the input values and their order, never on hashing or RNG.
"""
from __future__ import annotations

import operator

import numpy as np

__all__ = [
    "max_subset_variance",
    "max_variance_subset",
    "prefix_max_subset_variances",
    "subset_variance",
]


def _check_rewards(rewards) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        bad = np.flatnonzero(~np.isfinite(r))
        raise ValueError(
            f"rewards must be finite; non-finite at indices {bad[:8].tolist()}: "
            f"{r[bad[:8]].tolist()}")
    return r


def _check_k(k, n: int) -> int:
    k = operator.index(k)
    if k < 2:
        raise ValueError(f"subset size k={k} must be >= 2 (the variance of <2 values is trivial)")
    if k > n:
        raise ValueError(f"subset size k={k} exceeds the number of rewards n={n}")
    return k


def _extreme_variances(s: np.ndarray, k: int, lengths: np.ndarray | None = None) -> np.ndarray:
    """Population variance of every extremes subset of sorted values along the last axis.

    ``s[..., :n]`` is sorted ascending; entry ``j`` of the result (j = 0..k) is the variance of
    ``s[..., :j]`` together with ``s[..., n-(k-j):n]``. ``lengths`` (broadcastable to
    ``s.shape[:-1]``, each >= k) gives a per-row n when rows are padded at the end; by default
    n = ``s.shape[-1]``. Only the k lowest and k highest values are touched. Values are centred on
    the midrange first so that ``E[x^2] - E[x]^2`` does not cancel catastrophically.
    """
    if lengths is None:
        high = s[..., s.shape[-1] - k:]
    else:
        n = np.broadcast_to(np.asarray(lengths), s.shape[:-1])[..., None]
        high = np.take_along_axis(s, n - k + np.arange(k), axis=-1)
    low = s[..., :k]
    mid = 0.5 * (low[..., :1] + high[..., -1:])
    low, high = low - mid, high - mid
    zero = np.zeros(low.shape[:-1] + (1,))
    # low_j: sum of the j lowest; high_j: sum of high[j:], i.e. of the k - j highest.
    low1 = np.concatenate([zero, np.cumsum(low, axis=-1)], axis=-1)
    low2 = np.concatenate([zero, np.cumsum(low * low, axis=-1)], axis=-1)
    high1 = np.concatenate([np.cumsum(high[..., ::-1], axis=-1)[..., ::-1], zero], axis=-1)
    high2 = np.concatenate([np.cumsum((high * high)[..., ::-1], axis=-1)[..., ::-1], zero], axis=-1)
    mean = (low1 + high1) / k
    return np.maximum((low2 + high2) / k - mean * mean, 0.0)


def prefix_max_subset_variances(seq, k: int, lengths) -> np.ndarray:
    """Max size-``k`` subset variance of every prefix ``seq[..., :m]``, m in ``lengths``.

    ``seq`` has shape ``[..., M]``; returns shape ``[len(lengths), ...]``. One padded sort for all
    prefixes (the planner's gain curves need f(m) for every m = G..G + max_extra).
    """
    v = np.asarray(seq, dtype=np.float64)
    ms = np.asarray(lengths, dtype=np.int64)
    if ms.ndim != 1 or np.any(ms < k) or np.any(ms > v.shape[-1]) or k < 2:
        raise ValueError(f"lengths {ms.tolist()} must lie in [k={k}, {v.shape[-1]}] and k >= 2")
    pos = np.arange(v.shape[-1])
    shape = (ms.size,) + (1,) * (v.ndim - 1) + (v.shape[-1],)
    pad = pos.reshape((1,) * v.ndim + (-1,)) >= ms.reshape(shape[:1] + (1,) * v.ndim)
    x = np.where(pad, np.inf, v[None])
    x.sort(axis=-1)
    lens = ms.reshape((-1,) + (1,) * (v.ndim - 1))
    return _extreme_variances(x, k, lens).max(axis=-1)


def max_variance_subset(rewards, k: int) -> np.ndarray:
    """Indices (ascending, int64) of the size-``k`` subset of ``rewards`` with maximal variance.

    Args:
      rewards: 1-D array-like of finite rewards (one per candidate seed).
      k: subset size (the GRPO group size G), ``2 <= k <= len(rewards)``.

    Raises:
      ValueError: non-1-D or non-finite rewards, ``k < 2`` or ``k > len(rewards)``.
      TypeError: ``k`` is not an integer.

    Exact and O(n log n); ties are broken deterministically as described in the module docstring.
    """
    r = _check_rewards(rewards)
    n = r.shape[0]
    k = _check_k(k, n)
    order = np.argsort(r, kind="stable")  # by (reward, index)
    s = r[order]
    var = _extreme_variances(s, k)
    span = float(s[-1] - s[0])
    # Mathematically tied candidates may differ by rounding; treat them as tied (smallest j wins).
    tol = 64.0 * np.finfo(np.float64).eps * max(span * span, np.finfo(np.float64).tiny)
    j = int(np.flatnonzero(var >= var.max() - tol)[0])
    idx = np.concatenate([order[:j], order[n - (k - j):]])
    return np.sort(idx).astype(np.int64)


def max_subset_variance(values, k: int) -> np.ndarray:
    """The maximal size-``k`` subset variance along the last axis (batched; values only).

    ``values`` has shape ``[..., n]``; the result has shape ``[...]``. Used where only the achieved
    variance matters (the planner's resampling, simulations), so no indices or tie-breaking.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim < 1:
        raise ValueError(f"values must have at least 1 dimension, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError("values must be finite")
    k = _check_k(k, v.shape[-1])
    return _extreme_variances(np.sort(v, axis=-1), k).max(axis=-1)


def subset_variance(rewards, indices) -> float:
    """Population variance of ``rewards[indices]`` (the quantity the selection maximises)."""
    r = _check_rewards(rewards)
    return float(np.var(r[np.asarray(indices, dtype=np.int64)]))
