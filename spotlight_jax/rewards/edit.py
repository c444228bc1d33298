"""Edit reward: did an edited image carry out its instruction, and keep the rest of its source?

Read by the world's detector on the edited image and on the source (`world.edit` tasks; every
object of a scene has its own color, so objects are matched by color, each by the largest
component of its color). Per image, with m = cfg.position_margin * image_size:

  applied     the instruction carried out, in [0, 1]:
                recolour  new x (1 + gone) / 2: `new` = shape x place credit of the new color's
                          component at the old object's source centroid (an erased object earns
                          nothing), `gone` = 1 - (pixels of the old color left) / (its pixels in
                          the source), clipped to [0, 1];
                move      clip(d / m, 0, 1) x shape credit of the moved object, d = centroid
                          offset from the reference object along the asked relation (as
                          `geneval_lite` scores position);
                add       shape credit of the new color's component (0 if absent);
                remove    1 - (pixels of its color left) / (its pixels in the source), clipped.
  objects     the untouched objects kept: the mean over them of the shape x place credit of
              their color's component against their source centroid (0 if absent; 1 for a task
              with no untouched object).
  pixels      the share of untouched pixels (neither the edited object's source pixels nor the
              edit's result color in the edited image, each grown by one pixel) whose detector
              class is the source's.
  clean       1 / (1 + extra components): components beyond one per target color, of other
              colors or of the text color (left-over pixels of a recoloured or removed color are
              scored in `applied`, not here).

  edit reward = applied x preserved,   preserved = objects x (pixels + clean) / 2,   in [0, 1].

Shape credit is `geneval_lite`'s (1 for the detected shape, else up to 0.5 by the IoU with the
asked template); place credit is clip((3m - dist) / (2m), 0, 1) for the centroid distance: full
within m (3.2 px at 32 px), none beyond 3m, about an object's side. Every part is graded so that
RL sees a slope: a half-erased object, an object a few pixels off, a blob on the background or a
neighbour caught by the edit each cost part of the reward, and the unedited source earns 0 for
every kind. Products, not means: keeping the source untouched must not pay on its own, nor an
edit that destroys a neighbour (erasing the whole image does not "remove" an object).

`edit_reward(edited, sources, tasks)` scores images against given sources; the registered
`edit_lite(images, prompts)` reads each task and layout seed from an edit prompt
(`world.edit.format_edit_prompt`: "make the red square blue | a red square and a green bar | 7")
and re-renders the source from it, so it fits the registry's `(images, prompts)` contract.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from spotlight_jax.world.config import DEFAULT, WorldConfig
from spotlight_jax.world.detect import Detections, as_images, detect, segment
from spotlight_jax.world.edit import EditTask, parse_edit_prompt, relation_offset, render_pair

PARTS = ("applied", "objects", "pixels", "clean", "preserved", "reward")


def _largest(dets: Detections, comps: np.ndarray, cls: int) -> int | None:
    mine = comps[dets.cls[comps] == cls]
    return int(mine[np.argmax(dets.area[mine])]) if mine.size else None


def _shape_credit(dets: Detections, k: int | None, shape: str, cfg: WorldConfig) -> float:
    if k is None:
        return 0.0
    want = cfg.shapes.index(shape)
    if dets.shape[k] == want:
        return 1.0
    return 0.5 * float(np.clip((dets.shape_ious[k, want] - 0.5) / (cfg.shape_min_iou - 0.5),
                               0.0, 1.0))


def _place_credit(dets: Detections, k: int | None, ref: int | None, m: float) -> float:
    if k is None or ref is None:
        return 0.0
    d = np.hypot(dets.cy[k] - dets.cy[ref], dets.cx[k] - dets.cx[ref])
    return float(np.clip((3.0 * m - d) / (2.0 * m), 0.0, 1.0))


def _erased(edited_cls: np.ndarray, source_cls: np.ndarray, cls: int) -> float:
    """1 - (pixels of class `cls` in the edited image) / (in the source), clipped to [0, 1]."""
    before, after = int((source_cls == cls).sum()), int((edited_cls == cls).sum())
    if before == 0:
        return float(after == 0)
    return float(np.clip(1.0 - after / before, 0.0, 1.0))


def _grow(mask: np.ndarray) -> np.ndarray:
    """`mask` grown by one pixel (8-neighbourhood)."""
    p = np.pad(mask, 1)
    h, w = mask.shape
    out = np.zeros_like(mask)
    for dy in range(3):
        for dx in range(3):
            out |= p[dy : dy + h, dx : dx + w]
    return out


def _score(task: EditTask, dets: Detections, edited: int, source: int, classes: np.ndarray,
           cfg: WorldConfig) -> dict[str, float]:
    """The parts of one edited image (index `edited` of `dets`) against its source (`source`)."""
    m = cfg.position_margin * cfg.image_size
    e_comps, s_comps = dets.of_image(edited), dets.of_image(source)
    e_cls, s_cls = classes[edited], classes[source]

    def cls_of(color: str) -> int:
        return cfg.colors.index(color) + 1

    def in_edit(color: str) -> int | None:
        return _largest(dets, e_comps, cls_of(color))

    def in_source(color: str) -> int | None:
        return _largest(dets, s_comps, cls_of(color))

    o = task.obj
    if task.kind == "recolour":
        k = in_edit(task.color)
        new = _shape_credit(dets, k, o.shape, cfg) * _place_credit(dets, k, in_source(o.color), m)
        applied = new * 0.5 * (1.0 + _erased(e_cls, s_cls, cls_of(o.color)))
        was, now, erased = o.color, task.color, o.color
    elif task.kind == "move":
        k, kb = in_edit(o.color), in_edit(task.reference.color)
        kb = kb if kb is not None else in_source(task.reference.color)
        if k is None or kb is None:
            applied = 0.0
        else:
            d = relation_offset((dets.cy[k], dets.cx[k]), (dets.cy[kb], dets.cx[kb]),
                                task.relation)
            applied = float(np.clip(d / m, 0.0, 1.0)) * _shape_credit(dets, k, o.shape, cfg)
        was, now, erased = o.color, o.color, None
    elif task.kind == "add":
        applied = _shape_credit(dets, in_edit(o.color), o.shape, cfg)
        was, now, erased = None, o.color, None
    elif task.kind == "remove":
        applied = _erased(e_cls, s_cls, cls_of(o.color))
        was, now, erased = o.color, None, o.color
    else:
        raise ValueError(f'unknown edit kind "{task.kind}"')

    objects = [_shape_credit(dets, in_edit(u.color), u.shape, cfg)
               * _place_credit(dets, in_edit(u.color), in_source(u.color), m)
               for u in task.untouched]
    touched = np.zeros(e_cls.shape, bool)
    if was is not None:
        touched |= s_cls == cls_of(was)
    if now is not None:
        touched |= e_cls == cls_of(now)
    keep = ~_grow(touched)
    pixels = float((e_cls[keep] == s_cls[keep]).mean()) if keep.any() else 1.0
    n_cls = len(cfg.class_names)
    counts = np.bincount(dets.cls[e_comps], minlength=n_cls)
    expected = np.zeros(n_cls, np.int64)
    expected[[cls_of(g.color) for g in task.target.groups]] = 1
    if erased is not None:
        counts[cls_of(erased)] = 0
    clean = 1.0 / (1.0 + float(np.maximum(counts[1:] - expected[1:], 0).sum()))
    kept = float(np.mean(objects)) if objects else 1.0
    preserved = kept * 0.5 * (pixels + clean)
    return {"applied": applied, "objects": kept, "pixels": pixels, "clean": clean,
            "preserved": preserved, "reward": applied * preserved}


def edit_breakdown(edited, sources, tasks: Sequence[EditTask],
                   cfg: WorldConfig | None = None) -> dict[str, np.ndarray]:
    """{part: float32 [B]} for `PARTS` (see the module docstring): the reward and its factors."""
    x, src = as_images(edited), as_images(sources)
    if x.shape != src.shape:
        raise ValueError(f"edited images {x.shape} and sources {src.shape} differ in shape")
    if isinstance(tasks, EditTask) or len(tasks) != x.shape[0]:
        n = "a single task" if isinstance(tasks, EditTask) else len(tasks)
        raise ValueError(f"{x.shape[0]} images but {n} tasks")
    cfg = cfg if cfg is not None else DEFAULT.at_size(x.shape[1])
    if x.shape[1] != cfg.image_size:
        raise ValueError(f"images are {x.shape[1]}px but the world is {cfg.image_size}px")
    B = x.shape[0]
    both = np.concatenate([x, src])  # one detector pass over edited images and sources
    classes = segment(both, cfg)
    dets = detect(both, cfg, classes=classes)
    rows = [_score(t, dets, i, B + i, classes, cfg) for i, t in enumerate(tasks)]
    return {k: np.asarray([r[k] for r in rows], np.float32).reshape(B) for k in PARTS}


def edit_reward(edited, sources, tasks: Sequence[EditTask],
                cfg: WorldConfig | None = None) -> np.ndarray:
    """float32 [B] in [0, 1]: applied x preserved of each edited image against its source."""
    return edit_breakdown(edited, sources, tasks, cfg)["reward"]


@functools.lru_cache(maxsize=1024)  # a GRPO group scores one prompt many times
def _source(task: EditTask, seed: int, cfg: WorldConfig) -> np.ndarray:
    img = render_pair(task, seed, cfg)[0]
    img.setflags(write=False)
    return img


def prompt_sources(prompts: Sequence[str], cfg: WorldConfig = DEFAULT):
    """(sources float32 [B, H, W, 3], tasks): each edit prompt's task and its source rendered at
    the prompt's seed (`world.edit.parse_edit_prompt`)."""
    if isinstance(prompts, str):
        raise ValueError("expected a list of edit prompts, got a single str")
    parsed = [parse_edit_prompt(p, cfg) for p in prompts]
    tasks = [t for t, _ in parsed]
    if not parsed:
        return np.zeros((0, cfg.image_size, cfg.image_size, 3), np.float32), tasks
    return np.stack([_source(t, s, cfg) for t, s in parsed]), tasks


def edit_lite_breakdown(images, prompts: Sequence[str],
                        cfg: WorldConfig | None = None) -> dict[str, np.ndarray]:
    """`edit_breakdown` of images against the sources their edit prompts name."""
    x = as_images(images)
    cfg = cfg if cfg is not None else DEFAULT.at_size(x.shape[1])
    sources, tasks = prompt_sources(prompts, cfg)
    return edit_breakdown(x, sources, tasks, cfg)


def edit_summary(images, prompts: Sequence[str],
                 cfg: WorldConfig | None = None) -> dict[str, float]:
    """What a held-out evaluation reports beside the mean ``edit_lite``: its two factors'
    means (``part_applied``: the edit done; ``part_preserved``: the rest of the source kept)
    and the mean reward per edit kind (``kind_recolour``, ``kind_move``, ...; kinds present
    only)."""
    x = as_images(images)
    cfg = cfg if cfg is not None else DEFAULT.at_size(x.shape[1])
    sources, tasks = prompt_sources(prompts, cfg)
    parts = edit_breakdown(x, sources, tasks, cfg)
    out = {"part_applied": float(np.mean(parts["applied"])),
           "part_preserved": float(np.mean(parts["preserved"]))}
    kinds = np.array([t.kind for t in tasks])
    for kind in dict.fromkeys(t.kind for t in tasks):
        out[f"kind_{kind}"] = float(np.mean(parts["reward"][kinds == kind]))
    return out


def make_edit_lite(cfg: WorldConfig | None = None):
    """An `edit_lite` reward for world `cfg` (None: the default world at the images' size)."""

    def edit_lite(images, prompts: Sequence[str]) -> np.ndarray:
        """float32 [B]: the edit reward of each image against the source its edit prompt names
        (re-rendered from the prompt's seed)."""
        return edit_lite_breakdown(images, prompts, cfg)["reward"]

    return edit_lite


edit_lite = make_edit_lite()
