"""Runner layer: post-training runs of every mode on top of the library layers.

``build`` makes a run's state once from its spec (``build_run``; ``build_and_run`` then runs
it); ``loop.run`` is the run (resume, hooks at their cadence, time budget) over that state;
``state`` holds what an iteration steps on and builds nothing; ``modes`` has one small class per
mode; ``update`` is the objective's update on a batch (advantages, whole or shared);
``shared_update`` plans a shared update; ``exploration`` is the seed exploration (stale weights
on spot devices); ``backends`` are the transports (rollouts on the trainer's devices, the pull
scheduler's emulated pool, the emulated spot fleet, the Ray hosts); ``hooks`` is what runs
beside the step (``checkpointing``: the run's checkpoints; ``outputs``: evaluations, sample
grids, the reward curve, the LoRA export); ``compare`` runs every mode and writes the report.
The learning is real computation; the time and dollar axes come from ``spotlight_jax.emulation``.
"""
from spotlight_jax.runner.build import build_and_run, build_run
from spotlight_jax.runner.compare import run_compare
from spotlight_jax.runner.hooks import Hooks
from spotlight_jax.runner.loop import run
from spotlight_jax.runner.modes import MODES
from spotlight_jax.runner.state import RunState, iteration_prompts

__all__ = ["MODES", "Hooks", "RunState", "build_and_run", "build_run", "iteration_prompts",
           "run", "run_compare"]
