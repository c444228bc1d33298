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
