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


def seed_curves(workdirs, key: str = "val_reward") -> dict:
    """Mean and min/max over runs of ``key`` at the evaluations every run has, by iteration.

    Reads each workdir's ``rl.jsonl`` (written by ``controller.run``; keys spelled
    ``val/reward`` are matched too). Returns ``{"x", "mean", "lo", "hi", "runs"}``, ``runs``
    being the per-run ``(x, y)`` series.
    """
    import os  # noqa: PLC0415

    from spotlight_jax.metrics import read_jsonl  # noqa: PLC0415

    alt = key.replace("_", "/", 1)
    runs = []
    for w in workdirs:
        rows = read_jsonl(os.path.join(w, "rl.jsonl"))
        pts = {int(r["step"]): float(r.get(key, r.get(alt))) for r in rows
               if key in r or alt in r}
        if not pts:
            raise ValueError(f"{w}/rl.jsonl has no {key!r} entries")
        runs.append(pts)
    common = sorted(set.intersection(*(set(p) for p in runs)))
    ys = np.array([[p[x] for x in common] for p in runs])
    return {"x": common, "mean": ys.mean(0), "lo": ys.min(0), "hi": ys.max(0),
            "runs": [(sorted(p), [p[x] for x in sorted(p)]) for p in runs]}


def main(argv=None):
    """``python -m spotlight_jax.plots --out curve.png RUN_DIR [RUN_DIR ...] [--label NAME]``:
    held-out reward of several runs (e.g. seeds) as mean and min-max band, with a table."""
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="held-out reward")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    c = seed_curves(args.runs)
    plot_curves(args.out, {f"{args.label} (mean, min-max over {len(args.runs)} runs)":
                           (c["x"], c["mean"], c["lo"], c["hi"])},
                ylabel="held-out reward (ODE)", title=args.title)
    print("| iteration | mean | min | max |\n|---|---|---|---|")
    for x, m, lo, hi in zip(c["x"], c["mean"], c["lo"], c["hi"]):
        print(f"| {x} | {m:.3f} | {lo:.3f} | {hi:.3f} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
