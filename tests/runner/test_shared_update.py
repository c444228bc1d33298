"""The shared update in a run: the spot groups compute some of the update's gradient shards,
the rows equal an unshared run's to float rounding (the same batches, the same update), the
emulated iteration is shorter and the rows say where the shards ran."""
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import micro_model, mode_config

from spotlight_jax import config as conf
from spotlight_jax import runner
from spotlight_jax.config import ConfigError, RunSpec
from spotlight_jax.explore import Planner, PlannerConfig
from spotlight_jax.rl import trainer_class
from spotlight_jax.rl.shards import shard_count
from spotlight_jax.runner.exploration import extras_budget_s
from spotlight_jax.runner.modes import SpotlightPipelinedMode
from spotlight_jax.runner.shared_update import AUTO_SHARES, SharedUpdate


def _run(tmp_path, name, shared, mode="spotlight", objective="flow_grpo", iterations=2):
    c = mode_config(mode, iterations=iterations, objective=objective)
    c.deployment.shared_update = shared
    c.explore.budget_frac = 0.0       # no extras: both runs train on the same seeds
    c.rl.eval_every = 0
    _, graphdef, state = micro_model()  # perturbed: a fresh adaLN-Zero model has no gradient
    h = runner.build_and_run(RunSpec.from_config(c), str(tmp_path / name), graphdef, state,
                             progress=False)
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
        RunSpec.from_config(c)
    c.deployment.shared_update = "auto"
    c.deployment.update_spot_share = 1.5
    with pytest.raises((ConfigError, ValueError), match="update_spot_share"):
        RunSpec.from_config(c)
    c.deployment.update_spot_share = 0.5
    c.deployment.update_payoff_exponent = 0.0
    with pytest.raises((ConfigError, ValueError), match="update_payoff_exponent=0.0"):
        RunSpec.from_config(c)


def _planner_of(split):
    """A deployment of the micro run with every spot node alive, its SharedUpdate at ``split``
    and the update's size."""
    c = mode_config("spotlight_pipelined", objective="nft")
    c.deployment.shared_update = split
    d = conf.make_deployment(c)
    d.alive_nodes = {f"spot{i}" for i in range(d.cfg.spot_nodes)}
    d.events.position = len(d.events.events)
    rl = conf.rl_config(c)
    n = int(c.rl.prompts_per_iter) * int(c.rl.group_size)
    return d, SharedUpdate(d, lambda b: trainer_class(rl).shard_units(rl, b)), n


def payoff_args(su, d, n):
    """``SharedUpdate._plan_at``'s arguments after the share and ``n``, at version 0."""
    steps, units = su.shard_units(n)
    return steps, shard_count(units, su.cfg.update_shards), 0, d.train_s(n)


def test_the_payoff_split_takes_the_least_time_per_unit_of_progress():
    d, payoff, n = _planner_of("payoff")
    _, auto, _ = _planner_of("auto")
    work, other = 3.0 * d.spot_seconds_per_candidate(), 40.0
    # nothing learned yet (progress None), or exploration worth nothing: auto's choice
    assert payoff.plan(n, 0, work, other_s=other).share == auto.plan(n, 0, work).share
    assert payoff.plan(n, 0, work, other_s=other, progress=lambda p: 1.0).share == \
        auto.plan(n, 0, work).share
    assert auto.plan(n, 0, work).share > 0           # the shards do shorten the window

    def explore_pays(rate):   # progress grows with the spot time the shards leave to explore
        return lambda p: 1.0 + rate * max(p.seconds * d.spot_devices - p.spot_device_s, 0.0)

    spot = d.spot_devices
    for rate in (1e-4, 1e-3, 1e-2, 1.0):
        chosen = payoff.plan(n, 0, work, other_s=other, progress=explore_pays(rate))
        scores = {}
        for share in AUTO_SHARES:                     # brute force over the shares
            p = payoff._plan_at(share, n, *payoff_args(payoff, d, n))
            seconds = other + max(p.seconds, (p.spot_device_s + work) / spot)
            scores[share] = seconds / explore_pays(rate)(p)
        assert scores[chosen.share] == pytest.approx(min(scores.values()), rel=1e-12)
        assert chosen.progress == pytest.approx(explore_pays(rate)(chosen), rel=1e-12)
        assert chosen.info()["update_payoff_progress"] == chosen.progress
    # exploration paying a lot keeps every shard on the trainer
    assert payoff.plan(n, 0, work, other_s=other, progress=explore_pays(1.0)).share == 0.0


def test_exploration_progress_is_the_planners_expected_gain_over_the_base_variance():
    d, su, n = _planner_of("payoff")
    c = mode_config("spotlight_pipelined", objective="nft")
    G, P = int(c.rl.group_size), int(c.rl.prompts_per_iter)
    planner = Planner(PlannerConfig(group_size=G, max_extra_per_prompt=4, seed=0))
    settings = SimpleNamespace(explore=SimpleNamespace(budget_frac=1.0))
    s = SimpleNamespace(deploy=d, settings=settings, planner=planner,
                        prompts=lambda k: list(range(k * P, (k + 1) * P)))
    mode = SpotlightPipelinedMode.__new__(SpotlightPipelinedMode)
    per = d.spot_seconds_per_candidate()
    assert mode.exploration_progress(s, 0, per, n) is None       # nothing observed
    rng = np.random.default_rng(0)
    planner.plan(s.prompts(0), 0.0, per)
    for pid in s.prompts(0) + s.prompts(1):
        planner.update(pid, rng.random(G + 4))
    progress = mode.exploration_progress(s, 0, per, n)
    v = planner.base_variance(s.prompts(1))
    gains = []
    for share in AUTO_SHARES:
        plan = su._plan_at(share, n, *payoff_args(su, d, n))
        budget = max(extras_budget_s(1.0 * plan.seconds, d.spot_devices, n, per)
                     - plan.spot_device_s, 0.0)
        g = planner.expected_gain(s.prompts(1), budget, per) / P
        assert progress(plan) == pytest.approx((1 + g / v) ** 0.75, rel=1e-12)
        gains.append(g)
    assert v > 0 and gains[0] > gains[-1] >= 0     # shards on spot leave less to explore
