"""The synthetic video world: every prompt's rendered clip earns the full motion reward, and the
clips that break one thing each (the direction, the motion, the shape, the order of the frames,
the color, an object lost) lose the part of the reward that reads it; the world's prompt split,
pretraining stream and placement of two moving objects on a small canvas."""
import numpy as np
import pytest

from spotlight_jax.world import DEFAULT, video


def test_every_prompt_renders_a_clip_that_earns_the_whole_reward():
    rng = np.random.default_rng(0)
    prompts = video.video_prompts(DEFAULT, max_count=2)
    assert len(prompts) == 2 * len(DEFAULT.colors) * len(DEFAULT.shapes) * 5
    clips = np.stack([video.render_video(p, rng, frames=5) for p in prompts])
    assert clips.shape == (len(prompts), 5, 32, 32, 3)
    np.testing.assert_array_equal(video.motion_reward(clips, prompts), 1.0)
    np.testing.assert_array_equal(video.motion_reward(clips, prompts, part="exact"), 1.0)
    for p in prompts:
        assert video.format_video_prompt(video.parse_video(p)) == p


def parts(clip, prompt):
    return video.score_parts(clip, prompt)


def test_each_broken_clip_loses_the_part_that_reads_it():
    rng = np.random.default_rng(1)
    left = video.render_video("a red square moving left", rng)
    # the same clip asked to go right: the objects are right, the motion is not
    wrong = parts(left, "a red square moving right")
    assert wrong["count"] == wrong["shape"] == wrong["persistence"] == 1.0
    assert wrong["motion"] == 0.0 and wrong["reward"] == 0.75 and wrong["exact"] == 0.0
    # the same clip asked for bars: the count and the motion are right, the shape is not
    bars = parts(left, "a red bar moving left")
    assert bars["shape"] == 0.0 and bars["motion"] == 1.0 and bars["exact"] == 0.0
    # one frame repeated: a still picture of a "moving" square
    still = np.repeat(left[:1], 5, axis=0)
    assert parts(still, "a red square moving left")["motion"] == 0.0
    assert parts(still, "a red square standing still")["reward"] == 1.0
    # frames out of order: some steps jump back
    shuffled = left[[0, 3, 1, 4, 2]]
    got = parts(shuffled, "a red square moving left")
    # two of the four steps jump three times the speed (more than twice it plus one):
    # persistence 0.5;
    # the other two go back right, so the followed motion is the wrong way
    assert got["persistence"] == 0.5 and got["motion"] == 0.0
    # another color: nothing of the asked kind in any frame
    assert parts(left, "a blue square moving left") == {
        "count": 0.0, "shape": 0.0, "motion": 0.0, "persistence": 0.0, "reward": 0.0,
        "exact": 0.0}
    # the object gone from one frame: that frame and the two steps around it fail
    gone = left.copy()
    gone[2] = DEFAULT.background
    got = parts(gone, "a red square moving left")
    assert got["count"] == pytest.approx(0.8) and got["persistence"] == pytest.approx(0.5)
    # twice the asked speed is not the asked motion either
    fast = video.render_video("a red square moving left", rng, frames=3, speed=2 * video.SPEED)
    assert parts(fast, "a red square moving left")["motion"] == 0.0


def test_bad_prompts_and_clips_say_what_is_wrong():
    with pytest.raises(ValueError, match="unknown motion 'moving sideways'"):
        video.parse_video("a red square moving sideways")
    with pytest.raises(ValueError, match="unknown color 'purple'"):
        video.parse_video("a purple square rising")
    with pytest.raises(ValueError, match="leave no room"):
        video.render_video("a red bar falling", np.random.default_rng(0), frames=12, speed=2)
    with pytest.raises(ValueError, match=r"\[B, F, H, W, 3\]"):
        video.motion_reward(np.zeros((2, 32, 32, 3)), ["a red bar falling"] * 2)


def test_split_stream_and_two_objects_on_a_small_canvas():
    cfg = DEFAULT.at_size(24)
    train, val = video.video_train_prompts(cfg), video.video_val_prompts(cfg)
    assert len(train) + len(val) == len(video.video_prompts(cfg)) and not set(train) & set(val)
    assert {video.parse_video(p, cfg).direction for p in val} == set(video.DIRECTIONS)
    a, b = video.video_stream(train, 3, 5, frames=4, cfg=cfg), video.video_stream(
        train, 3, 5, frames=4, cfg=cfg)
    (pa, ca), (pb, cb) = next(a), next(b)
    assert pa == pb and ca.shape == (3, 4, 24, 24, 3)
    np.testing.assert_array_equal(ca, cb)                  # deterministic given the seed
    # every two-object prompt places on 24 px (whole layouts are resampled, never one object)
    rng = np.random.default_rng(0)
    two = [p for p in video.video_prompts(cfg) if p.startswith("two")]
    clips = np.stack([video.render_video(p, rng, cfg=cfg) for p in two for _ in range(3)])
    np.testing.assert_array_equal(
        video.motion_reward(clips, [p for p in two for _ in range(3)], cfg=cfg), 1.0)
