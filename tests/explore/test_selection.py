"""Max-variance seed selection (exact vs brute force) and the exploration statistics."""
import itertools

import numpy as np
import pytest

from spotlight_jax.explore import (
    bootstrap_mean_ci,
    kendall_tau_b,
    max_subset_variance,
    max_variance_subset,
    spearman_rho,
)
from spotlight_jax.explore.selection import prefix_max_subset_variances
from spotlight_jax.explore.stats import _count_inversions, rankdata

_COMBOS = {}


def _brute_max_var(r, k):
    n = r.shape[0]
    if (n, k) not in _COMBOS:
        _COMBOS[n, k] = np.array(list(itertools.combinations(range(n), k)))
    return float(np.var(r[_COMBOS[n, k]], axis=1).max())


def _draw(rng, n):
    kind = rng.integers(4)
    if kind == 0:
        return rng.normal(size=n)
    if kind == 1:
        return rng.integers(0, 2, n).astype(float)  # 0/1 rewards: heavy ties
    if kind == 2:
        return rng.integers(0, 3, n) / 2.0  # {0, 0.5, 1}
    return np.round(rng.normal(size=n), 1) + 100.0  # ties and a large offset


def test_matches_brute_force_on_all_subsets():
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(2, 11))
        r = _draw(rng, n)
        for k in range(2, n + 1):
            idx = max_variance_subset(r, k)
            assert idx.dtype == np.int64 and idx.shape == (k,)
            assert np.all(np.diff(idx) > 0), "indices must be unique and sorted ascending"
            best = _brute_max_var(r, k)
            assert np.var(r[idx]) == pytest.approx(best, rel=1e-12, abs=1e-12), (r, k)
            assert float(max_subset_variance(r, k)) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_deterministic_and_permutation_consistent():
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(3, 12))
        r = _draw(rng, n)
        k = int(rng.integers(2, n + 1))
        a = max_variance_subset(r, k)
        np.testing.assert_array_equal(a, max_variance_subset(r.copy(), k))
        np.testing.assert_array_equal(a, max_variance_subset(list(r), k))
        # The chosen multiset of values depends only on the values, not on their order.
        perm = rng.permutation(n)
        b = max_variance_subset(r[perm], k)
        np.testing.assert_array_equal(np.sort(r[a]), np.sort(r[perm][b]))


def test_documented_tie_breaking():
    # All equal: every j ties; the smallest j (0) takes the k highest by (reward, index).
    np.testing.assert_array_equal(max_variance_subset([0.5] * 5, 3), [2, 3, 4])
    # One low and one high extreme.
    np.testing.assert_array_equal(max_variance_subset([0, 0, 1, 1], 2), [0, 3])
    # Symmetric: {0, 2, 3} and {0, 1, 3} have equal variance; smallest j (one from the bottom) wins.
    np.testing.assert_array_equal(max_variance_subset([0.0, 1.0, 2.0, 3.0], 3), [0, 2, 3])
    # Among equal rewards the lower index counts as lower.
    np.testing.assert_array_equal(max_variance_subset([1, 0, 1, 0, 1, 0], 2), [1, 4])


def test_errors_name_the_values():
    with pytest.raises(ValueError, match=r"k=5 exceeds .* n=4"):
        max_variance_subset([0, 1, 2, 3], 5)
    with pytest.raises(ValueError, match=r"k=1 must be >= 2"):
        max_variance_subset([0, 1, 2, 3], 1)
    with pytest.raises(ValueError, match="1-D"):
        max_variance_subset(np.zeros((2, 3)), 2)
    with pytest.raises(ValueError, match="1-D"):
        max_variance_subset(3.0, 2)
    with pytest.raises(ValueError, match="finite"):
        max_variance_subset([0.0, np.nan, 1.0], 2)
    with pytest.raises(ValueError, match="finite"):
        max_variance_subset([0.0, np.inf, 1.0], 2)
    with pytest.raises(TypeError):
        max_variance_subset([0.0, 1.0, 2.0], 2.0)


def test_large_input_is_fast_and_picks_extremes():
    r = np.random.default_rng(2).normal(size=200_000)
    idx = max_variance_subset(r, 8)
    order = np.argsort(r, kind="stable")
    assert set(idx.tolist()) == set(order[:4].tolist()) | set(order[-4:].tolist())


def test_batched_and_prefix_variants_agree():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 3, size=(6, 5, 20)) / 2.0
    np.testing.assert_allclose(
        max_subset_variance(x, 4),
        np.array([[max_subset_variance(row, 4) for row in plane] for plane in x]), atol=1e-15)
    lengths = [4, 5, 11, 20]
    got = prefix_max_subset_variances(x, 4, lengths)
    want = np.stack([max_subset_variance(x[..., :m], 4) for m in lengths])
    np.testing.assert_allclose(got, want, atol=1e-15)


# ----------------------------------------------------------------------------------------- stats
def _tau_b_brute(x, y):
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            conc += sx * sy > 0
            disc += sx * sy < 0
            tx += sx == 0
            ty += sy == 0
    n0 = n * (n - 1) // 2
    if tx == n0 or ty == n0:
        return float("nan")
    return (conc - disc) / np.sqrt((n0 - tx) * (n0 - ty))


def test_count_inversions_brute_force():
    rng = np.random.default_rng(4)
    for _ in range(100):
        a = rng.integers(0, 5, int(rng.integers(0, 40)))
        want = sum(int(a[i] > a[j]) for i in range(len(a)) for j in range(i + 1, len(a)))
        assert _count_inversions(a) == want


def test_kendall_tau_b_matches_definition_with_ties():
    rng = np.random.default_rng(5)
    for _ in range(150):
        n = int(rng.integers(2, 30))
        x = rng.integers(0, int(rng.integers(1, 6)), n).astype(float)
        y = np.where(rng.random(n) < 0.5, x, rng.integers(0, 4, n))
        want = _tau_b_brute(x, y)
        got = kendall_tau_b(x, y)
        if np.isnan(want):
            assert np.isnan(got)
        else:
            assert got == pytest.approx(want, abs=1e-12)


def test_kendall_tau_b_known_values():
    # scipy.stats.kendalltau documentation example.
    assert kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]) == pytest.approx(-0.47140452079103173)
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert np.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))
    assert np.isnan(kendall_tau_b([1], [2]))
    # Bivariate normal: tau = 2/pi * arcsin(rho); here rho = 1/sqrt(2) -> tau = 0.5.
    rng = np.random.default_rng(6)
    x = rng.normal(size=20_000)
    assert kendall_tau_b(x, x + rng.normal(size=x.size)) == pytest.approx(0.5, abs=0.02)


def test_spearman_and_ranks():
    # scipy.stats.spearmanr documentation example.
    assert spearman_rho([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233)
    np.testing.assert_array_equal(rankdata([10, 20, 10, 30]), [1.5, 3.0, 1.5, 4.0])
    assert np.isnan(spearman_rho([1, 1, 1], [1, 2, 3]))


def test_bootstrap_mean_ci():
    rng = np.random.default_rng(7)
    v = rng.normal(1.0, 2.0, size=400)
    ci = bootstrap_mean_ci(v, seed=3)
    assert ci == bootstrap_mean_ci(v, seed=3)
    assert ci.lo < ci.mean < ci.hi and ci.n == 400
    half = 1.96 * v.std() / np.sqrt(v.size)
    assert (ci.hi - ci.lo) / 2 == pytest.approx(half, rel=0.15)
    one = bootstrap_mean_ci([2.5])
    assert one.mean == one.lo == one.hi == 2.5
    with pytest.raises(ValueError):
        bootstrap_mean_ci([])
    with pytest.raises(ValueError):
        bootstrap_mean_ci([1.0, 2.0], confidence=1.0)


def test_contrast_table_compares_first_g_with_the_max_variance_subset():
    from spotlight_jax.studies.contrast import contrast_table
    r = np.array([[0.5, 0.5, 0.0, 1.0],     # first 2 equal (no signal); best pair: 0.0 and 1.0
                  [0.2, 0.4, 0.3, 0.3]])
    t = contrast_table(r, 2)
    assert t["first"]["zero_var_groups"] == 0.5 and t["selected"]["zero_var_groups"] == 0.0
    np.testing.assert_allclose(t["first"]["group_std"], (0.0 + 0.1) / 2)
    np.testing.assert_allclose(t["selected"]["group_std"], (0.5 + 0.1) / 2)
    np.testing.assert_allclose(t["selected"]["reward_mean"], (0.0 + 1.0 + 0.2 + 0.4) / 4)
    # per-prompt std: every non-constant pair gets advantages of about +-1
    np.testing.assert_allclose(t["first"]["mean_abs_advantage"], 0.5, atol=1e-3)
    np.testing.assert_allclose(t["selected"]["mean_abs_advantage"], 1.0, atol=1e-3)
    with pytest.raises(ValueError, match="pool >= 3"):
        contrast_table(r[:, :2], 3)
