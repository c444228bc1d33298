"""The video path's config boundary: ``model.family='wan'`` builds a WanConfig run over the
video world's prompts, and every mismatch between the model's kind and the run's rewards or
prompt settings is one ConfigError naming the field."""
import pytest

from spotlight_jax.config import ConfigError, RunSpec, load_config
from spotlight_jax.models import WanConfig
from spotlight_jax.prompt_embeddings import VideoPrompts
from spotlight_jax.world import video


def test_tiny_video_spec_is_a_wan_run_over_the_video_world():
    spec = RunSpec.from_config(load_config("tiny_video"))
    assert isinstance(spec.model, WanConfig)
    assert spec.model.latent_shape == (5, 24, 24, 3) and spec.model.num_patches == 180
    source = spec.prompt_source()
    assert isinstance(source, VideoPrompts)
    assert not set(source.train_prompts) & set(source.val_prompts)
    # the held-out pool covers every motion
    assert {video.parse_video(p).direction for p in source.val_prompts} == set(video.DIRECTIONS)
    tokens, mask = source.tokenize(source.val_prompts, spec.model.text_len)
    assert tokens.shape == (len(source.val_prompts), 8) and mask.any(axis=1).all()


def test_image_rewards_that_score_any_frame_mix_into_a_video_run():
    spec = RunSpec.from_config(load_config("tiny_video", {
        "rl.reward": "video_motion:1.0,jpeg_compressibility:0.1"}))
    assert spec.settings.reward == "video_motion:1.0,jpeg_compressibility:0.1"


@pytest.mark.parametrize("config, overrides, match", [
    ("tiny_video", {"rl.eval_reward": "geneval_lite"},
     r"rl.eval_reward='geneval_lite': 'geneval_lite' reads the image world's prompts.*use "
     r"video_motion, or a learned image reward scored per frame"),
    ("tiny_video", {"rl.reward": "video_motion:1.0,ocr_lite:0.1"},
     r"rl.reward=.*'ocr_lite' reads the image world's prompts"),
    ("tiny", {"rl.reward": "video_motion"},
     r"rl.reward='video_motion': 'video_motion' scores video clips.*use geneval_lite"),
    ("tiny_video", {"model.family": "dit"}, r"model.family='dit': unknown; choose one of"),
    ("tiny_video", {"prompts.train_kinds": "position"},
     r"prompts.train_kinds='position': task kinds are the image world's"),
    ("tiny_video", {"model.frames": 0}, r"model.frames=0: must be a positive multiple"),
    ("tiny_video", {"model.image_size": 26}, r"model.image_size=26: must be a positive multiple"),
])
def test_video_config_mismatches_are_one_line_errors(config, overrides, match):
    with pytest.raises(ConfigError, match=match) as e:
        RunSpec.from_config(load_config(config, overrides))
    assert "\n" not in str(e.value)


def test_an_image_base_for_a_video_run_is_one_line(tmp_path):
    from spotlight_jax.runner import base_model  # noqa: PLC0415
    shipped = base_model.ASSETS + "/base_tiny"
    spec = RunSpec.from_config(load_config("tiny_video", {"base_checkpoint": shipped}))
    with pytest.raises(ValueError, match=r"holds an image model and this run's model "
                                         r"\(model.family\) draws videos") as e:
        base_model.load_or_pretrain_base(spec, str(tmp_path), allow_pretrain=False)
    assert "\n" not in str(e.value)
