"""Agreement of seed rankings between a fresh and a stale policy (explore.staleness)."""
import itertools

import numpy as np
import pytest

from spotlight_jax.explore.staleness import ranking_agreement, summarize_agreement


def _brute_best(r, g):
    subsets = itertools.combinations(range(len(r)), g)
    return max(subsets, key=lambda s: (np.var(r[list(s)]), -sum(s)))


def test_identical_rankings_agree_fully_and_reversed_ones_do_not():
    rng = np.random.default_rng(0)
    fresh = [rng.random(10) for _ in range(5)]
    same = ranking_agreement(fresh, [f * 2 + 1 for f in fresh], 4)   # monotone: same ranking
    assert np.allclose(same["tau"], 1) and np.allclose(same["rho"], 1)
    assert np.allclose(same["overlap"], 1) and np.allclose(same["retained"], 1)
    rev = ranking_agreement(fresh, [-f for f in fresh], 4)
    assert np.allclose(rev["tau"], -1) and np.allclose(rev["rho"], -1)


def test_retained_matches_a_brute_force_computation():
    rng = np.random.default_rng(1)
    g = 3
    for _ in range(20):
        # continuous rewards: the max-variance subset is unique, so tie-breaking cannot differ
        f, s = rng.random(8), rng.random(8)
        out = ranking_agreement([f], [s], g)
        best = np.var(f[list(_brute_best(f, g))])
        stale_pick = list(_brute_best(s, g))
        base = np.var(f[:g])
        want = (np.var(f[stale_pick]) - base) / (best - base) if best > base else 1.0
        assert out["retained"][0] == pytest.approx(want, abs=1e-12)


def test_constant_prompts_are_skipped_and_bad_shapes_raise():
    out = ranking_agreement([np.ones(6), np.arange(6.0)], [np.arange(6.0), np.arange(6.0)], 2)
    assert out["skipped"] == 1 and len(out["tau"]) == 1
    s = summarize_agreement(out)
    assert s["tau"].mean == pytest.approx(1.0) and s["tau"].n == 1
    with pytest.raises(ValueError, match="differ in shape"):
        ranking_agreement([np.arange(6.0)], [np.arange(5.0)], 2)
    with pytest.raises(ValueError, match="more than group_size"):
        ranking_agreement([np.arange(4.0)], [np.arange(4.0)], 4)
