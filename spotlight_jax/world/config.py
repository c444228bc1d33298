"""Configuration of the synthetic world: palette, shapes, sizes, grammar limits, detector knobs.

One frozen dataclass, `WorldConfig`, is passed to every part of the world (grammar, renderer,
detector) and to the rewards built on it, so that the images a base model is pretrained on and the
detector that scores its samples always agree on colors, shapes and sizes.

The defaults are chosen for learnability by a tiny DiT with 4x4 patches on a 32x32 canvas (see
docs/world.md; an earlier world with gray/black backgrounds and small objects was not learned): one
black background, four saturated colors that are far apart in RGB, large objects (9-13 px, i.e. 2-3
patches wide), shapes that differ in extent (square, bar, column) rather than in sub-patch detail (a
base model trained on circles, squares and triangles drew the same blob for all three), at most 3
objects of a kind, and digits drawn 3x larger than their 3x5 font. Sizes given as `None` are derived
from `image_size`, so `WorldConfig(image_size=64)` is a consistent bigger world.
"""
from __future__ import annotations

import dataclasses

import numpy as np

# Every color the grammar knows, as RGB in [0, 1]. A world uses a subset (`WorldConfig.colors`);
# the tokenizer's vocabulary covers all of them so that it does not depend on the config.
PALETTE: dict[str, tuple[float, float, float]] = {
    "red": (1.0, 0.0, 0.0),
    "green": (0.0, 1.0, 0.0),
    "blue": (0.0, 0.0, 1.0),
    "yellow": (1.0, 1.0, 0.0),
    "magenta": (1.0, 0.0, 1.0),
    "cyan": (0.0, 1.0, 1.0),
    "orange": (1.0, 0.5, 0.0),
    "white": (1.0, 1.0, 1.0),
}
# Compact shapes fill a square box; elongated ones are a band across the middle of their box (a
# "bar" lies horizontally, a "column" stands), so they differ from a square in their extent, at the
# scale of whole 4x4 patches, rather than in sub-patch detail like a circle's rounded corners.
COMPACT_SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
ELONGATED_SHAPES: tuple[str, ...] = ("bar", "column")
KNOWN_SHAPES: tuple[str, ...] = COMPACT_SHAPES + ELONGATED_SHAPES
# Count words; index = count. "a" is the count word for one object.
COUNT_WORDS: tuple[str, ...] = ("", "a", "two", "three", "four", "five")
RELATIONS: tuple[str, ...] = ("left", "right", "above", "below")
KINDS: tuple[str, ...] = ("single", "counting", "two_object", "position", "text")


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """Everything that defines the synthetic world. Frozen, hashable, cheap to pass around.

    Attributes:
      image_size: side of the square RGB canvas, in pixels.
      colors: object colors (names from `PALETTE`), in a fixed order used everywhere.
      shapes: object shapes (subset of `KNOWN_SHAPES`).
      text_color: color of rendered digits; must not be an object color, so that text and objects
        separate.
      background: RGB of the single solid background.
      max_count: largest count in counting prompts (counts 2..max_count are enumerated).
      max_objects: most objects one prompt may ask for in total (renderer feasibility).
      object_size: (min, max) object side in px; None -> about 28%..41% of `image_size`.
      object_gap: minimum empty pixels between two objects' bounding boxes.
      edge_margin: minimum empty pixels between an object or text and the canvas border.
      text_lengths: allowed numbers of digits in text prompts.
      text_scale: pixels per font cell (3x5 cells per digit); None -> image_size / 8: at 32 px a
        cell is one 4x4 patch, so strokes are as wide as the tiny model's patches (at 3 px they
        fell inside patches and the base model drew no legible digit; 3 = the earlier worlds).
      val_fraction: fraction of each task kind held out for validation.
      split_seed: seed of the train/validation split.
      color_tolerance: a pixel farther than this (RGB Euclidean) from every palette color and from
        the background is treated as background by the detector.
      min_component_px: detector ignores connected components smaller than this; None -> 6 px at
        32x32, scaled with the image area.
      shape_min_iou: a component is classified as a shape only if its mask overlaps that shape's
        ideal template (drawn in the component's bounding box) with at least this IoU.
      shape_max_aspect: components whose bounding box is more elongated than this (long side /
        short side) get no compact shape (circle, square, triangle): those fill square boxes.
      shape_min_frac: components whose bounding box's short side (long side for bars and columns)
        is below this fraction of the smallest object size get no shape (a 4x4 patch-sized block
        is not a square of this world).
      bar_thickness: a bar's height (a column's width) as a fraction of its box side.
      bar_min_aspect: components less elongated than this (long side / short side) are not bars
        or columns.
      position_margin: centroid offset (fraction of image_size) that earns full credit for a
        relation; smaller correct offsets earn proportional credit.
    """

    image_size: int = 32
    colors: tuple[str, ...] = ("red", "green", "blue", "yellow")
    shapes: tuple[str, ...] = ("square", "bar", "column")
    text_color: str = "white"
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    max_count: int = 3
    max_objects: int = 4
    object_size: tuple[int, int] | None = None
    object_gap: int = 2
    edge_margin: int = 1
    text_lengths: tuple[int, ...] = (1, 2)
    text_scale: int | None = None
    val_fraction: float = 0.15
    split_seed: int = 0
    color_tolerance: float = 0.5
    min_component_px: int | None = None
    shape_min_iou: float = 0.75
    shape_max_aspect: float = 1.3
    shape_min_frac: float = 0.6
    bar_thickness: float = 0.45
    bar_min_aspect: float = 1.6
    position_margin: float = 0.1

    def __post_init__(self):
        def bad(msg):
            raise ValueError(f"invalid WorldConfig: {msg}")

        if self.image_size < 8:
            bad(f"image_size={self.image_size} is too small (need >= 8)")
        for c in (*self.colors, self.text_color):
            if c not in PALETTE:
                bad(f'unknown color "{c}"; known colors: {", ".join(PALETTE)}')
        if len(set(self.colors)) != len(self.colors) or not self.colors:
            bad(f"colors must be non-empty and unique, got {self.colors}")
        if self.text_color in self.colors:
            bad(f'text_color "{self.text_color}" is also an object color; pick another')
        if not self.shapes or any(s not in KNOWN_SHAPES for s in self.shapes):
            bad(f"shapes must be a non-empty subset of {KNOWN_SHAPES}, got {self.shapes}")
        if len(set(self.shapes)) != len(self.shapes):
            bad(f"shapes must be unique, got {self.shapes}")
        if not 1 <= self.max_count < len(COUNT_WORDS):
            bad(f"max_count={self.max_count} must be in 1..{len(COUNT_WORDS) - 1}")
        if self.max_objects < max(2, self.max_count):
            bad(f"max_objects={self.max_objects} must be >= max(2, max_count={self.max_count})")
        lo, hi = self.size_range
        if not 3 <= lo <= hi:
            bad(f"object_size must satisfy 3 <= min <= max, got {(lo, hi)}")
        # The renderer shrinks objects towards the minimum size when a layout does not fit, so the
        # smallest objects must fit side by side (needed for relations).
        if 2 * self.edge_margin + 2 * lo + self.object_gap > self.image_size:
            bad(
                f"two objects of {lo} px with gap {self.object_gap} and margin {self.edge_margin} "
                f"do not fit side by side in {self.image_size} px (needed for relations)"
            )
        if not self.text_lengths or min(self.text_lengths) < 1:
            bad(f"text_lengths must be positive, got {self.text_lengths}")
        s = self.glyph_scale
        n = max(self.text_lengths)
        if 2 * self.edge_margin + (4 * n - 1) * s > self.image_size or 5 * s > self.image_size:
            bad(f"{n} digits at text_scale {s} do not fit in {self.image_size} px")
        if not 0.0 < self.bar_thickness <= 0.6:
            bad(f"bar_thickness={self.bar_thickness} must be in (0, 0.6] (a bar is thinner than "
                "its box)")
        if not self.shape_max_aspect < self.bar_min_aspect <= 1.0 / self.bar_thickness:
            bad(f"bar_min_aspect={self.bar_min_aspect} must lie between shape_max_aspect="
                f"{self.shape_max_aspect} and 1 / bar_thickness = {1 / self.bar_thickness:.2f}")
        if not 0.0 < self.val_fraction < 1.0:
            bad(f"val_fraction={self.val_fraction} must be in (0, 1)")

    # Derived quantities (properties so that the dataclass stays a plain value).
    @property
    def size_range(self) -> tuple[int, int]:
        if self.object_size is not None:
            return tuple(int(v) for v in self.object_size)
        s = self.image_size
        return max(3, round(0.28 * s)), max(3, round(0.41 * s))

    @property
    def glyph_scale(self) -> int:
        if self.text_scale is not None:
            return int(self.text_scale)
        return max(1, round(self.image_size / 8))

    @property
    def min_px(self) -> int:
        if self.min_component_px is not None:
            return int(self.min_component_px)
        return max(2, round(6 * (self.image_size / 32) ** 2))

    @property
    def class_names(self) -> tuple[str, ...]:
        """Detector classes: index 0 is background, then object colors, then the text color."""
        return ("background", *self.colors, self.text_color)

    @property
    def class_rgb(self) -> np.ndarray:
        """float32 [n_classes, 3] RGB of each detector class (background first)."""
        rgb = [self.background] + [PALETTE[c] for c in (*self.colors, self.text_color)]
        return np.asarray(rgb, np.float32)

    def at_size(self, image_size: int) -> WorldConfig:
        """The same world at another canvas size (derived sizes rescale; explicit ones stay)."""
        if image_size == self.image_size:
            return self
        return dataclasses.replace(self, image_size=int(image_size))


DEFAULT = WorldConfig()
