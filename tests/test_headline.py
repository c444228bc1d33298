"""The headline report's measures against closed forms: interpolated crossings, the curve-level
speed-up of a curve replayed at twice the speed, censored seeds as bounds, and the bootstrap."""
import numpy as np
import pytest

from spotlight_jax.reporting import headline


def curve(rewards, s_per_eval=100.0, dollars_per_eval=2.0):
    return [{"iteration": 5 * i, "val_reward": r, "vtime_s": i * s_per_eval,
             "dollars": i * dollars_per_eval} for i, r in enumerate(rewards)]


def test_a_crossing_is_interpolated_between_the_evaluations_around_it():
    h = curve([0.50, 0.55, 0.70, 0.65])
    assert headline.crossing(h, 0.60) == pytest.approx(100 + 100 / 3)
    assert headline.crossing(h, 0.60, "dollars") == pytest.approx(2 + 2 / 3)
    assert headline.crossing(h, 0.50) == 0.0 and headline.crossing(h, 0.71) is None


def test_the_same_curve_twice_as_fast_is_a_2x_curve_level_speed_up():
    rewards = [0.50, 0.52, 0.57, 0.61, 0.66, 0.70]
    base, fast = curve(rewards, 100.0), curve(rewards, 50.0)
    assert headline.curve_speedup(base, fast) == pytest.approx(2.0)
    # only the shared range counts: a mode that stops at 0.61 is still 2x there
    assert headline.curve_speedup(base, fast[:4]) == pytest.approx(2.0)
    assert headline.curve_speedup(base, curve([0.50, 0.49])) is None


def test_censored_seeds_are_bounds_and_the_interval_comes_from_the_seeds():
    base = curve([0.50, 0.52, 0.54, 0.56, 0.57], 100.0)        # +0.08 never reached
    fast = curve([0.50, 0.56, 0.60, 0.64], 100.0)
    # +0.08 = 0.58: the mode crosses at 150 s, baseline's whole run (400 s) bounds it
    assert headline.seed_ratio(base, fast, 0.08, "vtime_s") == {
        "at_least": pytest.approx(400 / 150)}
    assert headline.seed_ratio(base, fast, 0.06, "vtime_s") == {"value": pytest.approx(3.0)}
    # the other way round: only baseline reaches it, the mode's whole run bounds the ratio
    assert headline.seed_ratio(fast, base, 0.08, "vtime_s") == {
        "at_most": pytest.approx(150 / 400)}
    assert headline.seed_ratio(base, base[:2], 0.08, "vtime_s") == {}
    row = headline.summarise([{"value": 2.0}, {"value": 3.0}, {"at_least": 2.5}, {}])
    assert row["decided"] == 2 and row["seeds"] == 4 and row["mean"] == 2.5
    assert 2.0 <= row["low"] <= row["mean"] <= row["high"] <= 3.0
    assert row["mean_censored_at_bound"] == pytest.approx(2.5)
    text = headline.cell(row)
    assert text.startswith("2.50x [") and "(2/4; seeds 2.00-3.00x)" in text
    assert "censored: > 2.50x" in text


def test_a_crossing_by_evaluation_is_the_first_evaluation_at_or_above_the_target():
    h = curve([0.50, 0.55, 0.70, 0.65])
    assert headline.crossing(h, 0.60, interpolate=False) == 200.0
    assert headline.crossing(h, 0.60, "dollars", interpolate=False) == 4.0
    assert headline.crossing(h, 0.71, interpolate=False) is None
    base, fast = curve([0.50, 0.54, 0.58], 100.0), curve([0.50, 0.57, 0.59], 60.0)
    # by evaluation: 200 s against 120 s; interpolated: 200 s against 60 + 60 / 2 s
    assert headline.seed_ratio(base, fast, 0.08, "vtime_s", interpolate=False) == {
        "value": pytest.approx(200 / 120)}
    assert headline.seed_ratio(base, fast, 0.08, "vtime_s") == {"value": pytest.approx(200 / 90)}


def test_the_t_interval_is_students_and_wider_than_the_bootstrap_on_five_seeds():
    x = [2.08, 2.5, 2.7, 2.9, 3.57]
    low, high = headline.t_interval(x)
    half = 2.7764451051977934 * np.std(x, ddof=1) / np.sqrt(5)     # t(0.975, 4)
    assert (low, high) == (pytest.approx(np.mean(x) - half), pytest.approx(np.mean(x) + half))
    _, b_low, b_high = headline.bootstrap_mean(x)
    assert low < b_low and high > b_high
    assert headline.t_interval([3.0]) is None
    row = headline.summarise([{"value": v} for v in x])
    assert (row["t_low"], row["t_high"]) == (low, high)
    assert f"t [{low:.2f}, {high:.2f}]" in headline.cell(row)


def test_a_mode_is_set_against_each_reference_the_grid_has(tmp_path):
    from spotlight_jax import registry
    assert set(headline.REFERENCES) <= set(registry.mode_names())
    base = curve([0.50, 0.54, 0.58], 100.0)              # on-demand only: 200 s to +0.08
    same_hw = curve([0.50, 0.54, 0.58], 80.0)            # the same curve, faster iterations
    fast = curve([0.50, 0.58], 60.0)
    runs = {"aws": {0: {"baseline": base, "spot_rollout": same_hw, "spotlight": fast}}}
    rows = headline.trace_rows(runs["aws"], "spotlight", reference="spot_rollout")
    assert rows["time to +0.08"]["mean"] == pytest.approx(160 / 60)
    text = open(headline.write_headline(str(tmp_path), runs,
                                        ["baseline", "spot_rollout", "spotlight"])).read()
    assert "## aws: against `baseline`" in text and "## aws: against `spot_rollout`" in text
    against_same_hw = text.split("against `spot_rollout`")[1]
    assert "| measure | spotlight |" in against_same_hw       # not set against itself
    for gain in ("0.06", "0.07", "0.08", "0.09"):
        assert f"| time to +{gain} |" in text
    assert text.index("| curve-level speed-up |") < text.index("| time to +0.06 |")


def test_bootstrap_of_the_mean():
    mean, low, high = headline.bootstrap_mean([1.0, 1.0, 1.0])
    assert (mean, low, high) == (1.0, 1.0, 1.0)
    x = np.random.default_rng(1).normal(3.0, 0.5, 50)
    mean, low, high = headline.bootstrap_mean(x)
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert mean == pytest.approx(x.mean())
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.15)       # normal theory


def test_the_time_ratio_splits_into_iterations_and_seconds_per_iteration(tmp_path):
    # baseline: +0.08 at iteration 10 after 200 s (20 s an iteration); the mode: at iteration 5
    # after 60 s (12 s an iteration) -> 3.33x = 2x the iterations x 1.67x per iteration
    base, fast = curve([0.50, 0.54, 0.58], 100.0), curve([0.50, 0.58], 60.0)
    assert headline.seed_ratio(base, fast, 0.08, "iteration") == {"value": pytest.approx(2.0)}
    assert headline.per_iteration_ratio(base, fast, 0.08) == {"value": pytest.approx(20 / 12)}
    assert headline.crossing(base, 0.56, "iteration") == pytest.approx(7.5)   # interpolated
    assert headline.per_iteration_ratio(base, curve([0.50, 0.52]), 0.08) == {}
    gains = (0.06, 0.07, 0.08)
    rows = headline.trace_rows({0: {"baseline": base, "spotlight": fast}}, "spotlight", gains)
    assert rows["iterations to +0.08"]["mean"] == pytest.approx(2.0)
    assert rows["s per iteration to +0.08"]["mean"] == pytest.approx(20 / 12)
    assert (rows["iterations to +0.08"]["mean"] * rows["s per iteration to +0.08"]["mean"]
            == pytest.approx(rows["time to +0.08"]["mean"]))
    said = headline.bound(rows, 0.08)
    assert "2.00x x 1.67x" in said and "3x needs 1.80x the iteration ratio" in said
    assert "or 1.50x per iteration" in said
    # the written report states the split and shows every seed's curve
    path = headline.write_headline(str(tmp_path), {"aws": {0: {"baseline": base,
                                                               "spotlight": fast}}},
                                   ["baseline", "spotlight"], gains)
    text = open(path).read()
    assert f"What bounds `spotlight` against `baseline`: {said}." in text
    assert "(headline.png)" in text
    assert open(tmp_path / "headline.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
