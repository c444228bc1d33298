"""Timing calibration: the ``measured`` cost model from this machine's real operations.

:func:`calibrate` times the real rollout step and training step callables (median of repeats
after warm-up runs that absorb compilation) and fits ``fixed + per_sample x batch`` to the
rollout timings (:func:`fit_line`); the result is a :class:`MeasuredCost`, which a resumed run
restores from its checkpoint instead of re-measuring.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from spotlight_jax.emulation.cost_models import CostConfig, MeasuredCost, Workload, check_count


def median_time(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after ``warmup`` untimed runs.

    ``fn`` must block until its work is done (``jax.block_until_ready``), or the time is
    only JAX's dispatch time.
    """
    check_count(repeats, "repeats")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with a, b >= 0 (timing noise can push either below 0)."""
    if len(set(xs)) < 2:
        x = xs[0]
        return 0.0, statistics.mean(ys) / x
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
         / sum((x - mx) ** 2 for x in xs))
    a = my - b * mx
    if b < 0:
        return my, 0.0
    if a < 0:
        return 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return a, b


def calibrate(fn_rollout_step: Callable[[int], Any], fn_train_step: Callable[[], Any], *,
              rollout_batches: Sequence[int] = (1, 2), train_batch: int = 1,
              fn_reward: Callable[[], Any] | None = None, reward_batch: int = 1,
              fn_broadcast: Callable[[], Any] | None = None, repeats: int = 3,
              warmup: int = 1, cost: CostConfig | None = None,
              workload: Workload | None = None) -> MeasuredCost:
    """Times the real operations of this machine and returns a :class:`MeasuredCost`.

    Args:
      fn_rollout_step: ``fn(batch)`` runs one denoising step for ``batch`` trajectories
        (blocking); timed at each of ``rollout_batches`` to fit ``fixed + per_sample x batch``.
      fn_train_step: ``fn()`` runs one GRPO update on ``train_batch`` trajectories (blocking).
      fn_reward: optional ``fn()`` scoring ``reward_batch`` images; else
        ``cost.reward_s_per_image``.
      fn_broadcast: optional ``fn()`` moving the policy weights to another device set; else 0.
      repeats, warmup: median of ``repeats`` runs after ``warmup`` untimed ones (compilation).
      cost: supplies prices and the regroup constants (measured by ``bench.reconfig --stand_in``).
    """
    cost = cost or CostConfig(model="measured")
    workload = workload or Workload()
    batches = [check_count(b, "rollout batch") for b in rollout_batches]
    if not batches:
        raise ValueError("rollout_batches is empty; give at least one batch size")
    check_count(train_batch, "train_batch")
    check_count(reward_batch, "reward_batch")
    roll = [median_time(lambda b=b: fn_rollout_step(b), repeats, warmup) for b in batches]
    fixed, per_sample = fit_line(batches, roll)
    train = median_time(fn_train_step, repeats, warmup)
    timings: dict[str, Any] = {"rollout_step": {str(b): t for b, t in zip(batches, roll)},
                               "train_step": {"batch": train_batch, "s": train}}
    reward = cost.reward_s_per_image
    if fn_reward is not None:
        t = median_time(fn_reward, repeats, warmup)
        timings["reward"] = {"batch": reward_batch, "s": t}
        reward = t / reward_batch
    bcast = 0.0
    if fn_broadcast is not None:
        bcast = median_time(fn_broadcast, repeats, warmup)
        timings["broadcast"] = bcast
    return MeasuredCost(rollout_fixed_s=fixed, rollout_per_sample_s=per_sample,
                        train_per_sample_s=train / train_batch, reward_per_image_s=reward,
                        broadcast_s=bcast, prices=cost.prices, workload=workload,
                        regroup_shrink_s=cost.regroup_shrink_s,
                        regroup_grow_s=cost.regroup_grow_measured_s,
                        regroup_cold_s=cost.regroup_cold_s, timings=timings)
