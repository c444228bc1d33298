"""Plots people would rather look at than read: image grids and reward curves (matplotlib Agg).

Several runs' held-out curves as mean and spread: :func:`group_curves` (its command line is
``python -m spotlight_jax.tools.seed_curves``).
"""
from __future__ import annotations

import os

import numpy as np

from spotlight_jax.io.metrics import read_jsonl


def filmstrips(clips, gap: int = 1) -> np.ndarray:
    """Clips ``[N, F, H, W, C]`` -> filmstrips ``[N, H, F W + (F - 1) gap, C]``: each clip's
    frames side by side, left to right, split by ``gap`` gray columns."""
    clips = np.asarray(clips)
    n, f, h, w, c = clips.shape
    out = np.full((n, h, f * w + (f - 1) * gap, c), 0.5, np.float32)
    for i in range(f):
        out[:, :, i * (w + gap):i * (w + gap) + w] = clips[:, i]
    return out


def _as_tiles(images, cols: int):
    """``(tiles [N, H, W, C], cols)``: images as they are, clips as filmstrips in fewer columns
    (an even number, so before/after pairs stay side by side)."""
    images = np.asarray(images)
    if images.ndim == 5:
        frames = images.shape[1]
        return filmstrips(images), max(2, (cols // frames) // 2 * 2)
    return images, cols


def image_grid(images, cols: int = 8, pad: int = 1) -> np.ndarray:
    """``[N, H, W, C]`` in [0, 1] (or clips ``[N, F, H, W, C]``, as filmstrips) -> one
    ``uint8`` grid image."""
    images, cols = _as_tiles(images, cols)
    n, h, w, c = images.shape
    rows = -(-n // cols)
    grid = np.ones((rows * (h + pad) + pad, cols * (w + pad) + pad, c), np.float32)
    for i, img in enumerate(images):
        r, k = divmod(i, cols)
        grid[pad + r * (h + pad):pad + r * (h + pad) + h, pad + k * (w + pad):
             pad + k * (w + pad) + w] = img
    return (np.clip(grid, 0, 1) * 255).astype(np.uint8)


def save_grid(path: str, images, cols: int = 8, scale: int = 4, captions=None) -> None:
    """Images ``[N, H, W, 3]`` in [0, 1] as a ``cols``-wide grid, each enlarged ``scale`` times;
    with ``captions`` (one string per image, e.g. its prompt) written under each image. Clips
    ``[N, F, H, W, 3]`` are drawn as filmstrips (:func:`filmstrips`)."""
    import textwrap  # noqa: PLC0415

    from PIL import Image, ImageDraw, ImageFont  # noqa: PLC0415

    images, cols = _as_tiles(images, cols)
    if captions is None:
        g = Image.fromarray(image_grid(images, cols))
        g.resize((g.width * scale, g.height * scale), Image.NEAREST).save(path)
        return
    if len(captions) != len(images):
        raise ValueError(f"{len(captions)} captions for {len(images)} images")
    h, w = images.shape[1] * scale, images.shape[2] * scale
    font = ImageFont.load_default()
    width = max(8, w // 6)                       # the default font is ~6 px per character
    lines = [textwrap.wrap(str(c), width)[:3] for c in captions]
    strip = 12 * max(1, max(len(x) for x in lines)) + 4
    rows = -(-len(images) // cols)
    canvas = Image.new("RGB", (cols * (w + 2), rows * (h + strip + 2)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (img, text) in enumerate(zip(images, lines)):
        x, y = (i % cols) * (w + 2), (i // cols) * (h + strip + 2)
        tile = Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8))
        canvas.paste(tile.resize((w, h), Image.NEAREST), (x, y))
        for j, line in enumerate(text):
            draw.text((x + 2, y + h + 2 + 12 * j), line, fill="black", font=font)
    canvas.save(path)


def moving_average(y, window: int) -> np.ndarray:
    """Trailing mean of ``y`` over ``window`` points: ``out[i]`` is the mean of
    ``y[max(0, i - window + 1) : i + 1]``, so the first ``window - 1`` points average the points
    so far (no padding, no lag beyond the window)."""
    if int(window) != window or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1:
        raise ValueError(f"y must be one-dimensional, got shape {y.shape}")
    window = int(window)
    csum = np.concatenate([[0.0], np.cumsum(y)])
    end = np.arange(1, len(y) + 1)
    start = np.maximum(0, end - window)
    return (csum[end] - csum[start]) / (end - start)


def plot_curves(path: str, series: dict, xlabel: str = "iteration", ylabel: str = "reward",
                title: str = "", smooth: dict | None = None) -> None:
    """``series``: name -> (x, y) or (x, mean, lo, hi) for a shaded spread. ``smooth``: name
    -> window, for (x, y) series drawn faint with their trailing :func:`moving_average` over
    ``window`` points (one per x step, e.g. iteration) drawn bold on top."""
    plot_panels(path, {ylabel: series}, xlabel=xlabel, title=title, smooth=smooth)


def plot_panels(path: str, panels: dict, xlabel: str = "iteration", title: str = "",
                smooth: dict | None = None) -> None:
    """Side-by-side axes, one per ``panels`` entry (its y label -> a :func:`plot_curves`
    series dict): quantities of different scales (a reward mix's terms) each on its own axis.
    ``smooth`` as in :func:`plot_curves`, for the series of that name in any panel."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    smooth = smooth or {}
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (ylabel, series) in zip(axes[0], panels.items()):
        for name, s in series.items():
            if len(s) == 4:
                x, m, lo, hi = s
                ax.plot(x, m, label=name)
                ax.fill_between(x, lo, hi, alpha=0.25)
            elif name in smooth:    # raw points faint and thin, the trend bold, both under
                                    # the other series (e.g. sparse held-out points)
                x, y = s
                w = smooth[name]
                (raw,) = ax.plot(x, y, marker=".", markersize=3, linewidth=0.6, alpha=0.35,
                                 zorder=1, label=f"{name}, per {xlabel}")
                ax.plot(x, moving_average(y, w), color=raw.get_color(), linewidth=2.2,
                        zorder=1.5, label=f"{name}, {w}-{xlabel} moving average")
            else:
                ax.plot(*s, label=name, marker=".")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        (axes[0][0].set_title if len(panels) == 1 else fig.suptitle)(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def gain_panels(path: str, panels: dict, target_gain: float | None = None,
                xlabel: str = "emulated hours") -> None:
    """One axis per ``panels`` entry (a title, e.g. a trace -> ``{name: [(x, y), ...]}``): every
    run of a name drawn in that name's colour (one legend entry per name, its run count), y as
    the gain over the run's own first point, and the target gain as a dashed line. What a grid
    of seeds looks like at a glance: how far apart the modes' bundles are, and how wide each."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, by_name) in zip(axes[0], panels.items()):
        for i, (name, runs) in enumerate(by_name.items()):
            colour = f"C{i}"
            for j, (x, y) in enumerate(runs):
                y = np.asarray(y, float)
                ax.plot(x, y - y[0], color=colour, alpha=0.75, linewidth=1.2, marker=".",
                        markersize=2.5, label=f"{name} ({len(runs)} runs)" if j == 0 else None)
        if target_gain is not None:
            ax.axhline(target_gain, color="0.3", linestyle="--", linewidth=1,
                       label=f"target +{target_gain:g}")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out reward gain over the run's start")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def seed_curves(workdirs, key: str = "val_reward") -> dict:
    """Mean and min/max over runs of ``key`` at the evaluations every run has, by iteration.

    Reads each workdir's ``rl.jsonl`` (written by ``runner.loop.run``; keys spelled
    ``val/reward`` are matched too). Returns ``{"x", "mean", "lo", "hi", "runs"}``, ``runs``
    being the per-run ``(x, y)`` series.
    """
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


def alive_series(replay, devices_per_node: int, until_s: float | None = None):
    """Spot devices alive over time from a trace replay (``spotlight_jax.emulation.traces.Replay``):
    ``(times, alive)`` where ``alive[i]`` holds from ``times[i]`` to ``times[i + 1]``, starting
    at 0 and ending at ``until_s`` (default: the last event). Notices change nothing (the node
    is still up until its loss); a loss of a node already down is ignored, as the pool does."""
    up = set(replay.initial_alive)
    times, alive = [0.0], [len(up) * devices_per_node]
    for e in replay.events:
        if until_s is not None and e.time > until_s:
            break
        before = len(up)
        if e.kind == "join":
            up.add(e.node)
        elif e.kind == "loss":
            up.discard(e.node)
        if len(up) != before:
            times.append(float(e.time))
            alive.append(len(up) * devices_per_node)
    end = float(until_s) if until_s is not None else times[-1]
    times.append(max(end, times[-1]))
    alive.append(alive[-1])
    return np.asarray(times), np.asarray(alive)


def spot_timeline(path: str, replay, devices_per_node: int, history=(), until_s=None,
                  title: str = "") -> None:
    """Spot availability of a run on its emulated clock: devices alive (step line), notices,
    abrupt losses and joins (markers), iteration boundaries; below, each iteration's spot
    utilisation (busy / alive device time) and regroups from ``history`` (``rl.jsonl`` rows)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = [r for r in history if "vtime_s" in r]
    if until_s is None and rows:
        until_s = max(r["vtime_s"] for r in rows)
    t, a = alive_series(replay, devices_per_node, until_s)
    hours = 1 / 3600.0
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7, 4.5), sharex=True,
                                 gridspec_kw={"height_ratios": [2, 1]})
    ax.step(t * hours, a, where="post", color="tab:blue", label="spot devices alive")
    top = max(len(replay.nodes) * devices_per_node, 1)
    marks = {"notice": ("v", "tab:orange", "notice"), "loss": ("x", "tab:red", "loss"),
             "abrupt": ("X", "darkred", "abrupt loss"), "join": ("^", "tab:green", "join")}
    seen = set()
    for e in replay.events:
        if until_s is not None and e.time > until_s:
            break
        kind = "abrupt" if e.kind == "loss" and e.abrupt else e.kind
        m, col, label = marks[kind]
        ax.plot(e.time * hours, top + 0.6, m, color=col, ms=7,
                label=None if kind in seen else label)
        seen.add(kind)
    for r in rows:
        ax.axvline(r["vtime_s"] * hours, color="0.85", lw=0.6, zorder=0)
    ax.set_ylim(-0.3, top + 1.3)
    ax.set_ylabel("devices")
    ax.legend(loc="lower left", fontsize=7, ncol=3)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if rows:
        x = [r["vtime_s"] * hours for r in rows]
        bx.plot(x, [r.get("spot_util", np.nan) for r in rows], ".-",
                label="spot utilisation (run so far)")
        bx.set_ylim(0, 1.05)
        rg = np.diff([0] + [r.get("regroups", 0) for r in rows])
        for xi, n in zip(x, rg):
            if n:
                bx.annotate(f"{int(n)} regroup{'s' if n > 1 else ''}", (xi, 0.05), fontsize=6,
                            rotation=90, color="tab:purple")
        bx.legend(loc="upper left", fontsize=7)
    bx.set_xlabel("emulated time (hours)")
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def group_curves(out: str, groups, key: str = "val_reward", title: str = "") -> None:
    """Held-out curves of named groups of runs, ``groups = [(name, [run_dir, ...]), ...]``: one
    mean and min-max band per group in the plot ``out``, and a markdown table printed."""
    series = {}
    print("| group | iteration | mean | min | max |\n|---|---|---|---|---|")
    for name, runs in groups:
        c = seed_curves(runs, key)
        series[f"{name} (mean, min-max over {len(runs)} runs)"] = (c["x"], c["mean"], c["lo"],
                                                                  c["hi"])
        for x, m, lo, hi in zip(c["x"], c["mean"], c["lo"], c["hi"]):
            print(f"| {name} | {x} | {m:.3f} | {lo:.3f} | {hi:.3f} |")
    ylabel = "held-out reward (ODE)" if key == "val_reward" else key
    plot_curves(out, series, ylabel=ylabel, title=title)


def parse_groups(runs, group_specs, label: str) -> list[tuple[str, list[str]]]:
    """The command line's groups: the positional ``runs`` (named ``label``), then each
    ``--group NAME=RUN_DIR,RUN_DIR,...``."""
    groups = [(label, list(runs))] if runs else []
    for spec in group_specs:
        name, _, dirs = spec.partition("=")
        dirs = [d for d in dirs.split(",") if d]
        if not dirs:
            raise ValueError(f"--group {spec!r} names no run directory; use "
                             f"--group NAME=RUN_DIR,RUN_DIR,...")
        groups.append((name, dirs))
    if not groups:
        raise ValueError("give run directories, or one or more --group NAME=RUN_DIR,RUN_DIR,...")
    return groups
