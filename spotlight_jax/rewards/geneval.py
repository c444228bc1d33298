"""GenEval-lite: how many of a prompt's constraints an image meets, read by the world's detector.

Per image, the detector (`spotlight_jax.world.detect`) finds color components (>= cfg.min_px
pixels) with a shape label. Every object group of a prompt has its own color, so components are
attributed to groups by color. Constraint scores, each in [0, 1]:

  color     mean over groups of [at least one component of the group's color].
  count     1 / (1 + err), err = sum over groups |n_detected - n_asked| + n_extra, where n_extra
            counts components of colors the prompt did not ask for (including text-colored ones);
            0 when no component of any asked color exists. Graded rather than exact match because
            RL needs a signal when a model draws 6 blobs for 2 objects (5 -> 4 blobs is progress);
            extras are errors because the renderer never draws them.
  shape     mean over groups, over that color's components, of 1 if the detected shape (best
            template IoU >= cfg.shape_min_iou) is the asked one, else 0.5 * clip((IoU with the
            asked template - 0.5) / (shape_min_iou - 0.5), 0, 1) (a slope for RL); 0 for an
            absent color. `exact` counts only the first case.
  position  (position prompts) largest component of each of the two colors; d = centroid offset
            along the relation's axis in the asked direction (y grows downwards); score
            clip(d / (cfg.position_margin * image_size), 0, 1): 3.2 px of separation at 32x32 earns
            full credit, the wrong side earns 0, a missing object 0.
  text      (text prompts) the OCR reward, max(1 - edit_distance / len(target), 0).

`geneval_lite` is the mean of the constraints that apply (NaN entries of `constraint_breakdown`
excluded), so each constraint kind weighs the same whatever the number of groups: a position
prompt is 1/4 color, 1/4 count, 1/4 shape, 1/4 position; a text prompt is the OCR score.
`constraint_breakdown(..., exact=True)` gives all-or-nothing accuracies instead (a constraint
counts only when its graded score is 1), for reporting per-constraint accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spotlight_jax.rewards.ocr import graded_ocr_score, ocr_score
from spotlight_jax.world.config import DEFAULT, WorldConfig
from spotlight_jax.world.detect import as_images, detect, glyph_cells, read_glyphs
from spotlight_jax.world.grammar import parse

CONSTRAINTS = ("color", "count", "shape", "position", "text")


def _check_prompts(images: np.ndarray, prompts) -> None:
    if isinstance(prompts, str) or len(prompts) != images.shape[0]:
        n = "a single str" if isinstance(prompts, str) else len(prompts)
        raise ValueError(f"{images.shape[0]} images but {n} prompts")


def constraint_breakdown(
    images, prompts: Sequence[str], cfg: WorldConfig | None = None, exact: bool = False,
    text_credit: str = "ocr", shape_credit: str = "iou",
) -> dict[str, np.ndarray]:
    """{constraint: float32 [B]} per-image score of each constraint; NaN where it does not apply.

    Keys: color, count, shape, position, text. With `exact`, scores are 1.0 where the graded score
    is 1 and 0.0 otherwise (NaN stays NaN). ``text_credit``: 'ocr' (the OCR reward, as
    `geneval_lite` scores text) or 'glyphs' (`rewards.ocr.graded_ocr_score`: per-glyph partial
    credit, as `geneval_lite_shaped` does; the same exact successes). ``shape_credit``: 'iou'
    (a component not classified as the asked shape earns up to 0.5 by its IoU with the asked
    template, as `geneval_lite` scores shape) or 'aspect' (up to 0.5 by that IoU credit or, where
    larger, its mean with how close the component's elongation is to the asked shape's,
    `aspect_credit`, as `geneval_lite_aspect` does; the same exact successes, never below
    'iou').
    """
    if text_credit not in ("ocr", "glyphs"):
        raise ValueError(f"text_credit={text_credit!r}: use 'ocr' or 'glyphs'")
    if shape_credit not in ("iou", "aspect"):
        raise ValueError(f"shape_credit={shape_credit!r}: use 'iou' or 'aspect'")
    x = as_images(images)
    cfg = cfg if cfg is not None else DEFAULT.at_size(x.shape[1])
    if x.shape[1] != cfg.image_size:
        raise ValueError(f"images are {x.shape[1]}px but the world is {cfg.image_size}px")
    _check_prompts(x, prompts)
    specs = [parse(p, cfg) for p in prompts]
    B = x.shape[0]
    out = {k: np.full(B, np.nan, np.float64) for k in CONSTRAINTS}
    dets = detect(x, cfg)
    if any(s.kind == "text" for s in specs):
        cells = glyph_cells(x, cfg, dets)
    margin = cfg.position_margin * cfg.image_size
    for i, spec in enumerate(specs):
        if spec.kind == "text":
            out["text"][i] = (graded_ocr_score(cells[i], spec.text) if text_credit == "glyphs"
                              else ocr_score(read_glyphs(cells[i]), spec.text))
            continue
        comps = dets.of_image(i)
        cls = dets.cls[comps]
        color_s, shape_s, err, present = [], [], 0, 0
        largest = []
        for g in spec.groups:
            mine = comps[cls == cfg.colors.index(g.color) + 1]
            n = mine.size
            present += n
            color_s.append(float(n > 0))
            err += abs(n - g.count)
            want = cfg.shapes.index(g.shape)
            ok = dets.shape[mine] == want
            # Graded credit: 1 for a component classified as the asked shape, else up to 0.5
            # for how close it is to the asked template (IoU from 0.5 to shape_min_iou), so RL
            # sees a slope from a blob toward the shape instead of a cliff.
            near = np.clip((dets.shape_ious[mine, want] - 0.5) / (cfg.shape_min_iou - 0.5),
                           0.0, 1.0)
            if shape_credit == "aspect":
                elongation = aspect_credit(dets.y1[mine] - dets.y0[mine] + 1,
                                           dets.x1[mine] - dets.x0[mine] + 1, g.shape, cfg)
                near = np.maximum(near, 0.5 * (near + elongation))
            shape_s.append(float(np.where(ok, 1.0, 0.5 * near).mean()) if n else 0.0)
            largest.append(mine[np.argmax(dets.area[mine])] if n else None)
        asked = {cfg.colors.index(g.color) + 1 for g in spec.groups}
        n_extra = int(sum(c not in asked for c in cls))
        out["color"][i] = np.mean(color_s)
        out["shape"][i] = np.mean(shape_s)
        out["count"][i] = 1.0 / (1.0 + err + n_extra) if present else 0.0
        if spec.relation is not None:
            a, b = largest
            if a is None or b is None:
                out["position"][i] = 0.0
            else:
                d = {
                    "left": dets.cx[b] - dets.cx[a],
                    "right": dets.cx[a] - dets.cx[b],
                    "above": dets.cy[b] - dets.cy[a],
                    "below": dets.cy[a] - dets.cy[b],
                }[spec.relation]
                out["position"][i] = float(np.clip(d / margin, 0.0, 1.0))
    if exact:
        return exact_scores(out)
    return {k: v.astype(np.float32) for k, v in out.items()}


def aspect_credit(h, w, shape: str, cfg: WorldConfig) -> np.ndarray:
    """float [n] in [0, 1]: how close boxes of ``h`` x ``w`` px are to the elongation of ``shape``.

    1 inside the aspect range the detector accepts for the shape (square: long / short side <=
    ``cfg.shape_max_aspect``; bar: width / height >= ``cfg.bar_min_aspect``, column: the same
    upright), falling linearly in log aspect to 0 at ``log(1 / cfg.bar_thickness)`` (a drawn
    bar's elongation) outside it. Elongation is set where the layout forms, so a policy can move
    it a little at a time; IoU with a template also needs the edges right.
    """
    a = np.log(np.asarray(w, np.float64) / np.asarray(h, np.float64))  # > 0: wider than tall
    lo_sq, lo_bar = np.log(cfg.shape_max_aspect), np.log(cfg.bar_min_aspect)
    excess = {"bar": np.maximum(lo_bar - a, 0.0), "column": np.maximum(lo_bar + a, 0.0)}.get(
        shape, np.maximum(np.abs(a) - lo_sq, 0.0))
    return np.clip(1.0 - excess / np.log(1.0 / cfg.bar_thickness), 0.0, 1.0)


def exact_scores(breakdown: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A graded breakdown as all-or-nothing successes: 1.0 where the graded score is 1, else 0.0
    (NaN stays NaN). ``constraint_breakdown(..., exact=True)`` without detecting twice."""
    out = {}
    for k, v in breakdown.items():
        v = np.asarray(v, np.float64)
        out[k] = np.where(np.isnan(v), np.nan, (v >= 1.0 - 1e-9)).astype(np.float32)
    return out


def missing_credit(breakdown: dict[str, np.ndarray]) -> dict[str, float]:
    """Each constraint's share of the mean graded reward's shortfall from 1.

    An image's reward is the mean of its applicable constraints, so constraint ``k`` costs it
    ``(1 - score_k) / n_applicable``; averaged over images these shares sum to
    ``1 - mean(geneval_lite)``. ``breakdown`` is :func:`constraint_breakdown`'s graded output.
    Shows where a policy loses reward (and what a gain must come from).
    """
    stack = np.stack([np.asarray(breakdown[k], np.float64) for k in CONSTRAINTS], axis=1)
    ok = ~np.isnan(stack)
    n = np.maximum(ok.sum(1, keepdims=True), 1)
    lost = np.where(ok, (1.0 - np.nan_to_num(stack)) / n, 0.0).mean(0)
    return {k: float(v) for k, v in zip(CONSTRAINTS, lost)}


BINDING_OUTCOMES = ("both", "swapped", "one", "neither", "missing")


def _elongation(shape: str) -> str:
    return {"bar": "wide", "column": "tall"}.get(shape, "compact")


def shape_binding(images, prompts: Sequence[str], cfg: WorldConfig | None = None) -> dict:
    """Does each object get its own shape? Over the two-object prompts (``two_object`` and
    ``position`` kinds) whose objects ask for different elongations (wide bar, tall column,
    compact otherwise), the share of images whose largest component of each asked color has:
    ``both`` objects' asked elongations, the two ``swapped``, ``one`` of them right, ``neither``,
    or a color ``missing``; ``prompts`` counts the images scored. For comparison, ``alone`` is
    the share of the single-object prompts' images (``single_prompts`` of them) whose largest
    component of the asked color has the asked elongation. Elongation is the box's: wide at
    width / height >= ``cfg.shape_max_aspect``, tall at its inverse, compact between.

    Exact shape credit needs every object's template right, so a model that draws the asked
    shapes but attaches them to the wrong colors ("swapped" as often as "both") holds little
    shape credit in these prompts however well it draws single objects: that is binding, and
    regression onto a group's good samples can only sharpen it as far as the sampler draws it.
    """
    x = as_images(images)
    cfg = cfg if cfg is not None else DEFAULT.at_size(x.shape[1])
    _check_prompts(x, prompts)
    dets = detect(x, cfg)
    counts = dict.fromkeys(BINDING_OUTCOMES, 0)
    alone = []
    for i, p in enumerate(prompts):
        spec = parse(p, cfg)
        if spec.kind not in ("single", "two_object", "position"):
            continue
        asked = [_elongation(g.shape) for g in spec.groups]
        if spec.kind != "single" and asked[0] == asked[1]:
            continue
        comps = dets.of_image(i)
        got = []
        for g in spec.groups:
            mine = comps[dets.cls[comps] == cfg.colors.index(g.color) + 1]
            if mine.size == 0:
                break
            c = mine[np.argmax(dets.area[mine])]
            aspect = (dets.x1[c] - dets.x0[c] + 1) / (dets.y1[c] - dets.y0[c] + 1)
            got.append("wide" if aspect >= cfg.shape_max_aspect else
                       "tall" if 1.0 / aspect >= cfg.shape_max_aspect else "compact")
        if spec.kind == "single":
            alone.append(got == asked)
        elif len(got) < 2:
            counts["missing"] += 1
        elif got == asked:
            counts["both"] += 1
        elif got == asked[::-1]:
            counts["swapped"] += 1
        elif got[0] == asked[0] or got[1] == asked[1]:
            counts["one"] += 1
        else:
            counts["neither"] += 1
    n = sum(counts.values())
    return {"prompts": n, **{k: (v / n if n else float("nan")) for k, v in counts.items()},
            "single_prompts": len(alone), "alone": float(np.mean(alone)) if alone else float("nan")}


def _mean_of_parts(bd: dict[str, np.ndarray]) -> np.ndarray:
    stack = np.stack([bd[k] for k in CONSTRAINTS], axis=1)
    n = (~np.isnan(stack)).sum(1)
    return (np.nansum(stack, axis=1) / np.maximum(n, 1)).astype(np.float32)


def make_geneval_lite(cfg: WorldConfig | None = None, text_credit: str = "ocr",
                      shape_credit: str = "iou"):
    """A `geneval_lite` reward for world `cfg` (None: the default world at the images' size);
    ``text_credit='glyphs'`` makes `geneval_lite_shaped`, ``shape_credit='aspect'``
    `geneval_lite_aspect` (see `constraint_breakdown`)."""

    def geneval_lite(images, prompts: Sequence[str]) -> np.ndarray:
        """float32 [B]: mean over applicable constraints of their graded scores."""
        return _mean_of_parts(constraint_breakdown(images, prompts, cfg, text_credit=text_credit,
                                                   shape_credit=shape_credit))

    return geneval_lite


def shaped_breakdown(images, prompts: Sequence[str], cfg: WorldConfig | None = None):
    """`constraint_breakdown` with per-glyph text credit: `geneval_lite_shaped`'s parts."""
    return constraint_breakdown(images, prompts, cfg, text_credit="glyphs")


geneval_lite = make_geneval_lite()
# A training reward: geneval_lite with partial credit per glyph on text prompts (RL sees a slope
# toward the asked digits instead of the edit distance's 0 / 0.5 / 1); held-out evaluation stays
# geneval_lite (rl.eval_reward).
geneval_lite_shaped = make_geneval_lite(text_credit="glyphs")


def aspect_breakdown(images, prompts: Sequence[str], cfg: WorldConfig | None = None):
    """`constraint_breakdown` with aspect-graded shape credit: `geneval_lite_aspect`'s parts."""
    return constraint_breakdown(images, prompts, cfg, shape_credit="aspect")


# A training reward: geneval_lite whose shape credit also slopes toward the asked elongation, so a
# component of the wrong aspect (a round blob asked to be a column) is not flat at 0.
geneval_lite_aspect = make_geneval_lite(shape_credit="aspect")
