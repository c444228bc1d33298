"""Small statistics used by the exploration studies and reports (numpy only).

* ``kendall_tau_b`` / ``spearman_rho``: agreement of two rankings of the same candidates, e.g.
  the rewards of the same (prompt, seed) pairs under theta_k and under a stale theta_{k-d} (the
  staleness study), or under a cheap scorer and the training rollout. Rewards are often discrete
  (0/1, thirds), so ties are the normal case: tau-b corrects for them.
* ``bootstrap_mean_ci``: a percentile-bootstrap confidence interval of a mean, for "mean and 95% CI
  over seeds" in tables.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["MeanCI", "bootstrap_mean_ci", "kendall_tau_b", "rankdata", "spearman_rho"]


def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or y.shape != x.shape:
        raise ValueError(f"x and y must be 1-D of equal length, got shapes {x.shape} and {y.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("x and y must be finite")
    return x, y


def _dense_ranks(v: np.ndarray) -> np.ndarray:
    """Ranks 0, 1, ... with equal values sharing a rank (for exact tie handling)."""
    return np.unique(v, return_inverse=True)[1].astype(np.int64)


def _tied_pairs(ranks: np.ndarray) -> int:
    counts = np.bincount(ranks)
    return int(np.sum(counts * (counts - 1) // 2))


def _count_inversions(a: np.ndarray) -> int:
    """Number of pairs i < j with a[i] > a[j] (strict), by a bottom-up merge sort.

    Each of the ceil(log2 n) levels merges all adjacent sorted blocks at once with one stable
    ``lexsort`` keyed by (block pair, value, side): a right-block element's inversions are the
    left-block elements that sort after it, ``left_size - (position_in_pair - index_in_right)``.
    Ties sort left-first, so equal values are not counted. O(n log^2 n), no Python loop over n.
    """
    a = np.asarray(a).copy()
    n = a.shape[0]
    idx = np.arange(n)
    inversions = 0
    width = 1
    while width < n:
        pair = idx // (2 * width)
        side = (idx // width) % 2
        order = np.lexsort((side, a, pair))
        start = pair * 2 * width  # pair[order] == pair: lexsort keeps each pair's block in place
        pos_in_pair = idx - start
        right = side[order] == 1
        src = order[right]
        index_in_right = src - (start[right] + width)
        left_size = np.minimum(width, n - start[right])
        inversions += int(np.sum(left_size - (pos_in_pair[right] - index_in_right)))
        a = a[order]
        width *= 2
    return inversions


def kendall_tau_b(x, y) -> float:
    """Kendall's tau-b of paired samples, with ties (as ``scipy.stats.kendalltau``'s default).

    tau_b = (n_c - n_d) / sqrt((n_0 - n_x) (n_0 - n_y)), where n_c / n_d count concordant /
    discordant pairs, n_0 = n (n - 1) / 2, and n_x / n_y count pairs tied in x / in y. Returns NaN
    when it is undefined (n < 2, or x or y constant). O(n log^2 n).
    """
    x, y = _paired(x, y)
    n = x.shape[0]
    if n < 2:
        return float("nan")
    rx, ry = _dense_ranks(x), _dense_ranks(y)
    n0 = n * (n - 1) // 2
    tx, ty = _tied_pairs(rx), _tied_pairs(ry)
    if tx == n0 or ty == n0:
        return float("nan")
    # Sort by (x, y); then discordant pairs are exactly the strict inversions of y.
    order = np.lexsort((ry, rx))
    rx, ry = rx[order], ry[order]
    discordant = _count_inversions(ry)
    # Pairs tied in both x and y.
    new = np.concatenate([[True], (rx[1:] != rx[:-1]) | (ry[1:] != ry[:-1])])
    runs = np.diff(np.concatenate([np.flatnonzero(new), [n]]))
    txy = int(np.sum(runs * (runs - 1) // 2))
    concordant = n0 - tx - ty + txy - discordant
    return float((concordant - discordant) / np.sqrt(float(n0 - tx) * float(n0 - ty)))


def rankdata(v) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (``scipy.stats.rankdata`` method='average')."""
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"rankdata expects a 1-D array, got shape {v.shape}")
    order = np.argsort(v, kind="stable")
    s = v[order]
    new = np.concatenate([[True], s[1:] != s[:-1]])
    starts = np.flatnonzero(new)
    ends = np.concatenate([starts[1:], [s.shape[0]]])
    avg = (starts + ends + 1) / 2.0  # mean of 1-based ranks starts+1 .. ends
    ranks = np.empty(s.shape[0])
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman_rho(x, y) -> float:
    """Spearman's rank correlation (Pearson correlation of average ranks); NaN if undefined."""
    x, y = _paired(x, y)
    if x.shape[0] < 2:
        return float("nan")
    rx, ry = rankdata(x), rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = np.sqrt(np.sum(rx * rx) * np.sum(ry * ry))
    return float(np.sum(rx * ry) / denom) if denom > 0 else float("nan")


class MeanCI(NamedTuple):
    """A sample mean with a two-sided confidence interval [lo, hi] from ``n`` values."""

    mean: float
    lo: float
    hi: float
    n: int


def bootstrap_mean_ci(values, confidence: float = 0.95, n_resamples: int = 10_000,
                      seed: int = 0) -> MeanCI:
    """Percentile-bootstrap confidence interval of the mean of ``values``.

    Resamples the values with replacement ``n_resamples`` times and takes the (1 +- confidence) / 2
    quantiles of the resampled means. Deterministic for a given ``seed``. With one value the
    interval collapses to it (there is no spread to resample). Percentile intervals under-cover
    for very small n (a handful of seeds): report n next to the interval.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("bootstrap_mean_ci needs at least one value")
    if not np.all(np.isfinite(v)):
        raise ValueError("values must be finite")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n_resamples, v.size))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return MeanCI(float(v.mean()), float(lo), float(hi), int(v.size))
