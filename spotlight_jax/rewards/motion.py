"""The synthetic video world's reward: the asked objects, in every frame, moving the asked way.

``video_motion(clips [B, F, H, W, 3] in [0, 1], prompts) -> [B]`` is ``world.video``'s
:func:`~spotlight_jax.world.video.score_parts` product (frames x motion x persistence) with the
world read at the clips' frame size; ``video_motion_mean`` averages the three parts instead (a
training reward with the same perfect clips and a slope wherever one part is already right).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spotlight_jax.world.config import DEFAULT
from spotlight_jax.world.video import score_parts

VIDEO_REWARDS = ("video_motion", "video_motion_mean")   # the registered rewards of clips


def _parts(clips, prompts: Sequence[str]) -> list[dict[str, float]]:
    clips = np.asarray(clips, np.float32)
    if clips.ndim != 5 or clips.shape[-1] != 3:
        raise ValueError(f"a video reward takes clips [batch, frames, height, width, 3]; got "
                         f"shape {clips.shape} (an image model's samples? use an image reward "
                         "such as geneval_lite)")
    cfg = DEFAULT.at_size(clips.shape[2])
    return [score_parts(c, p, cfg=cfg) for c, p in zip(clips, prompts)]


def video_motion(clips, prompts: Sequence[str]) -> np.ndarray:
    """float32 [B]: frames x motion x persistence of each clip."""
    return np.array([p["reward"] for p in _parts(clips, prompts)], np.float32)


def video_motion_mean(clips, prompts: Sequence[str]) -> np.ndarray:
    """float32 [B]: the mean of the three parts of each clip."""
    return np.array([(p["frames"] + p["motion"] + p["persistence"]) / 3.0
                     for p in _parts(clips, prompts)], np.float32)
