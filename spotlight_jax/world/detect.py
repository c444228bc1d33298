"""Deterministic detector and OCR of the synthetic world (its "GenEval and OCR models" on CPU).

Pipeline, vectorised over a batch:

1. `segment`: each pixel gets the nearest detector class (background, object colors, text color)
   in RGB; pixels farther than `cfg.color_tolerance` from every class are background. Gray haze,
   dark smudges and mixed colors therefore count as nothing rather than as some color.
2. `label_components`: 4-connected components of equal class, by min-label hooking with pointer
   jumping on the flattened batch (no scipy). A 32x32 batch of 64 converges in a handful of rounds.
3. `detect`: per component its class, area, bounding box, centroid and shape. Components smaller
   than `cfg.min_px` are dropped as noise. The shape is the template with the highest IoU (a compact
   shape drawn by the renderer's own `shape_mask` in the component's bounding box; a bar or column
   as the renderer's `object_mask` in a square box of the component's long side); if even that IoU
   is below `cfg.shape_min_iou`, the box has the wrong elongation for the shape
   (`cfg.shape_max_aspect`, `cfg.bar_min_aspect`) or is much smaller than any object the renderer
   draws (`cfg.shape_min_frac`), the shape is "none":
   ragged blobs do not pass as circles nor 4x4 patch blocks as squares (failures of an earlier
   design, docs/world.md).
4. `read_text`: OCR for digits in the 3x5 font. Text pixels are the text-colored components; the
   scale is the text height / 5, glyphs are sliced at the font's pitch of 4 cells, each slice is
   averaged into 5x3 cells and matched to the nearest font template (L1 distance).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spotlight_jax.world.config import DEFAULT, ELONGATED_SHAPES, WorldConfig
from spotlight_jax.world.font import DIGITS, GLYPH_H, GLYPH_W, TEMPLATES
from spotlight_jax.world.render import object_mask, shape_mask

NO_SHAPE = "none"


def as_images(images, cfg: WorldConfig | None = None) -> np.ndarray:
    """Validate and convert images (numpy or jax) to float32 [B, H, W, 3] clipped to [0, 1]."""
    x = np.asarray(images, dtype=np.float32)
    if x.ndim != 4 or x.shape[-1] != 3 or x.shape[1] != x.shape[2]:
        raise ValueError(f"images must be float [B, H, W, 3] with H == W, got shape {x.shape}")
    if cfg is not None and x.shape[1] != cfg.image_size:
        raise ValueError(f"images are {x.shape[1]}px but the world is {cfg.image_size}px")
    if not np.isfinite(x).all():
        raise ValueError("images contain NaN or Inf")
    return np.clip(x, 0.0, 1.0)


def segment(images, cfg: WorldConfig = DEFAULT) -> np.ndarray:
    """int32 [B, H, W] detector class per pixel (0 = background; see `cfg.class_names`)."""
    x = as_images(images, cfg)
    rgb = cfg.class_rgb
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2, as one small matmul instead of a [B, H, W, C, 3] tensor.
    d2 = (x * x).sum(-1, keepdims=True) - 2.0 * (x @ rgb.T) + (rgb * rgb).sum(-1)
    cls = d2.argmin(-1).astype(np.int32)
    cls[d2.min(-1) > cfg.color_tolerance**2] = 0
    return cls


def label_components(classes: np.ndarray) -> np.ndarray:
    """int64 [B, H, W] component id (a flat pixel index, unique over the batch); -1 on background.

    Two pixels are connected when they are 4-neighbours of the same non-zero class.
    """
    c = np.asarray(classes)
    B, H, W = c.shape
    idx = np.arange(B * H * W).reshape(B, H, W)
    right = (c[:, :, :-1] == c[:, :, 1:]) & (c[:, :, :-1] > 0)
    down = (c[:, :-1, :] == c[:, 1:, :]) & (c[:, :-1, :] > 0)
    a = np.concatenate([idx[:, :, :-1][right], idx[:, :-1, :][down]])
    b = np.concatenate([idx[:, :, 1:][right], idx[:, 1:, :][down]])
    parent = np.arange(B * H * W)
    while a.size:
        pa, pb = parent[a], parent[b]
        live = pa != pb
        if not live.any():
            break
        a, b, pa, pb = a[live], b[live], pa[live], pb[live]
        lo, hi = np.minimum(pa, pb), np.maximum(pa, pb)
        # Hook the larger root under the smaller one, then compress paths fully.
        np.minimum.at(parent, hi, lo)
        while True:
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt
    labels = parent.reshape(B, H, W)
    return np.where(c > 0, labels, -1)


@dataclasses.dataclass(frozen=True)
class Detections:
    """Components of a batch as a struct of arrays (one entry per kept component).

    image: which image; cls: detector class (index into cfg.class_names); area: pixels;
    cy, cx: centroid (pixel centers, y down); y0, x0, y1, x1: inclusive bounding box;
    shape: index into cfg.shapes or -1 for "none"; shape_iou: IoU with the best template;
    shape_ious: [n, n_shapes] IoU with every template (0 where the size/aspect gates failed).
    `labels` is the per-pixel map [B, H, W] of the index of the kept component covering each pixel
    (an index into the arrays above), -1 elsewhere.
    """

    image: np.ndarray
    cls: np.ndarray
    area: np.ndarray
    cy: np.ndarray
    cx: np.ndarray
    y0: np.ndarray
    x0: np.ndarray
    y1: np.ndarray
    x1: np.ndarray
    shape: np.ndarray
    shape_iou: np.ndarray
    shape_ious: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.image.size)

    def of_image(self, b: int) -> np.ndarray:
        """Indices of the components found in image `b`."""
        return np.flatnonzero(self.image == b)


def _classify_shape(crop: np.ndarray, cfg: WorldConfig) -> tuple[int, float, np.ndarray]:
    """(best shape or -1, its IoU, IoU with every template); gated templates get 0.

    A compact shape's template is drawn in the component's bounding box (gated off when the box is
    elongated or small). A bar's or column's template is the renderer's `object_mask` in a square
    box of the component's long side, with the component centred in that box the way the renderer
    centres the band, so a square blob overlaps it by only `bar_thickness` and a blob stretched
    the right way gets a growing IoU (a slope for RL).
    """
    h, w = crop.shape
    lo = cfg.size_range[0]
    ious = np.zeros(len(cfg.shapes), np.float64)
    n = crop.sum()
    long_side = max(h, w)
    square_box = None
    for k, s in enumerate(cfg.shapes):
        if s in ELONGATED_SHAPES:
            if long_side < cfg.shape_min_frac * lo:
                continue
            if square_box is None:
                square_box = np.zeros((long_side, long_side), bool)
                y, x = (long_side - h) // 2, (long_side - w) // 2
                square_box[y : y + h, x : x + w] = crop
            t = object_mask(s, long_side, cfg.bar_thickness)
            inter = np.logical_and(square_box, t).sum()
        else:
            if long_side > cfg.shape_max_aspect * min(h, w):
                continue
            if min(h, w) < cfg.shape_min_frac * lo:
                continue
            t = shape_mask(s, h, w)
            inter = np.logical_and(crop, t).sum()
        ious[k] = inter / (n + t.sum() - inter)
    best = int(ious.argmax())
    best_iou = float(ious[best])
    elongated = cfg.shapes[best] in ELONGATED_SHAPES
    aspect = long_side / max(min(h, w), 1)
    if best_iou < cfg.shape_min_iou or (elongated and aspect < cfg.bar_min_aspect):
        best = -1
    return best, best_iou, ious


def detect(images, cfg: WorldConfig = DEFAULT, classes: np.ndarray | None = None) -> Detections:
    """Find the components of a batch of images (see the module docstring)."""
    cls_map = segment(images, cfg) if classes is None else classes
    B, H, W = cls_map.shape
    labels = label_components(cls_map)
    fg = labels.reshape(-1) >= 0
    roots = labels.reshape(-1)[fg]
    pix = np.flatnonzero(fg)
    roots_u, inv, area = np.unique(roots, return_inverse=True, return_counts=True)
    keep = area >= cfg.min_px
    # Map dropped components to background in the label map.
    new_id = np.where(keep, np.cumsum(keep) - 1, -1)
    lab = np.full(B * H * W, -1, np.int64)
    lab[pix] = new_id[inv]
    sel = keep[inv]
    pix, inv_k = pix[sel], new_id[inv[sel]]
    n = int(keep.sum())
    roots_k = roots_u[keep]
    image = roots_k // (H * W)
    yy = (pix // W) % H
    xx = pix % W
    area_k = np.bincount(inv_k, minlength=n)
    cy = np.bincount(inv_k, weights=yy + 0.5, minlength=n) / np.maximum(area_k, 1)
    cx = np.bincount(inv_k, weights=xx + 0.5, minlength=n) / np.maximum(area_k, 1)
    y0 = np.full(n, H, np.int64)
    x0 = np.full(n, W, np.int64)
    y1 = np.full(n, -1, np.int64)
    x1 = np.full(n, -1, np.int64)
    np.minimum.at(y0, inv_k, yy)
    np.minimum.at(x0, inv_k, xx)
    np.maximum.at(y1, inv_k, yy)
    np.maximum.at(x1, inv_k, xx)
    lab = lab.reshape(B, H, W)
    cls = cls_map.reshape(-1)[roots_k]
    shape = np.full(n, -1, np.int64)
    shape_iou = np.zeros(n, np.float64)
    shape_ious = np.zeros((n, len(cfg.shapes)), np.float64)
    text_cls = len(cfg.class_names) - 1
    for k in range(n):
        if cls[k] == text_cls:
            continue
        crop = lab[image[k], y0[k] : y1[k] + 1, x0[k] : x1[k] + 1] == k
        shape[k], shape_iou[k], shape_ious[k] = _classify_shape(crop, cfg)
    return Detections(
        image=image,
        cls=cls,
        area=area_k,
        cy=cy,
        cx=cx,
        y0=y0,
        x0=x0,
        y1=y1,
        x1=x1,
        shape=shape,
        shape_iou=shape_iou,
        shape_ious=shape_ious,
        labels=lab,
    )


def glyph_cells(images, cfg: WorldConfig = DEFAULT,
                dets: Detections | None = None) -> list[np.ndarray]:
    """Per image, its text sliced into glyphs: float32 ``[n, 5, 3]`` font-cell coverages in [0, 1]
    (``n = 0`` when the image has no text). What `read_text` matches against the font."""
    if dets is None:
        dets = detect(images, cfg)
    text_cls = len(cfg.class_names) - 1
    B = dets.labels.shape[0]
    text_ids = np.flatnonzero(dets.cls == text_cls)
    is_text = np.isin(dets.labels, text_ids)  # [B, H, W]
    out = []
    for b in range(B):
        m = is_text[b]
        rows = np.flatnonzero(m.any(1))
        cols = np.flatnonzero(m.any(0))
        if rows.size == 0:
            out.append(np.zeros((0, GLYPH_H, GLYPH_W), np.float32))
            continue
        y0, y1, x0, x1 = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
        h, w = y1 - y0, x1 - x0
        s = max(1.0, h / GLYPH_H)  # pixels per font cell
        pitch = (GLYPH_W + 1) * s
        n = max(1, int(round((w + s) / pitch)))
        pitch = (w + s) / n  # refit to the observed width
        gw = pitch - s
        cells = []
        for i in range(n):
            gx0 = x0 + i * pitch
            crop = m[y0:y1, int(round(gx0)) : max(int(round(gx0 + gw)), int(round(gx0)) + 1)]
            cells.append(_cell_means(crop, GLYPH_H, GLYPH_W))
        out.append(np.stack(cells))
    return out


def glyph_distances(cells: np.ndarray) -> np.ndarray:
    """``[n, 5, 3]`` glyph cells -> ``[n, 10]`` L1 distances to the digit templates."""
    templates = TEMPLATES.astype(np.float32)
    return np.abs(cells[:, None] - templates[None]).sum((2, 3))


def read_glyphs(cells: np.ndarray) -> str:
    """``[n, 5, 3]`` glyph cells -> the digits they read as (nearest template each)."""
    return "".join(DIGITS[int(j)] for j in glyph_distances(cells).argmin(1))


def read_text(images, cfg: WorldConfig = DEFAULT, dets: Detections | None = None) -> list[str]:
    """OCR: the digit string drawn in each image in the world's font ("" if none)."""
    return [read_glyphs(c) for c in glyph_cells(images, cfg, dets)]


def _cell_means(crop: np.ndarray, nr: int, nc: int, k: int = 4) -> np.ndarray:
    """Average a bool [h, w] crop into [nr, nc] cells, sampling k x k points per cell.

    Point sampling (nearest pixel) works for any crop size, including crops smaller than the cell
    grid, and is exact for renders whose size is a multiple of the grid.
    """
    h, w = crop.shape
    ri = ((np.arange(nr * k) + 0.5) * h / (nr * k)).astype(int)
    ci = ((np.arange(nc * k) + 0.5) * w / (nc * k)).astype(int)
    pts = crop[np.ix_(ri, ci)].astype(np.float32)
    return pts.reshape(nr, k, nc, k).mean((1, 3))
