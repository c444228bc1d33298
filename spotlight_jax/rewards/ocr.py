"""OCR reward for text prompts: Flow-GRPO's `max(1 - edit_distance(read, target) / len(target), 0)`.

The "OCR model" is the world's template-matching reader (`spotlight_jax.world.detect.read_text`):
it segments text-colored pixels, infers the font scale from the text height, slices glyphs at the
font's pitch and matches each to the 3x5 digit templates. An image with no text reads as "" and
scores 0. Only text prompts ('the text "37"') have a target: any other prompt raises ValueError,
as does a malformed one, instead of silently scoring 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spotlight_jax.world.config import DEFAULT, WorldConfig
from spotlight_jax.world.detect import as_images, glyph_distances, read_glyphs, read_text
from spotlight_jax.world.font import DIGITS
from spotlight_jax.world.grammar import parse


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit-cost insertions, deletions and substitutions)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def ocr_score(recognized: str, target: str) -> float:
    """max(1 - edit_distance(recognized, target) / len(target), 0)."""
    if not target:
        raise ValueError("OCR target must be non-empty")
    return max(1.0 - edit_distance(recognized, target) / len(target), 0.0)


# Graded glyph credit reaches 0 when the asked digit's template is this many font cells (of 15)
# farther from the drawn glyph than the template it reads as.
GRADED_GLYPH_CELLS = 4.0


def graded_ocr_score(cells: np.ndarray, target: str) -> float:
    """`ocr_score` with partial credit per glyph: a reward shaped for RL, same optimum.

    ``cells`` ``[n, 5, 3]`` are the image's glyphs (`world.detect.glyph_cells`). When ``n``
    equals ``len(target)``, glyph ``i`` scores 1 if it reads as the asked digit, else
    ``0.5 * clip(1 - gap / GRADED_GLYPH_CELLS, 0, 1)`` with ``gap`` how much farther (L1, in
    font cells) the asked digit's template is than the nearest one: a slope from a wrong glyph
    toward the right one instead of the edit distance's cliff (shape credit does the same in
    `geneval_lite`). The score is the larger of the glyphs' mean and `ocr_score`, so it is 1
    exactly when the text reads right and never below the OCR reward.
    """
    d = glyph_distances(cells)
    read = read_glyphs(cells)
    score = ocr_score(read, target)
    if len(read) != len(target):
        return score
    per = []
    for i, ch in enumerate(target):
        t = DIGITS.index(ch)
        if read[i] == ch:
            per.append(1.0)
        else:
            gap = d[i, t] - d[i].min()
            per.append(0.5 * float(np.clip(1.0 - gap / GRADED_GLYPH_CELLS, 0.0, 1.0)))
    return max(score, float(np.mean(per)))


def text_targets(prompts: Sequence[str], cfg: WorldConfig) -> list[str]:
    targets = []
    for p in prompts:
        spec = parse(p, cfg)
        if spec.kind != "text":
            raise ValueError(
                f"ocr_lite scores text prompts only (like 'the text \"37\"'); "
                f"{p!r} is a {spec.kind} prompt"
            )
        targets.append(spec.text)
    return targets


def make_ocr_lite(cfg: WorldConfig | None = None):
    """An `ocr_lite` reward for world `cfg` (None: the default world at the images' size)."""

    def ocr_lite(images, prompts: Sequence[str]) -> np.ndarray:
        """float32 [B]: max(1 - edit_distance(read, target) / len(target), 0) per image."""
        x = as_images(images)
        c = cfg if cfg is not None else DEFAULT.at_size(x.shape[1])
        if len(prompts) != x.shape[0]:
            raise ValueError(f"{x.shape[0]} images but {len(prompts)} prompts")
        targets = text_targets(prompts, c)
        read = read_text(x, c)
        return np.array([ocr_score(r, t) for r, t in zip(read, targets)], np.float32)

    return ocr_lite


ocr_lite = make_ocr_lite()
