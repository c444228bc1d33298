"""The preview-selection study against closed forms: the pool a budget buys, the selection's
variance against brute force, and a preview after the last ODE step, which is the final image."""
import itertools
import tempfile

import numpy as np
import pytest
from helpers import micro_config

from spotlight_jax.studies import preview_selection as ps


def test_the_pool_a_budget_buys():
    # 16 rollouts, G = 8, a preview at half a rollout: 8 finished halves + 24 previews
    assert ps.preview_pool(16, 8, 0.5, most=64) == 24
    assert ps.preview_pool(16, 8, 0.5, most=20) == 20          # only what was sampled
    assert ps.preview_pool(16, 8, 1.0, most=64) == 16          # full scoring
    assert ps.preview_pool(4, 8, 0.5, most=64) == 8            # never below G
    # the reward a fifth of a candidate: a preview costs 0.6, finishing a chosen one 0.6 too
    assert ps.preview_pool(16, 8, 0.5, most=64, reward_share=0.2) == 18     # (16 - 4.8) / 0.6


def test_selected_variance_is_the_brute_force_maximum_when_scored_on_the_final_reward():
    rng = np.random.default_rng(0)
    final = rng.normal(size=(5, 7))
    best = np.mean([max(np.var(f[list(c)]) for c in itertools.combinations(range(6), 3))
                    for f in final])
    assert ps.selected_variance(final, final, 3, 6) == pytest.approx(best)
    # scored on something else, the final rewards of that choice: never above the maximum
    assert ps.selected_variance(final, rng.normal(size=(5, 7)), 3, 6) < best
    # a perfect preview on the bigger pool its lower cost buys is never worse than full scoring
    res = ps.compare(final, {1: final}, group=3, num_steps=4, budgets=(2,))
    assert res["preview"][1][2]["pool"] == 7 and res["preview"][1]["corr"] == pytest.approx(1)
    assert res["preview"][1][2]["variance"] >= res["full"][2]


@pytest.mark.e2e           # a micro run built and sampled (~20 s): among the longer checks
def test_the_preview_after_the_last_ode_step_is_the_final_image():
    from spotlight_jax import runner
    from spotlight_jax.config import RunSpec
    from spotlight_jax.models.factory import create_model

    c = micro_config(1, **{"sampler.sde_type": "ode", "rl.reward": "geneval_lite_shaped"})
    spec = RunSpec.from_config(c)
    graphdef, state = create_model(spec.model)
    run = runner.build_run(spec, tempfile.mkdtemp(), graphdef, state)
    try:
        prompts = run.prompts(0)
        seeds = np.arange(len(prompts) * 3, dtype=np.uint32).reshape(len(prompts), 3)
        last = run.sampler.cfg.num_steps - 1
        final, previews = ps.preview_rewards(run, run.trainer.sampling_state(), prompts, seeds,
                                             [1, last])
        assert final.shape == previews[1].shape == (len(prompts), 3)
        np.testing.assert_allclose(previews[last], final, rtol=1e-4, atol=1e-5)
    finally:
        run.close()
