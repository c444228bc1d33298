"""Renderer of the synthetic world: draws a random image that satisfies a prompt.

Images are float32 [H, W, 3] in [0, 1]: a solid background with crisp (not anti-aliased) objects in
exact palette colors, so that the detector can read the renderer's own images perfectly and a
generated image is scored only on what the model drew. Each object lies in a square box of a random
side in `cfg.size_range` (a circle, square or apex-up triangle fills it; a bar or column is a band
across its middle, see `object_mask`), placed by rejection sampling so
that bounding boxes keep `cfg.object_gap` pixels apart and `cfg.edge_margin` from the border. For
position prompts the subject's box lies entirely on the asked side of the reference's box. Text
prompts draw the digits in the 3x5 font of `spotlight_jax.world.font` at `cfg.glyph_scale`, in
`cfg.text_color`, at a random position.

Shape masks are precomputed per size and painted with numpy slicing, so rendering a batch of 64 at
32x32 takes a few milliseconds; `data_stream` is the pretraining input pipeline.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import numpy as np

from spotlight_jax.world.config import (
    COMPACT_SHAPES,
    DEFAULT,
    ELONGATED_SHAPES,
    KINDS,
    PALETTE,
    WorldConfig,
)
from spotlight_jax.world.font import text_mask
from spotlight_jax.world.grammar import PromptSpec, parse

_CANDIDATES = 64  # placement candidates drawn at once per object
_ATTEMPTS = 60  # full-layout retries before giving up


@functools.lru_cache(maxsize=1024)
def object_mask(shape: str, s: int, bar_thickness: float = DEFAULT.bar_thickness) -> np.ndarray:
    """bool [s, s] mask of one object of `shape` in its s x s box, as the renderer paints it.

    Compact shapes fill the box (`shape_mask`); a bar is a full-width band of
    `round(bar_thickness * s)` rows across the middle of the box, a column the same band turned
    upright. The detector compares elongated components with this mask.
    """
    if shape in ELONGATED_SHAPES:
        t = max(1, round(bar_thickness * s))
        m = np.zeros((s, s), bool)
        m[(s - t) // 2 : (s - t) // 2 + t, :] = True
        if shape == "column":
            m = m.T.copy()
        m.setflags(write=False)
        return m
    return shape_mask(shape, s, s)


@functools.lru_cache(maxsize=1024)
def shape_mask(shape: str, h: int, w: int) -> np.ndarray:
    """bool [h, w] mask of a compact `shape` inscribed in an h x w box (pixel-center sampling).

    Every row and column of the box is non-empty, so the mask's bounding box is the whole box; the
    detector compares compact components with these same masks drawn in their bounding box.
    """
    yc = (np.arange(h) + 0.5)[:, None]
    xc = (np.arange(w) + 0.5)[None, :]
    if shape == "square":
        m = np.ones((h, w), bool)
    elif shape == "circle":
        m = ((xc - w / 2) / (w / 2)) ** 2 + ((yc - h / 2) / (h / 2)) ** 2 <= 1.0
        # Tiny boxes can lose the row/column extremes; keep the box tight.
        m[h // 2, :] = True
        m[:, w // 2] = True
    elif shape == "triangle":
        # Apex up: half-width grows linearly from the top row (>= 1 px) to the full base.
        half = (np.arange(h)[:, None] + 1) / h * (w / 2)
        m = np.abs(xc - w / 2) <= half + 1e-9
    else:
        raise ValueError(f'unknown compact shape "{shape}"; known: {", ".join(COMPACT_SHAPES)}')
    m = np.broadcast_to(m, (h, w)).copy()
    m.setflags(write=False)
    return m


def _as_spec(p: str | PromptSpec, cfg: WorldConfig) -> PromptSpec:
    return p if isinstance(p, PromptSpec) else parse(p, cfg)


def _sep_ok(y, x, s, boxes, gap):
    """bool [K]: candidate boxes (y, x, s) keep `gap` px from every placed box."""
    ok = np.ones(y.shape, bool)
    for by, bx, bs in boxes:
        apart_x = (x + s + gap <= bx) | (bx + bs + gap <= x)
        apart_y = (y + s + gap <= by) | (by + bs + gap <= y)
        ok &= apart_x | apart_y
    return ok


def layout(spec: PromptSpec, rng: np.random.Generator, cfg: WorldConfig = DEFAULT):
    """Random object boxes for an object prompt: list of (y, x, size, color, shape)."""
    objs = [(g.color, g.shape) for g in spec.groups for _ in range(g.count)]
    n, S, m, gap = len(objs), cfg.image_size, cfg.edge_margin, cfg.object_gap
    lo, hi = cfg.size_range
    for attempt in range(_ATTEMPTS):
        # Shrink the largest allowed size on repeated failure so crowded prompts still fit.
        cap = max(lo, hi - attempt // 10)
        sizes = rng.integers(lo, cap + 1, size=n)
        boxes: list[tuple[int, int, int]] = []
        start = 0
        if spec.relation is not None:
            (sa, sb), K = sizes[:2], _CANDIDATES
            ya = rng.integers(m, S - m - sa + 1, size=K)
            xa = rng.integers(m, S - m - sa + 1, size=K)
            yb = rng.integers(m, S - m - sb + 1, size=K)
            xb = rng.integers(m, S - m - sb + 1, size=K)
            ok = {
                "left": xa + sa + gap <= xb,
                "right": xb + sb + gap <= xa,
                "above": ya + sa + gap <= yb,
                "below": yb + sb + gap <= ya,
            }[spec.relation]
            idx = np.flatnonzero(ok)
            if idx.size == 0:
                continue
            i = idx[0]
            boxes = [(int(ya[i]), int(xa[i]), int(sa)), (int(yb[i]), int(xb[i]), int(sb))]
            start = 2
        for k in range(start, n):
            s = int(sizes[k])
            y = rng.integers(m, S - m - s + 1, size=_CANDIDATES)
            x = rng.integers(m, S - m - s + 1, size=_CANDIDATES)
            idx = np.flatnonzero(_sep_ok(y, x, s, boxes, gap))
            if idx.size == 0:
                break
            boxes.append((int(y[idx[0]]), int(x[idx[0]]), s))
        if len(boxes) == n:
            return [(*b, *o) for b, o in zip(boxes, objs)]
    raise ValueError(
        f"could not place {n} objects for {spec} in {S}x{S} px after {_ATTEMPTS} attempts; "
        "reduce the count or the object size"
    )


def _paint(img: np.ndarray, spec: PromptSpec, rng: np.random.Generator, cfg: WorldConfig):
    S, m = cfg.image_size, cfg.edge_margin
    if spec.kind == "text":
        mask = text_mask(spec.text, cfg.glyph_scale)
        h, w = mask.shape
        y = int(rng.integers(m, S - m - h + 1))
        x = int(rng.integers(m, S - m - w + 1))
        img[y : y + h, x : x + w][mask] = PALETTE[cfg.text_color]
        return
    for y, x, s, color, shape in layout(spec, rng, cfg):
        img[y : y + s, x : x + s][object_mask(shape, s, cfg.bar_thickness)] = PALETTE[color]


def render(
    prompt: str | PromptSpec, rng: np.random.Generator, cfg: WorldConfig = DEFAULT
) -> np.ndarray:
    """float32 [H, W, 3] in [0, 1]: one random image satisfying `prompt`."""
    img = np.empty((cfg.image_size, cfg.image_size, 3), np.float32)
    img[:] = cfg.background
    _paint(img, _as_spec(prompt, cfg), rng, cfg)
    return img


def sample_batch(
    prompts: Sequence[str | PromptSpec], rng: np.random.Generator, cfg: WorldConfig = DEFAULT
) -> np.ndarray:
    """float32 [B, H, W, 3]: one random image per prompt."""
    if isinstance(prompts, str):
        raise ValueError("sample_batch expects a list of prompts, got a single str")
    out = np.empty((len(prompts), cfg.image_size, cfg.image_size, 3), np.float32)
    out[:] = cfg.background
    for i, p in enumerate(prompts):
        _paint(out[i], _as_spec(p, cfg), rng, cfg)
    return out


def data_stream(
    prompts: Sequence[str],
    batch_size: int,
    seed: int,
    cfg: WorldConfig = DEFAULT,
    balance_kinds: bool = True,
) -> Iterator[tuple[list[str], np.ndarray]]:
    """Endless pretraining stream of (prompts [B], images float32 [B, H, W, 3]).

    With `balance_kinds` each example first draws a task kind uniformly among the kinds present,
    then a prompt of that kind, so the few single-object prompts are not drowned by the ~200
    position prompts; otherwise prompts are drawn uniformly. Deterministic given `seed`.
    """
    prompts = list(prompts)
    if not prompts:
        raise ValueError("data_stream needs at least one prompt")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    specs = [parse(p, cfg) for p in prompts]  # fail fast on a malformed prompt
    by_kind = [np.array([i for i, s in enumerate(specs) if s.kind == k]) for k in KINDS]
    by_kind = [ix for ix in by_kind if ix.size]
    rng = np.random.default_rng(seed)
    while True:
        if balance_kinds:
            kinds = rng.integers(len(by_kind), size=batch_size)
            idx = [int(by_kind[k][rng.integers(by_kind[k].size)]) for k in kinds]
        else:
            idx = rng.integers(len(prompts), size=batch_size).tolist()
        yield [prompts[i] for i in idx], sample_batch([specs[i] for i in idx], rng, cfg)
