"""Which phases sit on each mode's critical path, and for how long: every mode's emulated clock
against the one pricing rule (``Deployment``: rollouts split by capacity, a reward's price per
image split over the devices that hold the images, the update, exploration in its window),
iteration by iteration, on a trace with no event."""

import math

import pytest
from helpers import mode_config

from spotlight_jax import runner
from spotlight_jax.config import RunSpec
from spotlight_jax.runner.backends.scheduled import MICROBATCH


def _expected(mode: str, d, n: int, row: dict) -> dict[str, float]:
    """The critical-path seconds per label of one iteration of ``mode`` (its row says what the
    backend measured: the scheduler's makespan, the candidates explored)."""
    od, spot = d.cfg.on_demand_devices, d.spot_devices
    train = d.train_s(n)
    if mode == "baseline":
        return {"rollout": d.rollout_s(n, use_spot=False), "reward": d.reward_s(n, od),
                "train": train}
    if mode == "explore_sync":      # every candidate rolled out and scored on the trainer
        c = row["explore_candidates"]
        return {"explore_sync": d.rollout_s(c, use_spot=False), "reward": d.reward_s(c, od),
                "train": train}
    out = {"broadcast": d.cost.broadcast()}
    if not row.get("pipelined"):    # rolled out on the trainer and the spot groups, scored there
        out.update(rollout=row["sched_makespan_s"], reward=d.reward_s(n, od + spot))
    if mode == "spot_rollout":
        out["train"] = train
    else:                           # the update and, beside it, exploration on the spot groups
        explore = row["explore_candidates"] * d.spot_seconds_per_candidate() / spot
        out["train" if train >= explore else "explore"] = max(train, explore)
    return out


# the exploring modes' runs among the longer checks (the default suite's 7-minute budget)
@pytest.mark.parametrize("mode", [
    pytest.param(m, marks=pytest.mark.e2e) if m in ("spotlight", "spotlight_pipelined") else m
    for m in runner.MODES])
def test_each_mode_charges_its_critical_path_by_the_one_pricing_rule(tmp_path, base, mode):
    graphdef, state = base
    c = mode_config(mode, iterations=3)
    c.trace.rate_per_node_hour = 0.0                 # every spot node up: no event to price
    spec = RunSpec.from_config(c)
    r = runner.build_run(spec, str(tmp_path), graphdef, state)
    d, n = r.deploy, spec.settings.prompts_per_iter * spec.settings.group_size
    assert d.spot_devices == 8
    for k in range(3):
        before = {lab: v["critical_s"] for lab, v in d.clock.breakdown().items()}
        start = d.clock.now()
        row = r.step(k)
        after = {lab: v["critical_s"] for lab, v in d.clock.breakdown().items()}
        charged = {lab: after[lab] - before.get(lab, 0.0) for lab in after
                   if after[lab] - before.get(lab, 0.0) > 0}
        want = _expected(mode, d, n, row)
        assert set(charged) == set(want), (k, charged, want)
        for lab, seconds in want.items():
            assert charged[lab] == pytest.approx(seconds, rel=1e-9), (k, lab)
        assert d.clock.now() - start == pytest.approx(sum(want.values()), rel=1e-9)
        if mode == "spotlight_pipelined":            # only the first iteration rolls out
            assert row["pipelined"] == (k > 0)
        if "sched_calls" in row:     # the scheduler's leases are whole microbatches, so no
            # call computes a padded row: each microbatch runs from commit to commit
            calls_per_rollout = math.ceil(spec.sampler.num_steps / c.deployment.commit_every)
            assert row["sched_calls"] == n // MICROBATCH * calls_per_rollout
    r.close()
