"""The cost model priced from a measured device profile (``cost.profile_file``): each phase at
its own measured MFU, recomputed here from the profile's numbers and the datasheet, and every
bad profile refused in one line naming the field and the fix."""
import dataclasses
import json

import pytest
from helpers import micro_config

from spotlight_jax.config import ConfigError, RunSpec
from spotlight_jax.emulation import profile_file
from spotlight_jax.emulation.cost_models import ProfileCost
from spotlight_jax.emulation.datasheets import device_spec

ROLLOUT = [{"batch": 1, "sp": 1, "mfu": 0.10}, {"batch": 4, "sp": 1, "mfu": 0.30},
           {"batch": 4, "sp": 2, "mfu": 0.20}]


def write_profile(tmp_path, model, **over):
    data = {"kind": profile_file.KIND, "version": profile_file.VERSION,
            "device": "NVIDIA H100 80GB HBM3", "peak_tflops": 989.0,
            "model": {**dataclasses.asdict(model), "depth": 2}, "rollout": ROLLOUT,
            "update": {"nft": {"mfu": 0.25}, "flow_grpo": {"mfu": 0.15}},
            "decode": {"s_per_image": 0.02}, "reward": {"skipped": "no VAE"},
            "regroup": {"shrink_s": 0.003}, **over}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return str(path)


def spec_with(path=None, **over):
    """A micro run priced from ``path`` with the cost model's profile model = its own model."""
    plain = RunSpec.from_config(micro_config(1))
    keys = {"cost.profile_model": "tiny", "cost.image_pixels": 8 * 32, **over}
    if path:
        keys["cost.profile_file"] = path
    return RunSpec.from_config(micro_config(1, **keys)), plain


def test_each_phase_is_charged_at_its_measured_mfu(tmp_path):
    spec, _ = spec_with()
    path = write_profile(tmp_path, spec.cost.profile_model)
    spec, _ = spec_with(path)
    cost = ProfileCost(spec.cost, dataclasses.replace(spec.cost.profile_model, image_size=32),
                       spec.workload)
    peak = device_spec("h100_sxm").bf16_tflops * 1e12
    f, passes = cost.flops, cost.cfg_passes
    weights = cost.weight_bytes / (cost.device.hbm_gb_s * 1e9 * spec.cost.mbu)
    # batch 1 at sp 1: the b1 row; batch 8: the largest measured batch below it (b4)
    assert cost.rollout_step(1) == pytest.approx(max(passes * f / (peak * 0.10), weights))
    assert cost.rollout_step(8) == pytest.approx(max(passes * 8 * f / (peak * 0.30), weights))
    # sp 2 was measured (its time holds the collectives: no comm term); sp 4 was not (sp 1's
    # MFU plus the communication model)
    assert cost.rollout_step(4, 2) == pytest.approx(
        max(passes * 4 * f / (2 * peak * 0.20), weights))
    assert cost.rollout_step(4, 4) == pytest.approx(
        max(passes * 4 * f / (4 * peak * 0.30), weights) + cost.sp_comm(4, 4))
    # the update at the run's objective's (flow_grpo) MFU; decode measured + the assumed
    # reward
    assert spec.objective == "flow_grpo" and spec.cost.update_mfu == 0.15
    assert cost.train_sample() == pytest.approx(cost.train_flops_per_sample() / (peak * 0.15))
    assert cost.reward(3) == pytest.approx(3 * (0.02 + spec.cost.reward_s_per_image))
    assert cost.regroup("shrink") == 0.003
    rows = {a.name: a for a in cost.describe()}
    assert rows["profile"].value == path and "mfu" not in rows
    assert rows["update_mfu"].value == 0.15 and "b4 sp2: 20.0%" in rows["rollout_mfu"].value
    # an nft run takes nft's update MFU
    nft, _ = spec_with(path, **{"rl.objective": "nft"})
    assert nft.cost.update_mfu == 0.25


def test_per_phase_mfus_without_a_profile(tmp_path):
    spec, _ = spec_with(None, **{"cost.rollout_mfu": 0.5, "cost.update_mfu": 0.2})
    model = dataclasses.replace(spec.cost.profile_model, image_size=32)
    cost, assumed = ProfileCost(spec.cost, model, spec.workload), ProfileCost(
        dataclasses.replace(spec.cost, rollout_mfu=0.0, update_mfu=0.0), model, spec.workload)
    assert cost.train_sample() == pytest.approx(assumed.train_sample() * 0.4 / 0.2)
    assert cost.rollout_step(64) == pytest.approx(assumed.rollout_step(64) * 0.4 / 0.5)
    assert {a.name for a in cost.describe()} >= {"mfu", "rollout_mfu", "update_mfu"}
    with pytest.raises(ConfigError, match=r"cost.update_mfu=1.5: must be in \[0, 1\]"):
        spec_with(None, **{"cost.update_mfu": 1.5})


def test_bad_profiles_are_refused_in_one_line(tmp_path):
    spec, _ = spec_with()
    model = spec.cost.profile_model
    with pytest.raises(ConfigError, match=r"cost.profile_file='/nope.json': no such file; "
                                          r"record one with python -m spotlight_jax.bench"):
        spec_with("/nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not readable as JSON"):
        spec_with(str(bad))
    bad.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(ConfigError, match="not a device profile"):
        spec_with(str(bad))
    with pytest.raises(ConfigError, match="malformed device profile"):
        spec_with(write_profile(tmp_path, model, rollout=[{"batch": 1, "sp": 1}]))
    with pytest.raises(ConfigError, match="an MFU of 1.7 is not in"):
        spec_with(write_profile(tmp_path, model, update={"nft": {"mfu": 1.7}}))
    # another model: the width differs; the depth is what a profile scales over
    other = dataclasses.replace(model, width=model.width * 2)
    with pytest.raises(ConfigError, match=r"recorded for another model: its width is "
                                          rf"{model.width * 2}, the cost model's is "
                                          rf"{model.width}"):
        spec_with(write_profile(tmp_path, other))
    deep = write_profile(tmp_path, model)
    data = json.loads(open(deep).read())
    data["model"]["depth"] = model.depth + 1
    open(deep, "w").write(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"profiled at depth {model.depth + 1}, which the "
                                          rf"{model.depth}-block model cannot be scaled from"):
        spec_with(deep)
    with pytest.raises(ConfigError, match=r"timed the update of \['nft'\], not 'flow_grpo'"):
        spec_with(write_profile(tmp_path, model, update={"nft": {"mfu": 0.2}}))
