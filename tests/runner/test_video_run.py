"""Video runs end to end: a micro Wan transformer on the video world, in the spot modes (the
emulated fleet explores and samples clips with stale weights, the trainer updates on them),
with both objectives; rows are finite, the held-out evaluation reports the reward's parts, and
the sample grids draw filmstrips."""
import numpy as np
import pytest
from helpers import WAN_PIPE as WAN_PIPE_DIR
from helpers import wan_fixture_overrides

from spotlight_jax import runner
from spotlight_jax.config import ConfigError, RunSpec, load_config
from spotlight_jax.io import safetensors_format
from spotlight_jax.models import WanConfig
from spotlight_jax.models.factory import create_model

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


def test_a_diffusers_wan_folder_is_a_runs_base(tmp_path):
    """The architecture from the checkpoint, the run's latent (frames, rows, prompt length)
    from the config; its VAE decodes clips; an image VAE beside it is refused."""
    spec = RunSpec.from_config(load_config("tiny_video", {
        **MICRO_VIDEO, **wan_fixture_overrides(tmp_path)}))
    m = spec.model
    assert isinstance(m, WanConfig)
    assert (m.num_layers, m.dim, m.in_channels, m.text_dim) == (1, 24, 16, 24)   # checkpoint
    assert m.latent_shape == (2, 4, 4, 16) and m.text_len == 12                   # config
    vae = spec.image_decoder()
    assert vae.video and vae.latent_channels == 16
    clips = np.asarray(vae.decode(np.zeros((1, *m.latent_shape), np.float32)))
    assert clips.shape == (1, 5, 32, 32, 3)
    image_vae = tmp_path / "pipe"
    image_vae.mkdir()
    (image_vae / "transformer").symlink_to(WAN_PIPE_DIR / "transformer")
    (image_vae / "vae").symlink_to(WAN_PIPE_DIR.parent / "vae" / "qwen_image")
    spec = RunSpec.from_config(load_config("tiny_video", {
        **MICRO_VIDEO, **wan_fixture_overrides(tmp_path), "base_checkpoint": str(image_vae)}))
    with pytest.raises(ConfigError, match="decodes images, the transformer draws clips"):
        spec.image_decoder()


@pytest.mark.e2e
def test_post_training_a_diffusers_wan_base_decodes_clips_with_its_vae(tmp_path):
    """A spot-mode run (nft) from the Wan pipeline folder: every rollout's latents decoded by
    the Wan VAE into clips before the video reward, the held-out filmstrips the VAE's pixels,
    the LoRA exported under diffusers' Wan names."""
    spec = RunSpec.from_config(load_config("tiny_video", {
        **MICRO_VIDEO, **wan_fixture_overrides(tmp_path), "rl.objective": "nft",
        "rl.iterations": 1}))
    graphdef, state = spec.load_diffusers_base()
    h = runner.build_and_run(spec, str(tmp_path / "run"), graphdef, state, progress=False)
    rows = [r for r in h if "reward_mean" in r]
    assert len(rows) == 1 and np.isfinite(rows[0]["loss"]) and rows[0]["grad_norm"] > 0
    assert all(np.isfinite(r["val_reward"]) for r in h if "val_reward" in r)
    assert list((tmp_path / "run" / "samples").glob("val_*.png"))
    lora = safetensors_format.load(tmp_path / "run" / "lora_diffusers.safetensors")
    assert "transformer.blocks.0.attn1.to_q.lora_A.weight" in lora
