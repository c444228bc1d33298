"""studies.objectives reads runs' rl.jsonl into curves, tables and a plot (no training here)."""
import json

import numpy as np
import pytest

from spotlight_jax.studies import objectives


def _run(path, points, s_per_it):
    path.mkdir()
    with open(path / "rl.jsonl", "w") as f:
        for it, minutes, reward in points:
            row = {"step": it, "rl_time_s": 60.0 * minutes, "val_reward": reward,
                   "val_reward_ci95": 0.02, "val_acc_text": reward / 2}
            if it:
                row.update(time_rollout=s_per_it / 2, time_train=s_per_it / 2)
            f.write(json.dumps(row) + "\n")
    return str(path)


def test_curves_interpolate_and_report_mean_gain_per_objective(tmp_path):
    a = objectives.curve(_run(tmp_path / "a", [(0, 0, 0.6), (10, 5, 0.7), (20, 10, 0.8)], 2.0),
                         64)
    b = objectives.curve(_run(tmp_path / "b", [(0, 0, 0.6), (10, 10, 0.65)], 4.0), 64)
    assert a["images"] == [0, 640, 1280] and a["s_per_iteration"] == 2.0
    assert objectives.at(a, "minutes", 2.5) == pytest.approx(0.65)
    assert np.isnan(objectives.at(b, "minutes", 12.0))          # past the run's end
    text = objectives.report({"nft": {0: a}, "flow_grpo": {0: b}}, minutes=10.0)
    assert "+0.200" in text and "+0.050" in text and "text 0.30->0.40" in text
    objectives.plot({"nft": {0: a}, "flow_grpo": {0: b}}, str(tmp_path / "p.png"), 10.0)
    assert (tmp_path / "p.png").stat().st_size > 0
