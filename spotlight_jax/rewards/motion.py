"""The synthetic video world's rewards: the asked objects, in every frame, moving the asked way.

``video_motion(clips [B, F, H, W, 3] in [0, 1], prompts) -> [B]`` is the mean of
``world.video.score_parts``' four parts (count, shape, motion, persistence; the world read at
the clips' frame size), graded as ``geneval_lite`` is; its parts are registered as its
components (GRPO's decoupled advantages). ``video_motion_exact`` is their product: 1 only for a
clip that meets every part, a strict success rate.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spotlight_jax.world.config import DEFAULT
from spotlight_jax.world.video import PARTS, score_parts


def _scores(clips, prompts: Sequence[str]) -> list[dict[str, float]]:
    clips = np.asarray(clips, np.float32)
    if clips.ndim != 5 or clips.shape[-1] != 3:
        raise ValueError(f"a video reward takes clips [batch, frames, height, width, 3]; got "
                         f"shape {clips.shape} (an image model's samples? use an image reward "
                         "such as geneval_lite)")
    cfg = DEFAULT.at_size(clips.shape[2])
    return [score_parts(c, p, cfg=cfg) for c, p in zip(clips, prompts)]


def video_motion(clips, prompts: Sequence[str]) -> np.ndarray:
    """float32 [B]: the mean of each clip's four parts."""
    return np.array([s["reward"] for s in _scores(clips, prompts)], np.float32)


def video_motion_parts(clips, prompts: Sequence[str]) -> dict[str, np.ndarray]:
    """``{part: float32 [B]}``: the four parts ``video_motion`` averages."""
    scores = _scores(clips, prompts)
    return {k: np.array([s[k] for s in scores], np.float32) for k in PARTS}


def video_motion_exact(clips, prompts: Sequence[str]) -> np.ndarray:
    """float32 [B]: the product of each clip's four parts."""
    return np.array([s["exact"] for s in _scores(clips, prompts)], np.float32)


def motion_summary(clips, prompts: Sequence[str]) -> dict[str, float]:
    """Held-out means of each part (``part_<name>``) and the strict success rate (``exact``)."""
    scores = _scores(clips, prompts)
    out = {f"part_{k}": float(np.mean([s[k] for s in scores])) for k in PARTS}
    out["exact"] = float(np.mean([s["exact"] for s in scores]))
    return out
