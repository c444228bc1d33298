"""A 3x5 bitmap font for the digits 0-9, shared by the renderer and the OCR reward.

Every glyph touches all four sides of its 3x5 cell box and every column of a glyph is non-empty,
so a rendered glyph's bounding box is exactly 3s x 5s at scale s and glyphs of a string are
separated by exactly one empty cell column. The OCR relies on both facts: it reads the scale from
the text height and slices glyphs at a pitch of 4 cells (see `spotlight_jax.world.detect`).
"""

from __future__ import annotations

import functools

import numpy as np

_ROWS = {
    "0": ("###", "#.#", "#.#", "#.#", "###"),
    "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"),
    "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"),
    "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"),
    "7": ("###", "..#", "..#", "..#", "..#"),
    "8": ("###", "#.#", "###", "#.#", "###"),
    "9": ("###", "#.#", "###", "..#", "###"),
}
GLYPH_H, GLYPH_W = 5, 3
DIGITS = "0123456789"
# bool [10, 5, 3]: the cell pattern of each digit.
TEMPLATES = np.array([[[ch == "#" for ch in row] for row in _ROWS[d]] for d in DIGITS], bool)


@functools.lru_cache(maxsize=64)
def glyph(digit: str, scale: int) -> np.ndarray:
    """bool [5*scale, 3*scale] pixel mask of one digit."""
    if digit not in _ROWS:
        raise ValueError(f"no glyph for {digit!r}; the font has digits 0-9 only")
    m = np.kron(TEMPLATES[DIGITS.index(digit)], np.ones((scale, scale), bool))
    m.setflags(write=False)
    return m


def text_size(n_chars: int, scale: int) -> tuple[int, int]:
    """(height, width) in pixels of `n_chars` glyphs with one empty cell column between them."""
    return GLYPH_H * scale, (GLYPH_W + 1) * scale * n_chars - scale


@functools.lru_cache(maxsize=2048)
def text_mask(text: str, scale: int) -> np.ndarray:
    """bool [5*scale, (4*len(text)-1)*scale] pixel mask of a digit string."""
    h, w = text_size(len(text), scale)
    m = np.zeros((h, w), bool)
    for i, ch in enumerate(text):
        x = i * (GLYPH_W + 1) * scale
        m[:, x : x + GLYPH_W * scale] = glyph(ch, scale)
    m.setflags(write=False)
    return m
