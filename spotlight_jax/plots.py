"""Plots people would rather look at than read: image grids and reward curves (matplotlib Agg)."""
from __future__ import annotations

import numpy as np


def image_grid(images, cols: int = 8, pad: int = 1) -> np.ndarray:
    """``[N, H, W, C]`` in [0, 1] -> one ``uint8`` grid image."""
    images = np.asarray(images)
    n, h, w, c = images.shape
    rows = -(-n // cols)
    grid = np.ones((rows * (h + pad) + pad, cols * (w + pad) + pad, c), np.float32)
    for i, img in enumerate(images):
        r, k = divmod(i, cols)
        grid[pad + r * (h + pad):pad + r * (h + pad) + h, pad + k * (w + pad):
             pad + k * (w + pad) + w] = img
    return (np.clip(grid, 0, 1) * 255).astype(np.uint8)


def save_grid(path: str, images, cols: int = 8, scale: int = 4) -> None:
    from PIL import Image  # noqa: PLC0415

    g = Image.fromarray(image_grid(images, cols))
    g.resize((g.width * scale, g.height * scale), Image.NEAREST).save(path)


def plot_curves(path: str, series: dict, xlabel: str = "iteration", ylabel: str = "reward",
                title: str = "") -> None:
    """``series``: name -> (x, y) or (x, mean, lo, hi) for a shaded spread."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, s in series.items():
        if len(s) == 4:
            x, m, lo, hi = s
            ax.plot(x, m, label=name)
            ax.fill_between(x, lo, hi, alpha=0.25)
        else:
            ax.plot(*s, label=name, marker=".")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
