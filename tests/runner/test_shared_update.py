"""The shared update in a run: the spot groups compute some of the update's gradient shards,
the rows equal an unshared run's to float rounding (the same batches, the same update), the
emulated iteration is shorter and the rows say where the shards ran."""
import numpy as np
import pytest
from helpers import micro_model, mode_config

from spotlight_jax import runner
from spotlight_jax.config import ConfigError, RunSpec


def _run(tmp_path, name, shared, mode="spotlight", objective="flow_grpo", iterations=2):
    c = mode_config(mode, iterations=iterations, objective=objective)
    c.deployment.shared_update = shared
    c.explore.budget_frac = 0.0       # no extras: both runs train on the same seeds
    c.rl.eval_every = 0
    _, graphdef, state = micro_model()  # perturbed: a fresh adaLN-Zero model has no gradient
    h = runner.run(RunSpec.of(c), str(tmp_path / name), graphdef, state, progress=False)
    return [r for r in h if "loss" in r]


@pytest.mark.e2e       # two runs, ~80 s on 2 cores (CI runs -m e2e)
def test_shared_update_rows_equal_the_trainers_own_update(tmp_path):
    off = _run(tmp_path, "off", "off")
    shared = _run(tmp_path, "fixed", "fixed")
    for a, b in zip(off, shared, strict=True):
        assert a["reward_mean"] == b["reward_mean"]          # the same batches
        np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-5)
        assert a["grad_norm"] > 0
        # a sum of +-terms near 0: compared against the terms' own float32 rounding
        for key in ("loss", "policy_loss"):
            np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-7)
        # (rollout_logp_dev is itself float rounding: another program's, not compared)
        for key in ("kl", "clip_frac", "approx_kl"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-9)
        # where the shards ran and what it bought
        assert "update_s" not in a
        assert b["update_split"] == 1.0 and b["update_shards_spot"] > 0
        assert b["update_shards"] == 8         # 2 minibatches x 4 shards of 1 trajectory
        assert b["update_s"] < b["update_trainer_s"]
        assert b["update_shards_spot"] < b["update_shards"]
    assert shared[-1]["vtime_s"] < off[-1]["vtime_s"]


def test_shared_update_is_refused_where_it_does_not_run():
    c = mode_config("spotlight")
    c.deployment.shared_update = "sometimes"
    with pytest.raises((ConfigError, ValueError), match="shared_update='sometimes'"):
        RunSpec.of(c)
    c.deployment.shared_update = "auto"
    c.deployment.transport = "ray"
    with pytest.raises(ConfigError, match="emulated fleet only"):
        RunSpec.of(c)
