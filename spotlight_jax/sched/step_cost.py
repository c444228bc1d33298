"""How long a group takes for a rollout step, and how much work it should pull.

The scheduler needs two numbers per SP group: the duration of one denoising call (for the
virtual clock of the simulation) and its *capacity* (throughput, for sizing the batch it pulls).
:class:`StepCost` is a small linear model of both. Any object with ``rollout_step(batch, sp)``
(seconds of one denoising step of ``batch`` samples on ``sp`` devices) can stand in for it, e.g.
the project's deployment profiles in ``emulation.cost_models``; :func:`capacity_of` derives the
capacity from that method alone.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Linear step-time model of an SP group.

    One denoising step of ``batch`` samples on ``sp`` devices takes
    ``call_overhead_s + batch * sample_step_s / speedup(sp)`` with
    ``speedup(sp) = sp * sp_efficiency ** log2(sp)`` (each doubling of the SP degree keeps
    ``sp_efficiency`` of the ideal speed-up: the all-to-all / ring traffic). Committing a request's
    state costs ``commit_s`` (device-to-host copy of its latents + the queue round trip).
    Defaults are round numbers of the order of a 20B MMDiT step on one H100; the benchmark states
    what it uses.
    """

    sample_step_s: float = 1.0
    call_overhead_s: float = 0.01
    sp_efficiency: float = 0.9
    commit_s: float = 0.02

    def speedup(self, sp: int) -> float:
        return sp * self.sp_efficiency ** math.log2(sp) if sp > 1 else 1.0

    def rollout_step(self, batch: int, sp: int = 1) -> float:
        return self.call_overhead_s + batch * self.sample_step_s / self.speedup(sp)

    def capacity(self, sp: int) -> float:
        return capacity_of(self, sp)


def capacity_of(cost, sp: int, ref_batch: int = 1) -> float:
    """Throughput of an SP group relative to one device: sample-steps per second at
    ``ref_batch``, divided by that of one device. More devices -> larger capacity -> larger
    batches pulled."""
    return (ref_batch / cost.rollout_step(ref_batch, sp)) / (ref_batch / cost.rollout_step(
        ref_batch, 1))
