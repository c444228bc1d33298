"""One metrics interface: JSONL + TensorBoard event files, written by process 0 only."""
from __future__ import annotations

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


class MetricWriter:
    """Appends ``{"step": s, "time": t, **metrics}`` lines to ``<workdir>/<name>.jsonl`` and the
    scalar ones to TensorBoard (``<workdir>/tb``)."""

    def __init__(self, workdir: str, name: str = "metrics", tensorboard: bool = True):
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(workdir, f"{name}.jsonl")
        self._tb = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            if tensorboard:
                try:
                    from tensorboardX import SummaryWriter
                    self._tb = SummaryWriter(os.path.join(workdir, "tb", name))
                except ImportError:  # pragma: no cover - optional
                    self._tb = None

    def write(self, step: int, **metrics):
        if not self.enabled:
            return
        row = {"step": int(step), "time": time.time(), **{k: _plain(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()

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


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
