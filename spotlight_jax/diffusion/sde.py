"""Flow-matching sampler steps with Flow-GRPO's exact log-probabilities.

Notation (Flow-GRPO's): flow time sigma in [0, 1] (1 = noise), velocity ``v = noise - x0``, step
``dt = sigma_next - sigma < 0``, noise level ``a``. All arithmetic is float32 even when the model
ran in bfloat16, because log-prob ratios of ~1e-4 are what PPO clips on.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _bcast(s, x):
    """Scalar or per-sample ``[B]`` sigma -> broadcastable against ``x`` ``[B, ...]``."""
    s = jnp.asarray(s, jnp.float32)
    return s.reshape(s.shape + (1,) * (x.ndim - s.ndim)) if s.ndim else s


def _mean_over_elements(a):
    return a.reshape(a.shape[0], -1).mean(axis=1)


def _noise(key, noise, x):
    if noise is not None:
        return noise.astype(jnp.float32)
    if key is None:
        raise ValueError("sampling needs `key` or `noise` (pass prev_sample= to only score)")
    return jax.random.normal(key, x.shape, jnp.float32)


def block_mean(a, p: int):
    """``[..., H, W, C] -> [..., H/p, W/p, C]``: means over ``p x p`` pixel blocks, per channel
    (of each frame of a video latent ``[B, F, H, W, C]``)."""
    *lead, h, w, c = a.shape
    return a.reshape(*lead, h // p, p, w // p, p, c).mean(axis=(-4, -2))


def block_project(a, p: int):
    """Orthogonal projection onto images constant on ``p x p`` blocks (per channel and
    frame)."""
    return jnp.repeat(jnp.repeat(block_mean(a, p), p, axis=-3), p, axis=-2)


def sde_step(x, v, sigma, sigma_next, *, noise_level, key=None, prev_sample=None,
             sigma_max=None, noise=None, noise_patch: int = 1):
    """One Flow-GRPO SDE step. Returns ``(prev_sample, log_prob, mean, std)``.

    ``std`` is ``std_t = a * sqrt(sigma / (1 - sigma_safe))`` (before the ``sqrt(-dt)`` factor);
    ``sigma_safe`` is ``sigma_max`` (the schedule's second sigma) where ``sigma == 1``. With
    ``prev_sample`` given the step only scores it; otherwise it samples with ``key`` (or the
    explicit standard-normal ``noise``). ``log_prob`` is averaged over all non-batch elements.

    ``noise_patch = p > 1`` (images ``[B, H, W, C]``): block noise. The diffusion acts only on
    the subspace of images constant on ``p x p`` blocks: its noise is the block mean of the
    standard-normal draw (the same low frequencies as the per-pixel step's noise, none of its
    within-block detail) and the score correction is projected onto that subspace too, so the
    step still preserves the ODE's marginals (an SDE with diffusion ``g^2 P`` and drift
    ``v - g^2 P score / 2``). The step is deterministic off the subspace, so ``log_prob`` is the
    density of the block coordinates (averaged over them): a policy over ``HWC / p^2``
    dimensions instead of ``HWC``, whose score-function gradient is correspondingly less noisy.
    """
    x = x.astype(jnp.float32)
    v = v.astype(jnp.float32)
    s = _bcast(sigma, x)
    s_next = _bcast(sigma_next, x)
    dt = s_next - s
    s_safe = s
    if sigma_max is not None:
        s_safe = jnp.where(s >= 1.0, _bcast(sigma_max, x), s)
    std_t = noise_level * jnp.sqrt(s / (1.0 - s_safe))
    mean = x * (1 + std_t**2 / (2 * s) * dt) + v * (1 + std_t**2 * (1 - s) / (2 * s)) * dt
    scale = std_t * jnp.sqrt(-dt)
    project, coords = (lambda a: a), (lambda a: a)
    if noise_patch > 1:
        project = functools.partial(block_project, p=noise_patch)
        # orthonormal coordinates of the block subspace: p * (block mean)
        coords = lambda a: noise_patch * block_mean(a, noise_patch)  # noqa: E731
        ode = x + v * dt
        mean = ode + project(mean - ode)
    if prev_sample is None:
        prev_sample = mean + scale * project(_noise(key, noise, x))
    prev_sample = prev_sample.astype(jnp.float32)
    y = coords(prev_sample - mean)
    log_prob = -(y**2) / (2 * scale**2) - jnp.log(scale) - _LOG_SQRT_2PI
    return prev_sample, _mean_over_elements(log_prob), mean, jnp.broadcast_to(std_t, x.shape[:1]
                                                                                + std_t.shape[1:])


def cps_step(x, v, sigma, sigma_next, *, noise_level, key=None, prev_sample=None,
             sigma_max=None, noise=None):
    """Flow-GRPO's coefficients-preserving sampler (``sde_type='cps'``); same return contract.

    ``std = sigma_next * sin(a*pi/2)``; log-prob is ``-(x_next - mean)^2`` averaged (constants
    dropped, as in the reference). ``sigma_max`` is accepted for signature parity and unused.
    """
    del sigma_max
    x = x.astype(jnp.float32)
    v = v.astype(jnp.float32)
    s = _bcast(sigma, x)
    s_next = _bcast(sigma_next, x)
    std = s_next * math.sin(noise_level * math.pi / 2)
    x0 = x - s * v
    x1 = x + (1 - s) * v
    mean = x0 * (1 - s_next) + x1 * jnp.sqrt(jnp.maximum(s_next**2 - std**2, 0.0))
    if prev_sample is None:
        prev_sample = mean + std * _noise(key, noise, x)
    prev_sample = prev_sample.astype(jnp.float32)
    log_prob = _mean_over_elements(-((prev_sample - mean) ** 2))
    return prev_sample, log_prob, mean, jnp.broadcast_to(std, x.shape[:1] + std.shape[1:])


def ode_step(x, v, sigma, sigma_next):
    """Plain Euler step of the probability-flow ODE (the evaluation sampler)."""
    x = x.astype(jnp.float32)
    return x + (_bcast(sigma_next, x) - _bcast(sigma, x)) * v.astype(jnp.float32)
