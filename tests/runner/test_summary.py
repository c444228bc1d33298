"""The end-of-run summary names the before/after reward and where the outputs are."""
import pathlib
import runpy

import numpy as np
import pytest

from spotlight_jax.config import RunSpec
from spotlight_jax.runner.summary import summary

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_summary_reports_reward_change_and_paths(tmp_path):
    c = runpy.run_path(str(ROOT / "configs" / "tiny.py"))["get_config"]()
    history = [{"iteration": 0, "val_reward": 0.5, "val_reward_ci95": 0.03, "val_acc_count": 0.7,
                "val_missing_count": 0.25},
               {"iteration": 3, "reward_mean": 0.4, "vtime_s": 7200.0, "dollars": 31.5,
                "spot_util": 0.5, "preemptions": 2, "val_reward": 0.6, "val_reward_ci95": 0.03,
                "val_acc_count": 0.8, "val_missing_count": 0.125}]
    text = summary(RunSpec.from_config(c), str(tmp_path), history, "base")
    assert "0.500 -> 0.600" in text and "count" in text and "0.70 -> 0.80" in text
    assert "0.250 -> 0.125" in text            # the constraint's share of the missing reward
    assert "2.00 h" in text and "$31.50" in text and str(tmp_path / "rl.jsonl") in text


def test_gain_line_says_whether_the_gain_is_beyond_the_interval():
    from spotlight_jax.runner.summary import gain_line
    a = {"val_reward": 0.60, "val_reward_ci95": 0.03}
    assert gain_line(a, {"val_reward": 0.70, "val_reward_ci95": 0.04}) == (
        "gain +0.100: beyond the 95% interval of the difference (±0.050)")
    assert gain_line(a, {"val_reward": 0.63, "val_reward_ci95": 0.04}).startswith(
        "gain +0.030: inside")


def test_summary_states_the_phases_median_throughput(tmp_path):
    c = runpy.run_path(str(ROOT / "configs" / "tiny.py"))["get_config"]()
    rows = [{"iteration": i, "train_images_per_s": u, "rollout_images_per_s": r,
             "rollout_tokens_per_s": t}
            for i, (u, r, t) in enumerate([(10.0, 50.0, 8e4), (30.0, 70.0, 1e5), (20.0, 60.0,
                                                                                 9e4)], 1)]
    rows[1].pop("rollout_images_per_s"), rows[1].pop("rollout_tokens_per_s")   # a ready batch
    text = summary(RunSpec.from_config(c), str(tmp_path), rows, "base")
    assert "update 20.0 images/s, rollouts 55.0 images/s (85,000 transformer tokens/s)" in text


def test_summary_states_the_worst_log_prob_gap_and_the_mfu(tmp_path):
    c = runpy.run_path(str(ROOT / "configs" / "tiny.py"))["get_config"]()
    rows = [{"iteration": 1, "train_images_per_s": 5.0, "train_tflops": 0.5, "train_mfu": 0.25,
             "rollout_logp_gap_by_step": {"2": 1e-7, "5": 3e-7}, "first_ratio_dev": 0.0},
            {"iteration": 2, "train_images_per_s": 5.0, "train_tflops": 0.7, "train_mfu": 0.35,
             "rollout_logp_gap_by_step": {"1": 2e-7}, "first_ratio_dev": 1e-8}]
    text = summary(RunSpec.from_config(c), str(tmp_path), rows, "base")
    assert "update 5.0 images/s (0.6 model TFLOP/s, MFU 30.0%)" in text
    assert "max 3e-07 (sampler step 5); first inner step's |ratio - 1| max 1e-08" in text


def test_the_paired_gain_is_the_mean_difference_with_its_t_interval():
    """Against a brute-force t-interval (scipy's) of the per-sample differences; a paired gain
    can be beyond its interval where the unpaired comparison of the two means is not."""
    from scipy import stats

    from spotlight_jax.evaluate import paired_gain
    from spotlight_jax.runner.summary import gain_line, paired_gain_line

    rng = np.random.default_rng(0)
    before = rng.uniform(0, 1, 400)
    after = np.clip(before + rng.normal(0.03, 0.1, 400), 0, 1)
    got = paired_gain(after, before)
    d = after - before
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert got["gain_paired"] == pytest.approx(d.mean())
    assert got["gain_paired_ci95"] == pytest.approx((hi - lo) / 2)
    a = {"val_reward": before.mean(), "val_reward_ci95": 1.96 * before.std(ddof=1) / 20}
    b = {"val_reward": after.mean(), "val_reward_ci95": 1.96 * after.std(ddof=1) / 20,
         **{f"val_{k}": v for k, v in got.items()}}
    assert "inside" in gain_line(a, b)
    assert paired_gain_line(b).startswith("paired gain (same prompts and seeds) +0.0")
    assert "beyond its 95% interval" in paired_gain_line(b)
    with pytest.raises(ValueError, match="the same samples"):
        paired_gain(after, before[:10])


def test_a_video_runs_summary_tables_the_rewards_parts(tmp_path):
    c = runpy.run_path(str(ROOT / "configs" / "tiny_video.py"))["get_config"]()
    parts = dict(count=(0.5, 0.6), shape=(0.12, 0.2), motion=(0.1, 0.15),
                 persistence=(0.4, 0.55))
    rows = [{"iteration": it, "val_reward": 0.3 + j * 0.05, "val_reward_ci95": 0.04,
             "val_exact": (0.01, 0.03)[j], **{f"val_part_{k}": v[j] for k, v in parts.items()}}
            for j, it in enumerate((0, 60))]
    text = summary(RunSpec.from_config(c), str(tmp_path), rows, "base")
    for k, (a, b) in parts.items():
        assert f"  {k:<16}  {a:.2f} -> {b:.2f}" in text
    assert "exact (all four)  0.01 -> 0.03" in text
