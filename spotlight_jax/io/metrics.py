"""One metrics interface: JSONL + TensorBoard event files (+ optionally a Weights & Biases run),
written by process 0 only."""
from __future__ import annotations

import hashlib
import json
import math
import os
import time

import jax
import numpy as np


def _plain(v):
    if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "dtype"):
        v = np.asarray(v)
        return v.item() if v.ndim == 0 else v.tolist()
    return v


WANDB_MODES = ("off", "offline", "online")


class MetricWriter:
    """Appends ``{"step": s, "time": t, **metrics}`` lines to ``<workdir>/<name>.jsonl`` and the
    scalar ones to TensorBoard (``<workdir>/tb``); :meth:`image` adds a picture (a sample grid)
    to TensorBoard. With ``wandb='offline'`` or ``'online'`` the same scalars and pictures also
    go to a Weights & Biases run under ``<workdir>/wandb`` (``wandb`` is an optional
    dependency; offline needs no account, ``wandb sync`` uploads later). The run's id is a
    function of the workdir, so a resumed run continues the same W&B run."""

    def __init__(self, workdir: str, name: str = "metrics", tensorboard: bool = True,
                 wandb: str = "off", wandb_project: str = "spotlight_jax",
                 run_config: dict | None = None):
        if wandb not in WANDB_MODES:
            raise ValueError(f"wandb={wandb!r}: choose one of {WANDB_MODES}")
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(workdir, f"{name}.jsonl")
        self._tb = self._wandb = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            if tensorboard:
                try:
                    from tensorboardX import SummaryWriter
                    self._tb = SummaryWriter(os.path.join(workdir, "tb", name))
                except ImportError:  # pragma: no cover - optional
                    self._tb = None
            if wandb != "off":
                self._wandb = _wandb_run(workdir, name, wandb, wandb_project, run_config)

    def write(self, step: int, **metrics):
        if not self.enabled:
            return
        row = {"step": int(step), "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        scalars = {k: v for k, v in row.items() if k not in ("step", "time")
                   and isinstance(v, (int, float)) and math.isfinite(v)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=int(step))

    def image(self, step: int, key: str, image, caption: str = "") -> None:
        """A picture ``[H, W, 3]`` (uint8, or float in [0, 1]) at ``step``: TensorBoard and
        W&B (the JSONL holds numbers only)."""
        if not self.enabled:
            return
        img = np.asarray(image)
        if img.dtype != np.uint8:
            img = (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)
        if self._tb is not None:
            self._tb.add_image(key, img, step, dataformats="HWC")
            self._tb.flush()
        if self._wandb is not None:
            import wandb  # noqa: PLC0415 - optional dependency

            self._wandb.log({key: wandb.Image(img, caption=caption or None)}, step=int(step))

    def drop_after(self, step: int) -> int:
        """Removes the JSONL rows with ``step`` above the given one (a run resumed from an earlier
        checkpoint redoes them; kept, they would appear twice). Rewrites the file atomically;
        returns the number of rows dropped. TensorBoard's event files are append-only and keep
        them (TensorBoard shows the later value)."""
        if not self.enabled or not os.path.exists(self.path):
            return 0
        rows = read_jsonl(self.path)
        keep = [r for r in rows if r.get("step", 0) <= step]
        if len(keep) == len(rows):
            return 0
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in keep)
        os.replace(tmp, self.path)
        return len(rows) - len(keep)

    def close(self):
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_run(workdir: str, name: str, mode: str, project: str, run_config: dict | None):
    """A W&B run under ``<workdir>/wandb``, its id derived from the workdir (resumable)."""
    try:
        import wandb  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise ImportError(f"logging.wandb={mode!r} needs the wandb package: pip install -e "
                          "'.[wandb]' (or set --config.logging.wandb=off)") from None
    run_id = "spotlight-" + hashlib.sha1(
        f"{os.path.abspath(workdir)}:{name}".encode()).hexdigest()[:12]
    return wandb.init(project=project, dir=workdir, mode=mode, id=run_id, resume="allow",
                      name=os.path.basename(os.path.abspath(workdir)), config=run_config or {},
                      reinit="create_new")


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
