"""The prepared device script runs end to end on CPU devices (so it cannot rot between GPU
loans): every part present, the attention paths equal the kernel alone, the train steps really
update the weights, and the profile it writes beside its JSON prices a cost model. The whole
script's rehearsal is a slow check (4-6 minutes on 2 cores, past CI's budget): run it before a
device session, `pytest -m slow tests/bench/test_device_check.py`; its parts' own checks stay
among the e2e ones."""
import dataclasses
import json

import jax
import numpy as np
import pytest

from spotlight_jax.bench import device_check
from spotlight_jax.bench import device_profile as device_profile_bench
from spotlight_jax.emulation import profile_file
from spotlight_jax.models.mmdit import REMAT_POLICIES
from spotlight_jax.programs import TINY_CONFIG


@pytest.mark.e2e
@pytest.mark.slow
def test_the_device_script_runs_every_part_on_cpu_devices(tmp_path):
    out = str(tmp_path / "device_check.json")
    small = [kv for kv in device_check.ITERATION_SET if not kv.startswith(
        ("model.width", "model.num_heads", "model.depth", "model.text_len", "model.image_size",
         "rl.iterations"))] + ["model.width=48", "model.num_heads=4", "model.depth=1",
                               "rl.iterations=3", "rl.prompts_per_iter=2", "rl.group_size=4"]
    result = device_check.run(TINY_CONFIG, depth=1, latent=8, batch=2, repeats=1, out=out,
                              profile_depth=1, iteration_set=small,
                              stand_ins=device_profile_bench.StandIns(layers=1))
    assert result["backend"] == "cpu" and result["seq"] == 16 + 4
    assert list(result["parts"]) == list(device_check.PARTS) and "errors" not in result
    assert json.load(open(out))["parts"] == result["parts"]          # written as it went
    assert result["forward_ms"] > 0 and result["train_step_ms"] > 0
    assert result["hlo_attention_kernel"] == "xla"                    # auto on a CPU
    step = result["hlo_train_step"]              # so the step's program computes the scores
    assert (step["cudnn_forward"], step["cudnn_backward"]) == (0, 0) and step["score_values"] > 0
    xla, cudnn = result["attention"]
    assert xla["implementation"] == "xla" and xla["max_abs_diff_vs_xla"] == 0.0
    assert cudnn == {"implementation": "cudnn", "skipped": "not a GPU backend"}
    paths = result["paths"]
    assert paths["kernel"] == "xla" and paths["dense"]["max_abs_diff"] < 1e-6
    assert len(jax.devices()) >= 2
    for strategy in ("ulysses", "ring"):
        assert paths[strategy]["max_abs_diff_vs_dense"] < 1e-5, strategy
    assert result["lora"]["rank"] == 32 and 0 < result["lora"]["train_step_mfu"] <= 1
    assert set(result["remat"]) == set(REMAT_POLICIES)
    assert result["concurrent"]["concurrent_ms"] > 0
    # a few Spotlight iterations of each mode, their phases' throughput from the runs' rl.jsonl,
    # scored in the loop by the stand-in PickScore (random weights, 1 layer per tower)
    assert result["iteration"]["reward"].startswith("pickscore stand-in"), result["iteration"]
    for mode in device_check.ITERATION_MODES:
        row = result["iteration"][mode]
        assert "failed" not in row, row.get("failed")
        assert row["iterations_timed"] == 2 and 0 < row["train_mfu"] <= 1, row
        assert row["time_train"] > 0 and row["explore_wall_s"] > 0
    # spotlight rolls out on the trainer; a pipelined iteration on the spot groups only
    assert result["iteration"]["spotlight"]["rollout_images_per_s"] > 0
    assert "rollout_images_per_s" not in result["iteration"]["spotlight_pipelined"]
    text = device_check.table(result)
    assert all(line.count("|") in (3, 4) for line in text.splitlines() if line.startswith("| "))
    # the profile: every phase the cost model charges, loadable as cost.profile_file
    profile = profile_file.load(device_check.profile_path(out))
    assert {(b, sp) for b, sp, _ in profile.rollout} == {(1, 1), (4, 1), (1, 2), (4, 2)}
    assert set(profile.update) == {"nft", "flow_grpo"}
    assert profile.regroup_shrink_s > 0 and profile.decode_s_per_image is None   # pixels
    assert profile.reward_s_per_image > 0                  # the stand-in PickScore, 1 layer
    assert "stand_in" in result["profile"]["reward"]
    from spotlight_jax.config import model_config
    from spotlight_jax.config.loading import load_config
    tiny = model_config(load_config(TINY_CONFIG))
    profile.check_model(dataclasses.replace(tiny, image_size=64, depth=1))
    with pytest.raises(ValueError, match="unknown \\['nope'\\]"):
        device_check.run(TINY_CONFIG, 1, 8, 2, 1, parts=("nope",))
    # a part that fails is recorded and the next one still runs
    failed = device_check.run(TINY_CONFIG, 1, 8, 2, 1, parts=("profile", "lora"),
                              profile_depth=0)
    assert "depth" in failed["errors"]["profile"] and "lora" in failed
    assert "| part `profile` | failed:" in device_check.table(failed)


@pytest.mark.e2e
def test_train_step_moves_the_weights():
    cfg, graphdef, state = device_check.build(TINY_CONFIG, depth=1, latent=8)
    _, (fwd, train, carry, (x, t, eps)) = device_check.check_model(cfg, graphdef, state, 2, 1)
    before = jax.tree.map(np.asarray, carry["p"])
    carry["p"], carry["o"], loss = train(carry["p"], carry["o"], x, t, eps)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), before,
                                         jax.tree.map(np.asarray, carry["p"])))
    assert np.isfinite(float(loss)) and max(moved) > 0
