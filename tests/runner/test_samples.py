"""Evaluation sample grids: captioned with prompt and reward; before/after pairs from the second
evaluation on, the first evaluation's images kept on disk across a resume."""
import types

import numpy as np
from PIL import Image

from spotlight_jax import rewards, world
from spotlight_jax.prompt_embeddings import WorldPrompts
from spotlight_jax.runner import outputs


def test_sample_grids_caption_rewards_and_pair_the_first_evaluation(tmp_path):
    logged = []
    writer = types.SimpleNamespace(image=lambda k, key, img, caption: logged.append((k, key, img)))
    run = types.SimpleNamespace(workdir=str(tmp_path), writer=writer,
                                eval_reward=rewards.resolve("geneval_lite"),
                                prompt_source=WorldPrompts(world.WorldConfig(image_size=16)),
                                mcfg=types.SimpleNamespace(text_len=16))
    prompts = world.val_prompts(world.WorldConfig(image_size=16))[:4]
    rng = np.random.default_rng(0)
    first, later = rng.uniform(size=(2, 4, 16, 16, 3)).astype(np.float32)
    outputs.save_samples(run, 0, first, prompts)
    assert (tmp_path / "samples" / "val_00000.png").exists()
    assert not list((tmp_path / "samples").glob("before_after_*"))
    outputs.save_samples(run, 40, later, prompts)
    # the captioned grids, as written, went to the writer (TensorBoard / W&B) at their steps
    assert [(k, key) for k, key, _ in logged] == [(0, "samples/val"), (40, "samples/val")]
    for (k, _, img) in logged:
        np.testing.assert_array_equal(
            img, np.asarray(Image.open(tmp_path / "samples" / f"val_{k:05d}.png").convert("RGB")))
    kept = np.load(tmp_path / "samples" / "val_first.npz")
    np.testing.assert_array_equal(kept["images"], first)          # not overwritten by it 40
    np.testing.assert_allclose(kept["scores"], rewards.get("geneval_lite")(first, prompts))
    pair = Image.open(tmp_path / "samples" / "before_after_00040.png")
    single = Image.open(tmp_path / "samples" / "val_00040.png")
    # 4 prompts -> 8 tiles in one row of 8, where the single grid has 4 tiles in that row
    assert pair.width == single.width and pair.height >= single.height
    tile = np.asarray(pair)[:64, :64]
    np.testing.assert_array_equal(tile, np.asarray(Image.fromarray(
        (np.clip(first[0], 0, 1) * 255).astype(np.uint8)).resize((64, 64), Image.NEAREST)))


def test_video_filmstrips_name_each_part_and_show_every_motion(tmp_path):
    """A video run's captions give each clip's reward parts (from the world's scorer: a clip
    rendered from its prompt scores 1 on each, a blank one 0); the grid's clips take the
    held-out motions in turn."""
    from spotlight_jax.prompt_embeddings import VideoPrompts
    from spotlight_jax.world import video

    cfg = world.WorldConfig(image_size=24)
    source = VideoPrompts(cfg)
    shown = source.shown(source.val_prompts, 10)
    motions = [video.parse_video(source.val_prompts[i]).direction for i in shown]
    assert motions[:5] == list(video.DIRECTIONS) == motions[5:]
    writer = types.SimpleNamespace(image=lambda *a, **k: None)
    run = types.SimpleNamespace(workdir=str(tmp_path), writer=writer, prompt_source=source,
                                eval_reward=rewards.resolve("video_motion"),
                                mcfg=types.SimpleNamespace(text_len=8))
    prompts = [source.val_prompts[i] for i in shown[:2]]
    rng = np.random.default_rng(0)
    clips = np.stack([video.render_video(p, rng, 5, cfg=cfg) for p in prompts])
    blank = np.zeros_like(clips)
    notes = outputs._part_notes(run, np.concatenate([clips, blank]), prompts * 2)
    assert notes[:2] == [" = mean of count 1.00, shape 1.00, motion 1.00, persistence 1.00"] * 2
    assert notes[2:] == [" = mean of count 0.00, shape 0.00, motion 0.00, persistence 0.00"] * 2
    image_run = types.SimpleNamespace(eval_reward=rewards.resolve("geneval_lite"))
    assert outputs._part_notes(image_run, clips, prompts) == ["", ""]
    outputs.save_samples(run, 0, blank, prompts)
    outputs.save_samples(run, 5, clips, prompts)
    strip = Image.open(tmp_path / "samples" / "before_after_00005.png")
    assert strip.width >= 2 * 4 * (5 * 24 + 4)          # before | after, five frames each
