"""Mean and spread of held-out curves over runs (python -m spotlight_jax.tools.seed_curves)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spotlight_jax.reporting import plots

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args):
    """``python -m spotlight_jax.tools.seed_curves ARGS`` (its flags are defined only there)."""
    return subprocess.run([sys.executable, "-m", "spotlight_jax.tools.seed_curves",
                           *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _run(path, points):
    os.makedirs(path)
    with open(os.path.join(path, "rl.jsonl"), "w") as f:
        for step, v in points:
            f.write(json.dumps({"step": step, "val_reward": v, "reward_mean": 0.1}) + "\n")
            f.write(json.dumps({"step": step + 1, "reward_mean": 0.2}) + "\n")


def test_seed_curves_use_common_evaluations_and_plot(tmp_path):
    _run(tmp_path / "a", [(0, 0.5), (10, 0.6), (20, 0.7)])
    _run(tmp_path / "b", [(0, 0.4), (10, 0.8)])
    c = plots.seed_curves([tmp_path / "a", tmp_path / "b"])
    assert c["x"] == [0, 10]
    np.testing.assert_allclose(c["mean"], [0.45, 0.7])
    np.testing.assert_allclose(c["lo"], [0.4, 0.6])
    np.testing.assert_allclose(c["hi"], [0.5, 0.8])
    proc = _cli(tmp_path / "a", tmp_path / "b", "--out", tmp_path / "c.png")
    assert proc.returncode == 0, proc.stderr
    assert "| held-out reward | 10 | 0.700 | 0.600 | 0.800 |" in proc.stdout
    assert os.path.getsize(tmp_path / "c.png") > 0
    # named groups in one plot, and another metric
    proc = _cli("--group", f"base={tmp_path / 'a'}", "--group", f"other={tmp_path / 'b'}",
                "--key", "reward_mean", "--out", tmp_path / "g.png")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| base | 1 | 0.200 | 0.200 | 0.200 |" in out and "| other | 11 | 0.200" in out
    assert "| base | 0 | 0.100 |" in out
    # a group without run directories: a usage error (SystemExit, non-zero status)
    proc = _cli("--group", "lonely", "--out", tmp_path / "x.png")
    assert proc.returncode != 0 and "names no run directory" in proc.stderr
    with pytest.raises(ValueError, match="names no run directory"):
        plots.parse_groups([], ["lonely"], "held-out reward")
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="no 'val_reward'"):
        plots.seed_curves([tmp_path / "empty"])


def test_alive_series_and_spot_timeline(tmp_path):
    from spotlight_jax.emulation.traces import Replay, SpotEvent
    r = Replay(nodes=("spot0", "spot1"), initial_alive=("spot0",), duration_s=100.0, events=(
        SpotEvent(10.0, "join", "spot1"),
        SpotEvent(20.0, "notice", "spot0", deadline=30.0),
        SpotEvent(30.0, "loss", "spot0"),
        SpotEvent(35.0, "loss", "spot0", abrupt=True),   # already down: no change
        SpotEvent(50.0, "loss", "spot1", abrupt=True),
        SpotEvent(90.0, "join", "spot0"),
    ))
    t, a = plots.alive_series(r, devices_per_node=2, until_s=60.0)
    np.testing.assert_array_equal(t, [0, 10, 30, 50, 60])
    np.testing.assert_array_equal(a, [2, 4, 2, 0, 0])
    t, a = plots.alive_series(r, devices_per_node=2)
    assert t[-1] == 90.0 and a[-1] == 2
    history = [{"step": 1, "vtime_s": 25.0, "spot_util": 0.5, "regroups": 1},
               {"step": 2, "vtime_s": 55.0, "spot_util": 0.4, "regroups": 3}]
    plots.spot_timeline(str(tmp_path / "t.png"), r, 2, history)
    assert os.path.getsize(tmp_path / "t.png") > 0


def test_sample_grid_writes_each_prompt_under_its_image(tmp_path):
    from PIL import Image

    from spotlight_jax.reporting.plots import save_grid
    imgs = np.zeros((3, 8, 8, 3), np.float32)
    save_grid(str(tmp_path / "plain.png"), imgs, cols=3, scale=4)
    save_grid(str(tmp_path / "cap.png"), imgs, cols=3, scale=4,
              captions=["a red bar", "two blue squares on the left of a green triangle", "x"])
    plain = np.asarray(Image.open(tmp_path / "plain.png"))
    cap = np.asarray(Image.open(tmp_path / "cap.png"))
    assert cap.shape[0] > plain.shape[0] and cap.shape[1] >= 3 * 32
    strip = cap[32:]                                     # below the (black) images: text
    assert (strip < 128).any() and (strip > 128).any()
    with pytest.raises(ValueError, match="2 captions for 3 images"):
        save_grid(str(tmp_path / "bad.png"), imgs, captions=["a", "b"])


def _brute_moving_average(y, window):
    return [sum(y[max(0, i - window + 1):i + 1]) / len(y[max(0, i - window + 1):i + 1])
            for i in range(len(y))]


def test_moving_average_is_the_trailing_mean_of_the_points_so_far():
    # by hand: the first window - 1 points average what there is so far
    np.testing.assert_allclose(plots.moving_average([1, 2, 3, 4, 5], 3), [1, 1.5, 2, 3, 4])
    np.testing.assert_allclose(plots.moving_average([4.0, 0.0], 10), [4, 2])
    np.testing.assert_allclose(plots.moving_average([0.5, 0.7, 0.6], 1), [0.5, 0.7, 0.6])
    assert plots.moving_average([], 10).shape == (0,)
    y = list(np.random.default_rng(0).uniform(0.46, 0.80, 57))
    for window in (1, 2, 3, 10, 56, 57, 100):
        np.testing.assert_allclose(plots.moving_average(y, window),
                                   _brute_moving_average(y, window), rtol=1e-12)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="window"):
            plots.moving_average(y, bad)


def test_smoothed_series_draws_raw_points_faint_and_the_average_bold(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)      # keep the figure to look at its lines
    x = list(range(30))
    y = list(np.random.default_rng(1).uniform(0.46, 0.80, 30))
    plots.plot_curves(str(tmp_path / "r.png"), {"held-out (ODE)": ([0, 10, 20], [0.6, 0.65, 0.7]),
                                                "train": (x, y)}, smooth={"train": 10})
    assert os.path.getsize(tmp_path / "r.png") > 0
    ax = figs[0].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"held-out (ODE)", "train, per iteration",
                          "train, 10-iteration moving average"}
    raw, avg = lines["train, per iteration"], lines["train, 10-iteration moving average"]
    np.testing.assert_allclose(avg.get_ydata(), _brute_moving_average(y, 10))
    np.testing.assert_allclose(raw.get_ydata(), y)
    assert avg.get_linewidth() > raw.get_linewidth() and raw.get_alpha() < 1
    assert avg.get_color() == raw.get_color()
    np.testing.assert_allclose(lines["held-out (ODE)"].get_ydata(), [0.6, 0.65, 0.7])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "held-out (ODE)", "train, per iteration", "train, 10-iteration moving average"]
    monkeypatch.undo()
    plt.close(figs[0])
