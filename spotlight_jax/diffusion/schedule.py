"""Flow-matching sigma schedules and training-time sampling of t."""
from __future__ import annotations

import jax
import numpy as np


def shifted_sigmas(num_steps: int, shift: float = 1.0) -> np.ndarray:
    """``[num_steps + 1]`` sigmas from 1 to 0: ``shift*s / (1 + (shift-1)*s)`` on a linear grid."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    s = np.linspace(1.0, 0.0, num_steps + 1, dtype=np.float64)
    return (shift * s / (1 + (shift - 1) * s)).astype(np.float32)


def sample_t(key, batch: int, *, kind: str = "logit_normal", shift: float = 1.0,
             mean: float = 0.0, std: float = 1.0):
    """Training timesteps in (0, 1): ``uniform`` or ``logit_normal``, then an SD3-style shift.

    A shift > 1 moves weight toward high noise, where the layout of the image is decided.
    """
    if kind == "uniform":
        t = jax.random.uniform(key, (batch,), minval=1e-4, maxval=1 - 1e-4)
    elif kind == "logit_normal":
        t = jax.nn.sigmoid(mean + std * jax.random.normal(key, (batch,)))
    else:
        raise ValueError(f"unknown timestep sampling {kind!r}; choose 'uniform' or 'logit_normal'")
    return shift * t / (1 + (shift - 1) * t)
