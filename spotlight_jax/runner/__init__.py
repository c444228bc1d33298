"""Runner layer: post-training runs of every mode on top of the library layers.

``loop.run`` is the run (resume, hooks at their cadence, time budget); ``hooks`` what runs
beside the step (``checkpointing``: the run's checkpoints; ``outputs``: evaluations, sample
grids, the reward curve, the LoRA export); ``state`` holds what an iteration steps on; ``modes``
has one small class per mode; ``rollouts`` is the one rollout interface with its direct /
scheduled / Ray backends; ``exploration`` and ``fleet``
are the seed exploration (stale weights on spot devices); ``compare`` runs every mode and writes
the report. The learning is real computation; the time and dollar axes come from
``spotlight_jax.emulation``.
"""
from spotlight_jax.runner.compare import run_compare
from spotlight_jax.runner.hooks import Hooks
from spotlight_jax.runner.loop import run
from spotlight_jax.runner.modes import MODES
from spotlight_jax.runner.state import RunState, iteration_prompts

__all__ = ["MODES", "Hooks", "RunState", "iteration_prompts", "run", "run_compare"]
