"""The budgeted bandit exploration planner: budget, saturation, learning, exact JSON state."""
import json
import math

import numpy as np
import pytest

from spotlight_jax.explore import Planner, PlannerConfig
from spotlight_jax.explore.planner import gain_curve
from spotlight_jax.studies.planner import bernoulli_gain_curve, simulate

G = 8
ALGS = ("ucb", "thompson", "uniform")


def _mixed(rng, n=G, p=0.5):
    return (rng.random(n) < p).astype(float)


def _spent(plan, costs, g=G):
    """Exact (correctly rounded) total cost of the extras: what must not exceed the budget."""
    return math.fsum(costs[pid] for pid, n in plan.items() for _ in range(n - g))


@pytest.mark.parametrize("algorithm", ["ucb", "thompson"])
def test_saturated_prompts_get_no_extras(algorithm):
    cfg = PlannerConfig(group_size=G, algorithm=algorithm, recheck_prob=0.0, recheck_after=0,
                        max_extra_per_prompt=16)
    planner = Planner(cfg)
    rng = np.random.default_rng(0)
    planner.update("all_zero", np.zeros(G))
    planner.update("all_one", np.ones(G))
    planner.update("near_one", np.full(G, 1.0) - 1e-9)  # within saturation_tol
    planner.update("mixed", np.array([0, 1, 0, 1, 1, 0, 0, 1], float))
    planner.update("graded", rng.integers(0, 3, G) / 2)
    ids = ["all_zero", "all_one", "near_one", "mixed", "graded", "unseen"]
    for _ in range(5):
        plan = planner.plan(ids, budget_s=1000.0, cost_s=1.0)
        assert plan["all_zero"] == plan["all_one"] == plan["near_one"] == G
        assert plan["mixed"] > G and plan["graded"] > G and plan["unseen"] > G
        assert set(planner.last_plan["saturated"]) == {"all_zero", "all_one", "near_one"}
    assert planner.is_saturated("all_one") and not planner.is_saturated("mixed")
    # A later observation with contrast lifts the verdict.
    planner.update("all_one", np.array([1, 1, 1, 0, 1, 1, 1, 1], float))
    assert not planner.is_saturated("all_one")
    assert planner.plan(["all_one"], budget_s=1000.0, cost_s=1.0)["all_one"] > G


def test_saturated_prompt_is_rechecked_after_n_plans():
    cfg = PlannerConfig(group_size=G, recheck_after=3, recheck_prob=0.0, recheck_extra=5)
    planner = Planner(cfg)
    planner.update("sat", np.ones(G))
    planner.update("other", np.array([0, 1] * 4, float))
    got = [planner.plan(["sat", "other"], 100.0, 1.0)["sat"] for _ in range(7)]
    # Observed at plan 0; re-checked at plans 3 and 6 (recheck_extra seeds), nothing in between.
    assert got == [G, G, G + 5, G, G, G + 5, G]


def test_saturation_window_needs_repeated_evidence():
    planner = Planner(PlannerConfig(group_size=G, saturation_window=2, recheck_prob=0.0))
    planner.update("p", np.zeros(G))
    assert not planner.is_saturated("p")
    planner.update("p", np.zeros(12))
    assert planner.is_saturated("p")
    planner.update("p", np.ones(12))  # all-1 after all-0: the window spans 0 and 1 -> not saturated
    assert not planner.is_saturated("p")


@pytest.mark.parametrize("algorithm", ALGS)
def test_budget_never_exceeded(algorithm):
    cfg = PlannerConfig(group_size=G, algorithm=algorithm, max_extra_per_prompt=12, min_extra=1,
                        recheck_prob=0.3, recheck_after=2)
    planner = Planner(cfg)
    rng = np.random.default_rng(1)
    probs = {i: float(p) for i, p in enumerate(rng.choice([0.0, 1.0, 0.1, 0.5, 0.9], size=30))}
    for _ in range(25):
        ids = [int(i) for i in rng.choice(30, size=int(rng.integers(0, 12)), replace=False)]
        costs = {pid: float(rng.choice([0.1, 0.3, 1.0 / 3.0, 0.7, 2.5])) for pid in ids}
        budget = float(rng.choice([0.0, 0.05, 0.3, 1.0, 2.2, 7.7, 1e3]))
        plan = planner.plan(ids, budget, costs)
        assert list(plan) == ids
        assert all(G <= n <= G + cfg.max_extra_per_prompt for n in plan.values())
        spent = _spent(plan, costs)
        assert spent <= budget
        assert planner.last_plan["spent_s"] == pytest.approx(spent)
        if budget >= 1e3:  # ample budget: the uniform baseline fills every prompt to the cap
            if algorithm == "uniform":
                assert all(n == G + cfg.max_extra_per_prompt for n in plan.values())
        for pid, n in plan.items():
            planner.update(pid, _mixed(rng, n, probs[pid]))


@pytest.mark.parametrize("algorithm", ALGS)
def test_zero_budget_gives_zero_extra(algorithm):
    cfg = PlannerConfig(group_size=G, algorithm=algorithm, min_extra=3, recheck_after=1,
                        recheck_prob=1.0)
    planner = Planner(cfg)
    planner.update("a", np.ones(G))
    planner.update("b", np.array([0, 1] * 4, float))
    for _ in range(3):
        plan = planner.plan(["a", "b", "c"], budget_s=0.0, cost_s={"a": 1.0, "b": 2.0, "c": 0.5})
        assert plan == {"a": G, "b": G, "c": G}
        assert planner.last_plan["spent_s"] == 0.0


def test_uniform_spreads_evenly_and_greedy_prefers_cheap_and_informative():
    uni = Planner(PlannerConfig(group_size=G, algorithm="uniform"))
    plan = uni.plan(list(range(5)), budget_s=13.0, cost_s=1.0)
    extras = sorted(n - G for n in plan.values())
    assert sum(extras) == 13 and extras[-1] - extras[0] <= 1
    # Same history, one prompt twice as expensive: UCB gives the cheap one at least as many seeds.
    ucb = Planner(PlannerConfig(group_size=G, algorithm="ucb"))
    pool = np.array([0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0], float)
    for pid in ("cheap", "dear"):
        ucb.update(pid, pool)
    plan = ucb.plan(["cheap", "dear"], budget_s=12.0, cost_s={"cheap": 1.0, "dear": 2.0})
    assert plan["cheap"] > plan["dear"]
    # A rare-contrast prompt (1 success in 16) gains more from extra seeds than a balanced one.
    ucb2 = Planner(PlannerConfig(group_size=G, algorithm="ucb", exploration_coef=0.0))
    ucb2.update("rare", np.array([1] + [0] * 15, float))
    ucb2.update("balanced", np.array([0, 1] * 8, float))
    plan = ucb2.plan(["rare", "balanced"], budget_s=8.0, cost_s=1.0)
    assert plan["rare"] > plan["balanced"]


def test_gain_curve_estimates_exact_bernoulli_gains():
    rng = np.random.default_rng(2)
    for p in (0.1, 0.5):
        pool = (rng.random(4000) < p).astype(float)
        est = gain_curve(pool, G, 12, n_resamples=1000, rng=rng)
        exact = bernoulli_gain_curve(p, G, 12)
        np.testing.assert_allclose(est, exact, atol=1.5e-3)
        assert np.all(est >= 0) and np.all(np.diff(est) <= 0)
    assert np.all(gain_curve(np.ones(G), G, 12, 32, rng) == 0)


def _drive(planner, rng, steps, ids_pool):
    log = []
    for _ in range(steps):
        ids = list(rng.choice(len(ids_pool), size=4, replace=False))
        ids = [ids_pool[i] for i in ids]
        costs = {pid: float(rng.choice([0.5, 1.0, 1.5])) for pid in ids}
        plan = planner.plan(ids, budget_s=float(rng.choice([0.0, 6.0, 17.5])), cost_s=costs)
        log.append(plan)
        for pid, n in plan.items():
            p = 0.0 if str(pid).startswith("s") else 0.15 if pid in (3, "r") else 0.5
            planner.update(pid, (rng.random(n) < p).astype(float))
    return log


@pytest.mark.parametrize("algorithm", ALGS)
def test_state_round_trips_exactly_through_json(algorithm):
    cfg = PlannerConfig(group_size=G, algorithm=algorithm, max_extra_per_prompt=10, window=5,
                        recheck_prob=0.2, recheck_after=3, seed=11)
    ids_pool = [0, 1, 2, 3, "a", "b", "r", "s0", "s1"]  # int ids must stay ints
    key_fn = lambda pid: "sat" if str(pid).startswith("s") else pid  # noqa: E731
    a = Planner(cfg, key_fn=key_fn)
    _drive(a, np.random.default_rng(3), 12, ids_pool)
    sd = a.state_dict()
    text = json.dumps(sd)
    b = Planner(cfg, key_fn=key_fn)
    b.load_state_dict(json.loads(text))
    assert b.state_dict() == sd and json.dumps(b.state_dict()) == text
    assert json.loads(text) == sd  # the state is plain data: nothing lost or retyped by JSON
    # Same future inputs -> identical decisions and identical states (RNG included).
    assert _drive(a, np.random.default_rng(4), 10, ids_pool) == _drive(
        b, np.random.default_rng(4), 10, ids_pool)
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())
    # state_dict is a snapshot, not a view of live state.
    assert a.state_dict() != sd


def test_load_state_checks_config():
    a = Planner(PlannerConfig(group_size=G, algorithm="ucb"))
    a.update("x", np.array([0, 1] * 4, float))
    sd = json.loads(json.dumps(a.state_dict()))
    with pytest.raises(ValueError, match="algorithm"):
        Planner(PlannerConfig(group_size=G, algorithm="thompson")).load_state_dict(sd)
    Planner(PlannerConfig(group_size=G, algorithm="thompson")).load_state_dict(sd, strict=False)
    with pytest.raises(ValueError, match="group_size"):
        Planner(PlannerConfig(group_size=4)).load_state_dict(sd, strict=False)


def test_input_validation():
    planner = Planner(PlannerConfig(group_size=G))
    with pytest.raises(ValueError, match="duplicate"):
        planner.plan(["a", "a"], 1.0, 1.0)
    with pytest.raises(ValueError, match="budget_s"):
        planner.plan(["a"], -1.0, 1.0)
    with pytest.raises(ValueError, match="cost_s"):
        planner.plan(["a"], 1.0, {"a": 0.0})
    with pytest.raises(TypeError):
        planner.plan([("a", 1)], 1.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        planner.update("a", [0.0, float("nan")])
    with pytest.raises(ValueError, match="algorithm"):
        PlannerConfig(algorithm="greedy")
    with pytest.raises(ValueError, match="min_extra"):
        PlannerConfig(min_extra=5, max_extra_per_prompt=4)


def test_bandit_beats_uniform_on_synthetic_mix():
    # 40% saturated prompts (p = 0 or 1), 30% p ~ 0.5, 30% rare contrast (p near 0 or 1); equal
    # budget of 8 extra rollouts per prompt. Common random numbers make the comparison paired.
    # Measured on seeds 0..19 (this config): UCB beat uniform on every seed (+0.0021..+0.0111, mean
    # +0.0058; every block of 4 seeds >= +0.0040), while uniform itself gains +0.030
    # over no exploration. Thompson: mean +0.0036 but worse than uniform on 3 of 20 seeds (its
    # 4-seed means range +0.0004..), so it is only required not to lose on average.
    kw = dict(n_prompts=32, batch_size=8, iterations=20)
    seeds = range(4)
    res = {a: np.array([np.mean(simulate(a, seed=s, **kw).selected_var) for s in seeds])
           for a in ("uniform", "ucb", "thompson")}
    assert np.all(res["ucb"] > res["uniform"])
    assert np.mean(res["ucb"] - res["uniform"]) > 0.003
    assert np.mean(res["thompson"] - res["uniform"]) > 0.0
    one = simulate("ucb", seed=0, **kw)
    assert np.mean(one.selected_var) == res["ucb"][0]  # deterministic
    assert all(e <= 8 * 8 for e in one.extra_rollouts)


def test_expected_gain_is_the_best_allocation_of_posterior_means_and_changes_nothing():
    """expected_gain against brute force: every allocation of extras within the budget (equal
    costs), the largest sum of the arms' posterior-mean marginal gains; no state changes."""
    import itertools
    rng = np.random.default_rng(3)
    pl = Planner(PlannerConfig(group_size=4, max_extra_per_prompt=4, seed=1))
    assert pl.expected_gain([0, 1], 10.0, 1.0) == 0.0        # nothing observed yet
    for it in range(3):
        pl.plan([0, 1, 2, 3], 0.0, 1.0)
        pl.update(0, rng.random(8))                          # high-variance pools
        pl.update(1, (np.arange(8) < it + 1).astype(float))  # mostly equal
        pl.update(2, np.ones(8))                             # saturated: worth nothing
    before = json.dumps(pl.state_dict())
    prior = pl._prior()
    means = {p: np.zeros(4) if pl.is_saturated(p) else
             np.maximum(pl.arm_posterior(p, prior)[0], 0.0) for p in range(4)}
    assert pl.is_saturated(2) and not pl.is_saturated(0) and means[3][0] > 0
    assert all(np.all(np.diff(m) <= 1e-12) for m in means.values())   # concave: greedy optimal
    prompts = [0, 1, 2, 3]
    for budget in (0.0, 1.0, 3.0, 5.5, 9.0, 40.0):
        best = max(sum(float(np.sum(means[p][:e])) for p, e in zip(prompts, alloc))
                   for alloc in itertools.product(range(5), repeat=4)
                   if sum(alloc) <= budget)
        assert pl.expected_gain(prompts, budget, 1.0) == pytest.approx(best, rel=1e-12,
                                                                       abs=1e-15)
    assert json.dumps(pl.state_dict()) == before
    assert pl.expected_gain(prompts, 4.0, 1.0) <= pl.expected_gain(prompts, 8.0, 1.0)


def test_base_variance_is_the_discounted_mean_of_the_base_seeds_variance():
    pl = Planner(PlannerConfig(group_size=3, max_extra_per_prompt=2, discount=0.5, seed=0))
    assert pl.base_variance([0]) is None
    pools = {0: [[0.0, 1.0, 0.0, 5.0], [1.0, 1.0, 0.0, 9.0]], 1: [[0.2, 0.4, 0.9]]}
    pl.plan([0, 1], 0.0, 1.0)
    pl.update(0, pools[0][0])
    pl.update(1, pools[1][0])
    pl.plan([0, 1], 0.0, 1.0)
    pl.update(0, pools[0][1])
    v = lambda r: float(np.var(r[:3]))                                  # noqa: E731
    # prompt 0: observations one plan apart, weights 0.5 and 1
    want0 = (0.5 * v(pools[0][0]) + 1.0 * v(pools[0][1])) / 1.5
    assert pl.base_variance([0]) == pytest.approx(want0, rel=1e-12)
    want1 = v(pools[1][0])
    assert pl.base_variance([0, 1]) == pytest.approx((want0 + want1) / 2, rel=1e-12)
    # a prompt never seen: the mean over every observation
    every = (0.5 * v(pools[0][0]) + 0.5 * want1 + 1.0 * v(pools[0][1])) / 2.0
    assert pl.base_variance([7]) == pytest.approx(every, rel=1e-12)
