"""Runner layer: post-training runs of every mode on top of the library layers.

Reading order, one run and one iteration of it:

1. ``base_model.load_or_pretrain_base``: the base the run post-trains (a diffusers folder, a
   matching shipped checkpoint, ``<workdir>/base``, else pretraining now).
2. ``build.build_run``: the run built once from its ``RunSpec`` into a ``state.RunState``
   (mesh, the objective's trainer, rewards resolved by name, samplers, prompts, rollout engine,
   emulated deployment, planner, and the transports in ``backends``), then the mode
   (``modes.make_mode``). Nothing later goes back to the config.
3. ``loop.run``: resumes from the newest checkpoint (``checkpointing``), evaluates iteration 0,
   then steps ``RunState.step(k)`` until the iteration or RL-minute budget ends, running the
   ``hooks`` at their cadence (``outputs``: held-out evaluation and sample grids, the reward
   curve, the LoRA export; ``checkpointing``: the full state).
4. ``modes.Mode.step(state, k)``, one iteration: the prompts of k; ``rollout_phase`` (the seeds,
   the batch rolled out and rewarded on a backend: ``backends.rollouts.DirectRollouts`` on the
   trainer's devices, ``backends.scheduled`` the pull scheduler's emulated pool, the Ray hosts);
   ``train_phase``, the objective's update (``update.train_on``: advantages, then the whole
   update or one shared with the spot groups, ``shared_update``), with ``spotlight``'s
   exploration of the next seeds on the stale weights beside it (``exploration``); the clock
   charged for each phase; the metrics row.
5. ``summary``: the end-of-run table; ``compare`` runs every mode and writes the report;
   ``dry_run`` sizes a config without allocating it.

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
