"""A sharded update: one optimizer step's rows cut into shards that anyone may compute.

An objective's loss is a sum over rows (nft: images x flow times; Flow-GRPO: trajectories x
trained steps) divided by a count fixed before the step (the batch's rows; GRPO's trajectories
with a non-zero advantage), so its gradient is the sum of the shards' gradients, each shard's
loss taking the *whole* step's count as its divisor. :class:`ShardedStep` is one optimizer step
in that form: ``compute(i)`` is shard ``i``'s gradient and metric sums with the weights of the
moment (θ_k: whoever computes it must hold exactly them), ``apply(results)`` sums the shards in
index order (a fixed order, so the step is the same whoever computed what) and takes the
optimizer step.

A trainer's ``update_sharded(batch, key, step, shards, run)`` yields its steps to ``run``, which
decides who computes which shard (the trainer's mesh, spot groups, a recomputation after a
preemption) and returns one result per shard index; the step then equals the trainer's
single-program ``update`` to float rounding (the summation order differs).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

MAX_METRICS = frozenset({"ratio_dev", "rollout_logp_dev", "rollout_logp_gap_by_step"})
"""Shard metrics combined by maximum (every other one is a sum of per-shard sums)."""


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """Shard ``index``'s gradient (a tree like the trainable weights, already divided by the
    step's count) and its metric sums (also divided by it; maxima for :data:`MAX_METRICS`)."""

    index: int
    grads: object
    metrics: Mapping


@dataclasses.dataclass(frozen=True)
class ShardedStep:
    """One optimizer step of an update, cut into ``shards`` shards of ``rows`` rows each.

    ``version``: the optimizer steps taken before this one in the trainer's lifetime (the
    weights a shard must be computed with). ``compute(i)`` returns shard ``i``'s
    :class:`ShardResult`; ``apply(results)`` takes the step from one result per index.

    ``inputs(i)``: what another process needs to compute shard ``i``, ``(weights, rows)``: the
    step's weights (the same for every shard: sent once) and the shard's own arguments; there
    the trainer class's ``shard_program(graphdef, rl_config, sampler)`` turns them, with that
    process's resident base, into the shard's gradient and metric sums (what ``compute`` gives).
    """

    shards: int
    rows: int
    version: int
    compute: Callable[[int], ShardResult]
    apply: Callable[[Sequence[ShardResult]], dict]
    inputs: Callable[[int], tuple] | None = None


def check_shards(n: int, shards: int, what: str) -> int:
    """Rows per shard of ``n`` rows in ``shards`` shards, or a one-line error naming the fix."""
    if shards < 1 or n % shards:
        raise ValueError(f"{shards} shards must be >= 1 and divide the {n} {what} of an "
                         f"optimizer step (e.g. {shard_count(n, shards)})")
    return n // shards


def shard_count(n: int, most: int) -> int:
    """The shards of a step of ``n`` samples: the largest divisor of ``n`` not above ``most``
    (``deployment.update_shards``), so every shard has the same rows (one compiled program)."""
    return max(d for d in range(1, max(min(n, most), 1) + 1) if n % d == 0)


def in_order(results: Sequence[ShardResult], shards: int) -> list[ShardResult]:
    """``results`` sorted by index, checked to hold each of ``0 .. shards-1`` exactly once (a
    shard summed twice, or one missing, would change the step)."""
    by_index: dict[int, ShardResult] = {}
    for r in results:
        if r.index in by_index:
            raise ValueError(f"shard {r.index} was given twice; a shard is summed once")
        if not 0 <= r.index < shards:
            raise ValueError(f"shard index {r.index} is outside 0..{shards - 1}")
        by_index[r.index] = r
    missing = sorted(set(range(shards)) - set(by_index))
    if missing:
        raise ValueError(f"shards {missing} have no result; every shard is needed for the step")
    return [by_index[i] for i in range(shards)]


def sum_results(results: Sequence[ShardResult], shards: int):
    """``(grads, metrics)``: the shards' gradients summed in index order, their metrics combined
    (sums; maxima for :data:`MAX_METRICS`; ``trained_by_step`` and other arrays elementwise)."""
    ordered = in_order(results, shards)
    grads = ordered[0].grads
    for r in ordered[1:]:
        grads = jax.tree.map(jnp.add, grads, r.grads)
    metrics = {}
    for key in ordered[0].metrics:
        vals = [np.asarray(jax.device_get(r.metrics[key])) for r in ordered]
        if key in MAX_METRICS:
            metrics[key] = np.max(np.stack(vals), axis=0)
        else:
            total = vals[0]
            for v in vals[1:]:
                total = total + v
            metrics[key] = total
    return grads, metrics


def slice_rows(tree, start: int, stop: int):
    """Rows ``start:stop`` (axis 0) of every array of ``tree``."""
    return jax.tree.map(lambda a: a[start:stop], tree)


def run_locally(step: ShardedStep) -> list[ShardResult]:
    """Every shard of ``step`` computed here, in order: the reference schedule."""
    return [step.compute(i) for i in range(step.shards)]
