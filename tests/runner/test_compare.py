"""The four-mode comparison: target, time/cost-to-target and ratios, report and plots."""
import json
import os

import pytest
from helpers import mode_config

from spotlight_jax.config import RunSpec
from spotlight_jax.reporting import compare_report
from spotlight_jax.runner import compare


def _hist(points, start=0.5):
    """points: (hours, dollars, reward) of evaluations after the start."""
    h = [{"iteration": 0, "vtime_s": 0.0, "dollars": 0.0, "val_reward": start}]
    for i, (hours, dollars, reward) in enumerate(points, 1):
        h.append({"iteration": i, "vtime_s": hours * 3600, "dollars": dollars,
                  "val_reward": reward, "reward_mean": reward, "spot_util": 0.5,
                  "explore_candidates": 10 * i, "preemptions": i})
    return h


def test_target_and_time_to_target_ratios(tmp_path):
    hist = {"baseline": _hist([(1, 10, 0.55), (2, 20, 0.60), (3, 30, 0.58)]),
            "spotlight": _hist([(0.25, 5, 0.59), (0.5, 8, 0.62)])}
    target = compare_report.target_reward(hist, 0.8)
    assert target == pytest.approx(0.5 + 0.8 * 0.1)   # best baseline gain is 0.1
    assert compare_report.first_reaching(hist["baseline"], target, "vtime_s") == 2 * 3600
    assert compare_report.first_reaching(hist["spotlight"], target, "dollars") == 5
    path = compare_report.write_report(str(tmp_path), hist, target_frac=0.8)
    text = open(path).read()
    # baseline: 2 h, $20 to target; spotlight: 0.25 h, $5 -> 8x faster, 4x cheaper
    assert "| spotlight | 2 | 0.500 → 0.620 (0.620) | 0.50 | 8.00 | 0.25 | 5.00 | 8.00x | 4.00x |" \
        in text
    assert "| baseline |" in text and "1.00x | 1.00x |" in text
    # which of the two gives the speed-up: 2 vs 1 iterations to the target (2x), and 1 h vs
    # 0.25 h per iteration (4x): 8x in all
    assert "| 8.00x | 4.00x | 1 | 2.00x | 4.00x |" in text
    assert "| 1.00x | 1.00x | 2 | 1.00x | 1.00x |" in text
    for f in ("reward_vs_time.png", "reward_vs_cost.png", "compare.json"):
        assert os.path.getsize(tmp_path / f) > 0


def test_the_report_says_where_a_shared_updates_rows_ran(tmp_path):
    shared = _hist([(0.25, 5, 0.59), (0.5, 8, 0.62)])
    for h, split in zip(shared[1:], (0.25, 0.75)):
        h.update(update_s=15.0, update_trainer_s=24.0, update_shards=8, update_shards_spot=3,
                 update_split=split)
    hist = {"baseline": _hist([(1, 10, 0.55), (2, 20, 0.60)]), "spotlight_pipelined": shared}
    text = open(compare_report.write_report(str(tmp_path), hist, target_frac=0.8)).read()
    assert "## The shared update" in text
    # windows 2 x 15 s against 2 x 24 s alone, the mean split, 6 of 16 shards on spot groups
    assert "| spotlight_pipelined | 30 | 48 | 0.50 | 6 of 16 (38%) |" in text
    assert "| baseline | 0 |" not in text.split("## The shared update")[1]


def test_no_target_when_the_baseline_does_not_improve(tmp_path):
    hist = {"baseline": _hist([(1, 10, 0.45)]), "spotlight": _hist([(1, 5, 0.6)])}
    assert compare_report.target_reward(hist, 0.8) is None
    text = open(compare_report.write_report(str(tmp_path), hist, target_frac=0.8)).read()
    assert "No target" in text and "| spotlight | 1 |" in text
    with pytest.raises(ValueError, match="target_frac"):
        compare_report.target_reward(hist, 0.0)


def test_a_fixed_target_gain_over_the_baselines_start():
    hist = {"baseline": _hist([(1, 10, 0.52), (2, 20, 0.54)]),
            "spotlight": _hist([(0.5, 5, 0.59)])}
    assert compare_report.target_reward(hist, 0.8, gain=0.08) == pytest.approx(0.58)
    assert compare_report.first_reaching(hist["baseline"], 0.58, "vtime_s") is None
    assert compare_report.first_reaching(hist["spotlight"], 0.58, "iteration") == 1
    with pytest.raises(ValueError, match="target_gain"):
        compare_report.target_reward(hist, 0.8, gain=-0.1)


def test_a_target_only_one_run_reached_bounds_the_ratio(tmp_path):
    """baseline never reaches the target in its 2 h / $20 / 2 iterations, spotlight does at
    0.5 h / $5 / iteration 1: the ratios are at least 4x / 4x / 2x; the other way round, a
    mode that never reached it is at most baseline's to-target over its whole run."""
    hist = {"baseline": _hist([(1, 10, 0.52), (2, 20, 0.54)]),
            "spotlight": _hist([(0.5, 5, 0.59)]),
            "spot_rollout": _hist([(1, 4, 0.51)])}
    text = open(compare_report.write_report(str(tmp_path), hist, target_frac=1.0,
                                            target_gain=0.08)).read()
    # seconds per iteration are compared up to the target: baseline never reached it
    assert "| 0.50 | 5.00 | > 4.00x | > 4.00x | 1 | > 2.00x | — |" in text
    rows = json.loads((tmp_path / "compare.json").read_text())["modes"]
    assert compare_report.ratio_bound(rows["baseline"], rows["spotlight"], "cost_to_target") == \
        (">", 4.0)
    assert compare_report.ratio_bound(rows["baseline"], rows["spot_rollout"],
                                      "cost_to_target") is None
    reached = {**rows["baseline"], "cost_to_target": 8.0}       # baseline: $8 to target
    assert compare_report.ratio_bound(reached, rows["spot_rollout"], "cost_to_target") == ("<", 2.0)
    assert compare_report.ratio_bound(reached, rows["spotlight"], "cost_to_target") == ("=", 1.6)

def test_seed_report_gives_every_ratios_mean_and_spread(tmp_path):
    """Three config seeds' comparisons -> each ratio's mean [min, max] over the seeds where both
    the mode and baseline reached the target; a seed that missed it is counted out, not 0."""
    seeds = {0: [(1, 10, 0.60)], 1: [(2, 20, 0.60)], 2: [(4, 40, 0.60)]}
    spot = {0: [(0.25, 5, 0.59)], 1: [(1, 5, 0.59)], 2: [(4, 40, 0.50)]}   # seed 2: missed
    dirs = {}
    for s in seeds:
        dirs[s] = str(tmp_path / f"seed_{s}")
        os.makedirs(dirs[s])
        compare_report.write_report(dirs[s], {"baseline": _hist(seeds[s]),
                                              "spotlight": _hist(spot[s])},
                                    target_frac=0.8, target_gain=0.08)
    path = compare_report.write_seed_report(str(tmp_path), dirs)
    r = json.loads((tmp_path / "compare_seeds.json").read_text())["ratios"]["spotlight"]
    # baseline 1 h / $10 and 2 h / $20 against spotlight 0.25 h / $5 and 1 h / $5
    assert r["speed-up"]["by_seed"] == {"0": 4.0, "1": 2.0, "2": None}
    assert r["speed-up"]["mean"] == pytest.approx(3.0) and r["speed-up"]["n"] == 2
    assert (r["cost ratio"]["min"], r["cost ratio"]["max"]) == (2.0, 4.0)
    text = open(path).read()
    # seed 2: baseline reached it at 4 h, spotlight not in its whole 4 h: at most 1x
    assert r["speed-up"]["bounds"] == {"2": ["<", 1.0]}
    assert ("| spotlight | 3.00x [2.00, 4.00] (n=2/3); seed 2: < 1.00x | "
            "3.00x [2.00, 4.00] (n=2/3); seed 2: < 1.00x |") in text
    assert "| spotlight | 4.00x / 2.00x | 2.00x / 4.00x | < 1.00x / < 1.00x |" in text
    assert "[seed 2](seed_2/report.md)" in text
    os.remove(tmp_path / "seed_1" / "compare.json")
    with pytest.raises(ValueError, match="seed 1: cannot read .*compare.json"):
        compare_report.write_seed_report(str(tmp_path), dirs)



@pytest.mark.e2e
def test_compare_mode_runs_every_mode_from_the_command_path(tmp_path, base):  # noqa: F811
    from spotlight_jax import train

    graphdef, state = base
    c = mode_config("baseline", iterations=1)
    c.mode = "compare"
    c.rl.eval_every = 1
    trace = tmp_path / "trace.json"     # a SkyPilot-format trace replayed from its second tick
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [4, 2, 4]}))
    c.trace.path, c.trace.start_s = str(trace), 300.0
    path = compare.run_compare(RunSpec.from_config(c), str(tmp_path), graphdef, state,
                               progress=False)
    text = open(path).read()
    assert f"trace: {trace} from 300 s on" in text
    assert "(spot_timeline.png)" in text and os.path.getsize(tmp_path / "spot_timeline.png")
    for mode in compare.MODES:
        assert f"| {mode} | 1 |" in text
        with open(tmp_path / mode / "phases.json") as f:
            attention = json.load(f)["attention"]     # what the model computed with, and why
        assert attention["requested"] == "auto" and attention["kernel"] == "xla"
        assert "needs NVIDIA GPUs" in attention["not_cudnn"]
    assert "## Where the emulated time goes" in text and "## Assumptions" in text
    c.mode = "nonsense"
    with pytest.raises(ValueError, match="mode='nonsense': choose one of"):
        train.train_and_evaluate(c, str(tmp_path / "x"))
