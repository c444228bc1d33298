"""JPEG compressibility reward, as in DDPO / Flow-GRPO: `-(JPEG bytes at quality 95) / 1000 / 500`.

A prompt-agnostic reward (prompts are accepted for the common signature and ignored): flatter,
simpler images compress better and score higher. Images in [0, 1] are rounded to uint8 and
encoded with Pillow at quality 95 (Pillow's default 4:2:0 subsampling), one image at a time.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image


def jpeg_bytes(image_uint8: np.ndarray, quality: int = 95) -> int:
    """Size in bytes of one uint8 [H, W, 3] image encoded as JPEG."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image_uint8)).save(buf, format="JPEG", quality=quality)
    return buf.tell()


def jpeg_compressibility(images, prompts: Sequence[str]) -> np.ndarray:
    """float32 [B]: -(JPEG size at quality 95 in bytes) / 1000 / 500 (i.e. -kB / 500)."""
    x = np.asarray(images, dtype=np.float32)
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"images must be [B, H, W, 3], got shape {x.shape}")
    if len(prompts) != x.shape[0]:
        raise ValueError(f"{x.shape[0]} images but {len(prompts)} prompts")
    if not np.isfinite(x).all():
        raise ValueError("images contain NaN or Inf")
    u8 = np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)
    sizes = np.array([jpeg_bytes(im) for im in u8], np.float64)
    return (-sizes / 1000.0 / 500.0).astype(np.float32)
