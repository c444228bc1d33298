"""Weighted reward mixes (``rl.reward='a:1.0,b:0.5'``): parsing, the weighted sum of clipped
terms against a hand-made sum, per-reward normalised (decoupled) advantages against their
formula, the config's errors, and a micro run that logs every term."""

import json

import numpy as np
import pytest
from helpers import micro_config

from spotlight_jax import rewards as R
from spotlight_jax import rl
from spotlight_jax import world as W
from spotlight_jax.config import ConfigError, RunSpec, load_config
from spotlight_jax.rewards import mix

MIX = "geneval_lite:1.0,jpeg_compressibility:0.5:-1.5:0"


@pytest.fixture(scope="module")
def renders():
    prompts = W.train_prompts()[:12]
    images = W.sample_batch(prompts, np.random.default_rng(0))
    return prompts, images


def test_parse_reads_terms_and_a_plain_name_is_one_unweighted_term():
    assert mix.parse("geneval_lite") == (mix.Term("geneval_lite"),)
    assert mix.parse(" a :2, b:-0.5:-1:3") == (mix.Term("a", 2.0),
                                                mix.Term("b", -0.5, -1.0, 3.0))
    assert not mix.is_mix("ocr_lite") and mix.is_mix("ocr_lite:1")


@pytest.mark.parametrize("spec,match", [
    ("a:x", "weight 'x', not a number"),
    ("a:1,b", "'b' is not name:weight"),
    ("a:1:0", "is not name:weight or name:weight:low:high"),
    ("a:1:2:1", r"clips to \[2.0, 1.0\], an empty range"),
    ("a:0", "weight 0"),
    ("a:1,a:2", "names a reward twice"),
    (":1", "is not name:weight"),
    ("a:nan", "weight nan"),
])
def test_parse_names_the_bad_term(spec, match):
    with pytest.raises(ValueError, match=match):
        mix.parse(spec)


def test_mix_is_the_weighted_sum_of_clipped_terms(renders):
    prompts, images = renders
    g = R.get("geneval_lite")(images, prompts).astype(np.float64)
    j = R.get("jpeg_compressibility")(images, prompts).astype(np.float64)
    hand = 1.0 * g + 0.5 * np.clip(j, -1.5, 0.0)
    np.testing.assert_allclose(R.get(MIX)(images, prompts), hand, rtol=1e-6)
    total, terms = R.resolve(MIX).scored(images, prompts)
    np.testing.assert_allclose(total, hand, rtol=1e-6)
    assert list(terms) == ["geneval_lite", "jpeg_compressibility"]
    np.testing.assert_allclose(terms["geneval_lite"], g, rtol=1e-6)
    np.testing.assert_allclose(terms["jpeg_compressibility"], np.clip(j, -1.5, 0.0), rtol=1e-6)
    # a clip that bites: geneval_lite capped at 0.5 changes exactly the rows above 0.5
    capped = R.get("geneval_lite:2:0:0.5")(images, prompts)
    np.testing.assert_allclose(capped, 2.0 * np.minimum(g, 0.5), rtol=1e-6)
    assert (g > 0.5).any()
    # a plain name: one term, the reward itself
    plain = R.resolve("geneval_lite")
    r, t = plain.scored(images, prompts)
    np.testing.assert_array_equal(r, g.astype(np.float32))
    assert list(t) == ["geneval_lite"] and not plain.is_mix
    assert plain.weights is None and R.resolve(MIX).is_mix
    np.testing.assert_array_equal(R.resolve(MIX).weights, [1.0, 0.5])
    assert R.resolve(MIX).term_names == ["geneval_lite", "jpeg_compressibility"]
    np.testing.assert_allclose(R.resolve(MIX).components()(images, prompts),
                               np.stack([g, np.clip(j, -1.5, 0.0)], 1), rtol=1e-6)


def test_unknown_reward_in_a_mix_is_named():
    with pytest.raises(ValueError, match="reward mix 'geneval_lite:1,nope:2': unknown reward "
                                         "'nope'"):
        R.get("geneval_lite:1,nope:2")


def _decoupled_by_hand(parts, ids, w, clip, eps=1e-4):
    """The formula, group by group: each part's (p - mean) / (std + eps) (0 for a constant
    part), the weighted average sum w a / sum |w|, normalised again within the group."""
    out = np.zeros(len(ids))
    for g in np.unique(ids):
        rows = np.flatnonzero(ids == g)
        avg = np.zeros(len(rows))
        for k in range(parts.shape[1]):
            p = parts[rows, k]
            a = np.zeros(len(rows)) if np.all(p == p[0]) else (p - p.mean()) / (p.std() + eps)
            avg += w[k] * a
        avg /= np.abs(w).sum()
        if not np.all(avg == avg[0]):
            out[rows] = (avg - avg.mean()) / (avg.std() + eps)
    return np.clip(out, -clip, clip)


def test_decoupled_advantages_weight_each_normalised_term():
    rng = np.random.default_rng(3)
    ids = np.repeat(np.arange(5), 6)
    parts = np.stack([rng.normal(size=30), 100.0 * rng.normal(size=30)], 1)
    parts[:6, 1] = 7.0                                  # a term constant within one group
    for w in ([1.0, 0.5], [2.0, -1.0], [1.0, 1.0]):
        got = rl.decoupled_advantages(parts, ids, weights=w, clip=2.0)
        np.testing.assert_allclose(got, _decoupled_by_hand(parts, ids, np.asarray(w), 2.0),
                                   rtol=1e-5, atol=1e-6)
    # equal weights are the unweighted decoupled advantages
    np.testing.assert_array_equal(rl.decoupled_advantages(parts, ids, weights=[1.0, 1.0]),
                                  rl.decoupled_advantages(parts, ids))
    # the small-spread term steers: a mix weighting it 1:1 is not the plain weighted sum's
    assert not np.allclose(rl.decoupled_advantages(parts, ids, weights=[1.0, 1.0]),
                           rl.advantages(parts @ [1.0, 1.0], ids))
    with pytest.raises(ValueError, match="weights must be"):
        rl.decoupled_advantages(parts, ids, weights=[1.0])


@pytest.mark.parametrize("key", ["rl.reward", "rl.eval_reward"])
def test_config_names_the_bad_mix(key):
    with pytest.raises(ConfigError, match=f"{key}='geneval_lite:1,imagereward:1': unknown reward "
                                          "'imagereward'"):
        RunSpec.from_config(load_config("tiny", {key: "geneval_lite:1,imagereward:1"}))
    with pytest.raises(ConfigError, match=f"{key}='geneval_lite:one'.*not a number"):
        RunSpec.from_config(load_config("tiny", {key: "geneval_lite:one"}))


# whole runs (~25 s each): among the longer checks (the default suite's 7-minute budget); the
# decoupled advantages themselves are checked by hand above
@pytest.mark.e2e
@pytest.mark.parametrize("advantage", ["reward", "decoupled"])
def test_micro_run_with_a_mix_logs_every_term(tmp_path, advantage):
    from spotlight_jax import runner
    from spotlight_jax.models.factory import create_model

    c = micro_config(3, **{"rl.reward": MIX, "rl.eval_reward": MIX, "rl.eval_every": 3,
                           "rl.advantage": advantage, "checkpoint.every": 3})
    spec = RunSpec.from_config(c)
    graphdef, state = create_model(spec.model)
    runner.build_and_run(spec, str(tmp_path), graphdef, state, progress=False)
    rows = [json.loads(x) for x in open(tmp_path / "rl.jsonl")]
    trains = [r for r in rows if "reward_mean" in r]
    evals = [r for r in rows if "val_reward" in r]
    assert len(trains) == 3 and len(evals) == 2              # iterations 0 (base) and 3
    for r in trains:
        g, j = r["reward_geneval_lite"], r["reward_jpeg_compressibility"]
        assert -1.5 <= j <= 0.0 and 0.0 <= g <= 1.0
        # the batch mean of a weighted sum is the weighted sum of the term means
        assert r["reward_mean"] == pytest.approx(g + 0.5 * j, rel=1e-5)
        assert np.isfinite(r["loss"])
    for r in evals:
        assert r["val_reward"] == pytest.approx(
            r["val_reward_geneval_lite"] + 0.5 * r["val_reward_jpeg_compressibility"], rel=1e-5)


def test_a_mix_with_the_served_reward_registers_its_client():
    from spotlight_jax.config.sections import REMOTE_REWARD
    try:
        spec = RunSpec.from_config(load_config("tiny", {
            "rl.reward": f"geneval_lite:1,{REMOTE_REWARD}:0.5",
            "remote_reward.url": "http://127.0.0.1:9"}))
        assert REMOTE_REWARD not in R.names()           # parsing changes no global state
        spec.register_rewards()                         # building the run registers it
        assert REMOTE_REWARD in R.names()
        assert spec.settings.reward.endswith(f"{REMOTE_REWARD}:0.5")
    finally:
        R.unregister(REMOTE_REWARD)         # the client leaves with the test
    with pytest.raises(ConfigError, match="remote_reward.url=''"):
        RunSpec.from_config(load_config("tiny", {"rl.reward": f"geneval_lite:1,{REMOTE_REWARD}:0.5",
                                        "remote_reward.url": ""}))
