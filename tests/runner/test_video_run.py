"""Video runs end to end: a micro Wan transformer on the video world, in the spot modes (the
emulated fleet explores and samples clips with stale weights, the trainer updates on them),
with both objectives; rows are finite, the held-out evaluation reports the reward's parts, and
the sample grids draw filmstrips."""
import numpy as np
import pytest

from spotlight_jax import runner
from spotlight_jax.config import RunSpec, load_config
from spotlight_jax.models.build import create_model

MICRO_VIDEO = {
    "model.num_layers": 1, "model.num_attention_heads": 2, "model.attention_head_dim": 12,
    "model.ffn_dim": 32, "model.freq_dim": 16, "model.text_dim": 16, "model.text_width": 16,
    "model.text_layers": 1, "model.frames": 3, "model.image_size": 16, "model.text_len": 6,
    "sampler.num_steps": 3, "sampler.sde_window": (0, 3), "sampler.eval_steps": 2,
    "rl.prompts_per_iter": 2, "rl.group_size": 4, "rl.train_steps": 2, "rl.minibatches": 2,
    "rl.eval_every": 2, "rl.eval_prompts": 2, "rl.eval_seeds": 1, "rl.iterations": 2,
    "rl.max_minutes": 0.0, "rl.nft.times": 2, "checkpoint.every": 10,
    "explore.max_extra_per_prompt": 4, "explore.sync_extra_per_prompt": 2,
    "deployment.rollout_on_groups": "false",
}


@pytest.mark.e2e
@pytest.mark.parametrize("mode,objective", [("spotlight_pipelined", "nft"),
                                            ("spotlight", "flow_grpo")])
def test_a_video_run_in_the_spot_modes(tmp_path, mode, objective):
    spec = RunSpec.from_config(load_config("tiny_video", {
        **MICRO_VIDEO, "mode": mode, "rl.objective": objective}))
    graphdef, state = create_model(spec.model, seed=0)
    h = runner.build_and_run(spec, str(tmp_path), graphdef, state, progress=False)
    rows = [r for r in h if "reward_mean" in r]
    assert len(rows) == 2
    assert all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rows)
    assert all(r["explore_candidates"] >= 2 * 4 for r in rows)
    assert 0 < rows[0]["vtime_s"] < rows[1]["vtime_s"]
    evals = [r for r in h if "val_reward" in r]
    assert evals and all({"val_part_count", "val_part_motion", "val_exact"} <= set(r)
                         for r in evals)
    assert list((tmp_path / "samples").glob("val_*.png"))
