"""Mean and spread of held-out curves over runs (python -m spotlight_jax.plots)."""
import json
import os

import numpy as np
import pytest

from spotlight_jax import plots


def _run(path, points):
    os.makedirs(path)
    with open(os.path.join(path, "rl.jsonl"), "w") as f:
        for step, v in points:
            f.write(json.dumps({"step": step, "val_reward": v, "reward_mean": 0.1}) + "\n")
            f.write(json.dumps({"step": step + 1, "reward_mean": 0.2}) + "\n")


def test_seed_curves_use_common_evaluations_and_plot(tmp_path, capsys):
    _run(tmp_path / "a", [(0, 0.5), (10, 0.6), (20, 0.7)])
    _run(tmp_path / "b", [(0, 0.4), (10, 0.8)])
    c = plots.seed_curves([tmp_path / "a", tmp_path / "b"])
    assert c["x"] == [0, 10]
    np.testing.assert_allclose(c["mean"], [0.45, 0.7])
    np.testing.assert_allclose(c["lo"], [0.4, 0.6])
    np.testing.assert_allclose(c["hi"], [0.5, 0.8])
    plots.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c.png")])
    assert "| 10 | 0.700 | 0.600 | 0.800 |" in capsys.readouterr().out
    assert os.path.getsize(tmp_path / "c.png") > 0
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="no 'val_reward'"):
        plots.seed_curves([tmp_path / "empty"])
