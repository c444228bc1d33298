"""The accelerator check script runs end to end on CPU devices (so it cannot rot between GPU
loans): every measurement present and positive, the attention implementations agree, and the
train step really updates the weights. Among the e2e checks (~30 s of compiles)."""
import jax
import numpy as np
import pytest

from spotlight_jax.bench import device_check
from spotlight_jax.programs import TINY_CONFIG


@pytest.mark.e2e
def test_device_check_runs_on_cpu_devices():
    result = device_check.run(TINY_CONFIG, depth=1, latent=8, batch=2, repeats=1)
    assert result["backend"] == "cpu" and result["seq"] == 16 + 4
    assert result["forward_ms"] > 0 and result["train_step_ms"] > 0
    xla, cudnn = result["attention"]
    assert xla["implementation"] == "xla" and xla["max_abs_diff_vs_xla"] == 0.0
    assert cudnn == {"implementation": "cudnn", "skipped": "not a GPU backend"}
    assert len(jax.devices()) >= 2 and result["concurrent"]["concurrent_ms"] > 0
    text = device_check.table(result)
    assert all(line.count("|") == 3 for line in text.splitlines() if line.startswith("| "))


@pytest.mark.e2e
def test_train_step_moves_the_weights():
    cfg, graphdef, state = device_check.build(TINY_CONFIG, depth=1, latent=8)
    _, (fwd, train, carry, (x, t, eps)) = device_check.check_model(cfg, graphdef, state, 2, 1)
    before = jax.tree.map(np.asarray, carry["p"])
    carry["p"], carry["o"], loss = train(carry["p"], carry["o"], x, t, eps)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), before,
                                         jax.tree.map(np.asarray, carry["p"])))
    assert np.isfinite(float(loss)) and max(moved) > 0
