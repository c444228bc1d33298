"""The synthetic video world: moving shapes, a tracker that follows them, a motion reward.

Prompts such as "a red square moving left", "two blue bars falling" or "a green column standing
still" ask for ``count`` objects of one color and shape, all moving one way (``left``,
``right``, ``rising`` = up, ``falling`` = down, ``still``). :func:`render_video` draws a clip
that satisfies one: the image world's objects (its palette, shapes, sizes and detector) placed
so that their whole path stays on the canvas, moved ``speed`` pixels a frame. :func:`track`
finds the objects of the asked color in every frame with the image world's detector and follows
each from frame to frame by its nearest centroid; :func:`score_parts` turns that into four parts
in [0, 1]:

* ``count``: the share of frames holding exactly ``count`` objects of the asked color;
* ``shape``: the share of those detections that have the asked shape;
* ``motion``: how well the tracked objects' mean velocity agrees with the asked direction
  (its component along the direction over the asked speed, clipped to [0, 1]; for ``still``,
  1 minus the speed over the asked speed) and stays on that axis;
* ``persistence``: the share of frame-to-frame steps in which every object was followed
  (an object that vanishes or jumps farther than twice the asked speed breaks it).

The reward is their mean (graded, as the image world's ``geneval_lite`` is the mean of a
prompt's constraints); ``exact``, their product, is 1 only for a clip that meets every part (a
strict success rate). Plain numpy, like the image world; clips are float32
``[F, H, W, 3]`` in [0, 1].
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from spotlight_jax.world.config import COUNT_WORDS, DEFAULT, PALETTE, WorldConfig
from spotlight_jax.world.detect import detect
from spotlight_jax.world.render import object_mask

# Pixels an object moves per frame (every function's default speed). At 3 px on the 24 px
# canvas an object's path spans half of it, so the motion word decides where a clip's objects
# start and end: visible at high noise, where a flow model learns what a word decides (at 2 px
# the tiny video base read no motion word: docs/video.md, `studies.word_conditioning`).
SPEED = 3

# direction word -> unit (dy, dx), y down
DIRECTIONS = {"left": (0.0, -1.0), "right": (0.0, 1.0), "rising": (-1.0, 0.0),
              "falling": (1.0, 0.0), "still": (0.0, 0.0)}
_PHRASES = {"left": "moving left", "right": "moving right", "rising": "rising",
            "falling": "falling", "still": "standing still"}


@dataclasses.dataclass(frozen=True)
class VideoSpec:
    """A parsed video prompt: ``count`` objects of ``color`` and ``shape`` going ``direction``."""

    count: int
    color: str
    shape: str
    direction: str


def format_video_prompt(spec: VideoSpec) -> str:
    noun = spec.shape if spec.count == 1 else spec.shape + "s"
    return f"{COUNT_WORDS[spec.count]} {spec.color} {noun} {_PHRASES[spec.direction]}"


WORDS = ("count", "color", "shape", "direction")    # the parts of a video prompt


def vary(prompt: str, word: str, rng: np.random.Generator, cfg: WorldConfig = DEFAULT,
         max_count: int = 2) -> str:
    """``prompt`` with its ``word`` (one of :data:`WORDS`) replaced by another of the world's
    values, drawn by ``rng``: "a red square moving left" -> "a red square falling"."""
    others = alternatives(prompt, word, cfg, max_count)
    return others[int(rng.integers(len(others)))]


def alternatives(prompt: str, word: str, cfg: WorldConfig = DEFAULT,
                 max_count: int = 2) -> list[str]:
    """Every prompt that differs from ``prompt`` in its ``word`` alone (what :func:`vary` draws
    from): "a red square moving left" -> "a blue square moving left", "a green square ..."."""
    if word not in WORDS:
        raise ValueError(f"word={word!r}: a video prompt's words are {WORDS}")
    spec = parse_video(prompt, cfg)
    values = {"count": range(1, max_count + 1), "color": cfg.colors, "shape": cfg.shapes,
              "direction": DIRECTIONS}[word]
    return [format_video_prompt(dataclasses.replace(spec, **{word: v}))
            for v in values if v != getattr(spec, word)]


def video_prompts(cfg: WorldConfig = DEFAULT, max_count: int = 2) -> list[str]:
    """Every video prompt of the world: counts 1..``max_count``, each color, shape, direction."""
    return [format_video_prompt(VideoSpec(n, c, s, d)) for n in range(1, max_count + 1)
            for c in cfg.colors for s in cfg.shapes for d in DIRECTIONS]


def _split(cfg: WorldConfig, max_count: int) -> tuple[list[str], list[str]]:
    """``(train, val)``: each direction's prompts minus a held-out share (``cfg.val_fraction``,
    at least one per direction, fixed by ``cfg.split_seed``), so the held-out pool covers every
    motion."""
    rng = np.random.default_rng([cfg.split_seed, 7])
    prompts = video_prompts(cfg, max_count)
    train, val = [], []
    for d in DIRECTIONS:
        mine = [p for p in prompts if parse_video(p, cfg).direction == d]
        n_val = min(max(int(round(cfg.val_fraction * len(mine))), 1), len(mine) - 1)
        held = set(rng.permutation(len(mine))[:n_val].tolist())
        train += [p for i, p in enumerate(mine) if i not in held]
        val += [p for i, p in enumerate(mine) if i in held]
    return train, val


def video_train_prompts(cfg: WorldConfig = DEFAULT, max_count: int = 2) -> list[str]:
    """The video prompts a run trains on (disjoint from :func:`video_val_prompts`)."""
    return _split(cfg, max_count)[0]


def video_val_prompts(cfg: WorldConfig = DEFAULT, max_count: int = 2) -> list[str]:
    """The held-out video prompts, every direction among them."""
    return _split(cfg, max_count)[1]


def video_stream(prompts: Sequence[str], batch_size: int, seed: int, frames: int,
                 speed: int = SPEED, cfg: WorldConfig = DEFAULT):
    """Endless pretraining stream of ``(prompts [B], clips float32 [B, frames, H, W, 3])``, the
    prompts drawn uniformly; deterministic given ``seed``."""
    prompts = list(prompts)
    if not prompts or batch_size < 1:
        raise ValueError(f"video_stream needs prompts and batch_size >= 1; got "
                         f"{len(prompts)} prompts, batch_size={batch_size}")
    specs = [parse_video(p, cfg) for p in prompts]        # fail fast on a malformed prompt
    rng = np.random.default_rng(seed)
    while True:
        idx = rng.integers(len(prompts), size=batch_size)
        yield ([prompts[i] for i in idx],
               np.stack([render_video(specs[i], rng, frames, speed, cfg) for i in idx]))


def parse_video(prompt: str, cfg: WorldConfig = DEFAULT) -> VideoSpec:
    """The :class:`VideoSpec` of ``prompt``; a ValueError naming the word it cannot read."""
    words = prompt.strip().lower().split()
    if len(words) < 4:
        raise ValueError(f"video prompt {prompt!r}: write '<count> <color> <shape> "
                         f"<motion>', e.g. 'a red square moving left'")
    count_word, color, noun, motion = words[0], words[1], words[2], " ".join(words[3:])
    if count_word not in COUNT_WORDS[1:]:
        raise ValueError(f"video prompt {prompt!r}: unknown count {count_word!r}; "
                         f"use one of {COUNT_WORDS[1:]}")
    count = COUNT_WORDS.index(count_word)
    if color not in cfg.colors:
        raise ValueError(f"video prompt {prompt!r}: unknown color {color!r}; "
                         f"the world's colors are {cfg.colors}")
    shape = noun[:-1] if count > 1 and noun.endswith("s") else noun
    if shape not in cfg.shapes:
        raise ValueError(f"video prompt {prompt!r}: unknown shape {noun!r}; "
                         f"the world's shapes are {cfg.shapes}")
    direction = {v: k for k, v in _PHRASES.items()}.get(motion)
    if direction is None:
        raise ValueError(f"video prompt {prompt!r}: unknown motion {motion!r}; "
                         f"use one of {sorted(_PHRASES.values())}")
    return VideoSpec(count, color, shape, direction)


def render_video(prompt: str | VideoSpec, rng: np.random.Generator, frames: int = 5,
                 speed: int = SPEED, cfg: WorldConfig = DEFAULT) -> np.ndarray:
    """float32 ``[frames, H, W, 3]``: one random clip satisfying ``prompt``."""
    spec = prompt if isinstance(prompt, VideoSpec) else parse_video(prompt, cfg)
    dy, dx = DIRECTIONS[spec.direction]
    travel = speed * (frames - 1)
    size, margin, gap = cfg.size_range[0], cfg.edge_margin, cfg.object_gap
    side = cfg.image_size
    lo_y = margin + (travel if dy < 0 else 0)
    hi_y = side - margin - size - (travel if dy > 0 else 0)
    lo_x = margin + (travel if dx < 0 else 0)
    hi_x = side - margin - size - (travel if dx > 0 else 0)
    if hi_y < lo_y or hi_x < lo_x:
        raise ValueError(f"{frames} frames at {speed} px a frame leave no room for a "
                         f"{size} px object on a {side} px canvas; fewer frames or a lower speed")
    def swept_box(y, x):
        return (y + min(0, dy * travel), x + min(0, dx * travel),
                y + size + max(0, dy * travel), x + size + max(0, dx * travel))

    def apart(a, b):
        return (a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1]
                or b[3] + gap <= a[1])

    # rejection sampling of whole layouts: the objects' swept boxes keep apart
    for _ in range(500):
        starts = []
        for _ in range(spec.count):
            y, x = int(rng.integers(lo_y, hi_y + 1)), int(rng.integers(lo_x, hi_x + 1))
            box = swept_box(y, x)
            if not all(apart(box, o) for _, o in starts):
                break
            starts.append(((y, x), box))
        if len(starts) == spec.count:
            break
    else:
        raise ValueError(f"could not place {spec.count} moving objects for {prompt!r} on a "
                         f"{side} px canvas; fewer frames, a lower speed or a larger canvas")
    clip = np.empty((frames, side, side, 3), np.float32)
    clip[:] = cfg.background
    mask = object_mask(spec.shape, size, cfg.bar_thickness)
    for f in range(frames):
        for (y, x), _ in starts:
            yy, xx = int(y + dy * speed * f), int(x + dx * speed * f)
            clip[f, yy:yy + size, xx:xx + size][mask] = PALETTE[spec.color]
    return clip


def track(clip, spec: VideoSpec, cfg: WorldConfig = DEFAULT):
    """``(per_frame, shapes, steps)``: the centroids ``[(y, x), ...]`` of the objects of the
    asked color found in each frame, whether each has the asked shape, and for each
    frame-to-frame step the matched displacements (each object of the earlier frame to the
    nearest one of the next, greedily)."""
    clip = np.asarray(clip, np.float32)
    dets = detect(clip, cfg)
    want_cls = cfg.class_names.index(spec.color)
    want_shape = cfg.shapes.index(spec.shape)
    per_frame, shapes = [], []
    for f in range(clip.shape[0]):
        idx = [i for i in dets.of_image(f) if dets.cls[i] == want_cls]
        per_frame.append([(float(dets.cy[i]), float(dets.cx[i])) for i in idx])
        shapes.append([bool(dets.shape[i] == want_shape) for i in idx])
    steps = []
    for a, b in zip(per_frame[:-1], per_frame[1:]):
        left, moves = list(b), []
        for p in a:
            if not left:
                break
            j = int(np.argmin([(q[0] - p[0]) ** 2 + (q[1] - p[1]) ** 2 for q in left]))
            q = left.pop(j)
            moves.append((q[0] - p[0], q[1] - p[1]))
        steps.append(moves)
    return per_frame, shapes, steps


PARTS = ("count", "shape", "motion", "persistence")


def score_parts(clip, prompt: str | VideoSpec, speed: float = SPEED,
                cfg: WorldConfig = DEFAULT) -> dict[str, float]:
    """The reward's four parts (module docstring), their mean ``reward`` and their product
    ``exact`` (1 only for a clip that meets every part)."""
    spec = prompt if isinstance(prompt, VideoSpec) else parse_video(prompt, cfg)
    per_frame, shapes, steps = track(clip, spec, cfg)
    count = float(np.mean([len(p) == spec.count for p in per_frame]))
    found = [s for frame in shapes for s in frame]
    shape = float(np.mean(found)) if found else 0.0
    ok = [len(m) == spec.count and all(abs(d[0]) + abs(d[1]) <= 2 * speed + 1 for d in m)
          for m in steps]
    persistence = float(np.mean(ok)) if ok else 0.0
    moves = np.array([d for m, good in zip(steps, ok) if good for d in m], np.float64)
    if moves.size == 0:
        motion = 0.0
    else:
        v = moves.mean(axis=0)
        u = np.array(DIRECTIONS[spec.direction])
        if spec.direction == "still":
            motion = max(0.0, 1.0 - float(np.hypot(*v)) / speed)
        else:
            along = float(v @ u) / speed
            across = float(abs(v[0] * u[1] - v[1] * u[0])) / speed
            motion = float(np.clip(min(along, 2.0 - along), 0.0, 1.0)) * max(0.0, 1.0 - across)
    parts = {"count": count, "shape": shape, "motion": motion, "persistence": persistence}
    return {**parts, "reward": float(np.mean(list(parts.values()))),
            "exact": float(np.prod(list(parts.values())))}


def motion_reward(clips, prompts: Sequence[str], speed: float = SPEED,
                  cfg: WorldConfig = DEFAULT, part: str = "reward") -> np.ndarray:
    """float32 ``[B]``: :func:`score_parts`' ``part`` (the graded ``reward``, the strict
    ``exact`` or one of :data:`PARTS`) of each clip ``[B, F, H, W, 3]``."""
    clips = np.asarray(clips, np.float32)
    if clips.ndim != 5 or len(clips) != len(prompts):
        raise ValueError(f"clips must be [B, F, H, W, 3] with one prompt each; got "
                         f"{clips.shape} for {len(prompts)} prompts")
    return np.array([score_parts(c, p, speed, cfg)[part] for c, p in zip(clips, prompts)],
                    np.float32)
