"""studies.cost_sweep: the per-iteration critical path it computes without training is what the
modes really charge, and its sweep crosses the two assumptions that move the ratio most."""
import pytest
from helpers import mode_config

from spotlight_jax import runner
from spotlight_jax.config import RunSpec
from spotlight_jax.studies import cost_sweep


def _charged(r, k, rows=None):
    t0 = r.deploy.clock.now()
    row = r.step(k)
    if rows is not None:
        rows.append(row)
    return r.deploy.clock.now() - t0


# the spot modes among the longer checks (the default suite's 7-minute budget); baseline (what
# a run that rents no spot node pays) runs in the default suite
@pytest.mark.parametrize("mode,shared", [
    ("baseline", "off"), pytest.param("spot_rollout", "off", marks=pytest.mark.e2e),
    pytest.param("spotlight_pipelined", "off", marks=pytest.mark.e2e),
    pytest.param("spotlight_pipelined", "auto", marks=pytest.mark.e2e)])
def test_iteration_phases_equal_what_a_run_charges(tmp_path, base, mode, shared):
    graphdef, state = base
    c = mode_config(mode, iterations=2, objective="nft")
    c.deployment.shared_update = shared
    c.trace.rate_per_node_hour = 0.0                 # every spot node stays alive
    # the capacity-weighted split the sweep computes (the pull scheduler's makespan adds the
    # tail of whole leases: tests/runner/test_critical_path.py reads it from the run's rows)
    c.deployment.scheduler = mode != "spot_rollout"
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    predicted = cost_sweep.iteration_phases(c)[mode]
    _charged(r, 0)                                   # pipelined: nothing ready, rolls out
    assert r.deploy.spot_devices == c.deployment.spot_nodes * c.deployment.spot_devices_per_node
    if mode == "spotlight_pipelined":
        assert r.mode.pending is not None
    rows, dollars = [], r.deploy.dollars()
    assert _charged(r, 1, rows) == pytest.approx(predicted.seconds, rel=1e-9)
    # paid as predicted: baseline its on-demand devices only, a spot mode every spot node too
    assert r.deploy.dollars() - dollars == pytest.approx(predicted.dollars, rel=1e-9)
    on_demand = c.deployment.on_demand_devices * r.deploy.cost.price_per_hour("on_demand")
    paid_per_hour = predicted.dollars / predicted.seconds * 3600
    assert (paid_per_hour == pytest.approx(on_demand)) == (mode == "baseline")
    if shared != "off":     # the update's window, shorter than the trainer's alone
        assert 0 < rows[0]["update_s"] < rows[0]["update_trainer_s"]
        assert rows[0]["update_shards_spot"] > 0 and rows[0]["pipelined"] == 1
    crit = {k: v["critical_s"] for k, v in r.deploy.clock.breakdown().items()}
    n, od = c.rl.prompts_per_iter * c.rl.group_size, c.deployment.on_demand_devices
    # one price per image, split over the devices that hold the images
    per_image = r.deploy.cost.reward(1)
    if mode == "baseline":
        reward = r.deploy.reward_s(n, od)
        assert predicted.phases["reward"] == reward == pytest.approx(n * per_image / od)
        assert crit["reward"] == pytest.approx(2 * reward, rel=1e-9)
    elif mode == "spot_rollout":   # over the on-demand and spot devices that rolled it out
        reward = r.deploy.reward_s(n, od + r.deploy.spot_devices)
        assert predicted.phases["reward"] == reward
        assert crit["reward"] == pytest.approx(2 * reward, rel=1e-9)
    else:       # iteration 1's ready batch was rewarded on the spot groups: only 0 charges it,
        # over the on-demand and spot devices that rolled it out
        reward = r.deploy.reward_s(n, od + r.deploy.spot_devices)
        assert predicted.phases["reward"] == 0.0
        assert crit["reward"] == pytest.approx(reward, rel=1e-9)
    r.close()


def test_the_pipelined_update_waits_for_spot_groups_that_cannot_sample_a_batch_in_time():
    from spotlight_jax.config import load_config
    c = load_config("tiny")
    fast = cost_sweep.iteration_phases(c)["spotlight_pipelined"]
    c.sampler.num_steps = 40                         # 4x the sampling, same update
    slow = cost_sweep.iteration_phases(c)["spotlight_pipelined"]
    assert slow.phases["train"] > fast.phases["train"]
    assert slow.phases["rollout"] == 0.0 and slow.seconds > fast.seconds


def test_sweep_crosses_the_two_assumptions_that_move_the_ratio_most():
    sweeps = [("rl.nft.times", [1, 8]), ("deployment.spot_nodes", [2, 8]),
              ("cost.reward_s_per_image", [0.02, 0.5])]
    from spotlight_jax.config import load_config
    out = cost_sweep.sweep(load_config("tiny"), sweeps)
    # spot nodes only change how fast candidates are sampled, which the update hides here
    assert out["spread"]["deployment.spot_nodes"] == pytest.approx(0.0, abs=1e-12)
    assert out["crossed"]["keys"] == ["rl.nft.times", "cost.reward_s_per_image"]
    assert set(out["crossed"]["rows"]) == {"1|0.02", "1|0.5", "8|0.02", "8|0.5"}
    base = out["base"]
    assert base["baseline"]["ratio"] == 1.0
    assert base["spotlight_pipelined"]["ratio"] > base["spotlight"]["ratio"] > 1.0
    table = cost_sweep.markdown(out)
    assert "| `rl.nft.times` | 8 |" in table and "Pipelined per-iteration ratio" in table
