"""A run's checkpoints: the trainer's state parts, the run's metadata and the mode's own arrays.

One checkpoint holds everything a resumed run needs to repeat the same numbers: the trainer's
``state_parts`` (policy, optimizer, EMA, the nft sampling policy), the iteration and history,
the next iteration's seeds, the planner's and the emulated deployment's state (clock, trace
cursor), and the mode's extra arrays (``mode_<step>.npz`` beside the Orbax steps, written first:
a checkpoint never exists without them). The loop saves through a hook at
``checkpoint_every``.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from absl import logging

from spotlight_jax.io.checkpoints import RunCheckpointer


class RunCheckpoints:
    """The checkpoints of the run in ``workdir`` (``<workdir>/checkpoints``)."""

    def __init__(self, workdir: str, max_to_keep: int):
        self.ckpt = RunCheckpointer(os.path.join(workdir, "checkpoints"), max_to_keep,
                                    this_process_only=jax.process_count() > 1)

    @property
    def directory(self) -> str:
        return self.ckpt.directory

    @staticmethod
    def _tree(run):
        parts = {p: getattr(run.trainer, p) for p in run.trainer.state_parts}
        return {p: {} if v is None else v for p, v in parts.items()}

    def _extra_path(self, step: int) -> str:
        return os.path.join(self.ckpt.directory, f"mode_{step}.npz")

    def save(self, run) -> None:
        """Checkpoints ``run`` at its current iteration."""
        extra = run.mode.extra_state()
        if extra is not None and jax.process_index() == 0:
            os.makedirs(self.ckpt.directory, exist_ok=True)
            tmp = self._extra_path(run.iteration) + ".tmp.npz"
            np.savez(tmp, **extra)
            os.replace(tmp, self._extra_path(run.iteration))
        st = run.settings
        self.ckpt.save(run.iteration, self._tree(run), {
            "iteration": run.iteration, "history": run.history, "mode": st.mode,
            "objective": st.objective,
            "next_seeds": run.next_seeds, "planner": run.planner.state_dict(),
            "deployment": run.deploy.state_dict(), "mode_extra": extra is not None})
        keep = set(self.ckpt.steps(reload=False)) | {run.iteration}
        for name in os.listdir(self.ckpt.directory):
            if name.startswith("mode_") and name.endswith(".npz") \
                    and name[5:-4].isdigit() and int(name[5:-4]) not in keep:
                os.remove(os.path.join(self.ckpt.directory, name))

    def restore(self, run) -> bool:
        """Loads the newest readable checkpoint into ``run``; False when there is none."""
        meta = self.ckpt.latest_meta()
        if meta is not None:
            # checkpoints from before rl.objective existed are Flow-GRPO runs
            saved, want = meta.get("objective", "flow_grpo"), run.settings.objective
            if saved != want:
                raise ValueError(
                    f"{self.ckpt.directory} holds a rl.objective={saved!r} run, this config "
                    f"trains rl.objective={want!r}; use another --workdir or "
                    f"--config.rl.objective={saved}")
        got = self.ckpt.restore(self._tree(run))
        if got is None:
            return False
        step, tree, meta = got
        for part in run.trainer.state_parts:
            if getattr(run.trainer, part) is not None:
                setattr(run.trainer, part, tree[part])
        run.iteration, run.history = int(meta["iteration"]), list(meta["history"])
        run.next_seeds = meta.get("next_seeds")
        if "planner" in meta:
            run.planner.load_state_dict(meta["planner"])
        if "deployment" in meta:
            run.deploy.load_state_dict(meta["deployment"])
            run.mode.sync(run)
        run.mode.load_extra_state(run, self._load_extra(step, meta))
        logging.info("resumed from iteration %d in %s", step, self.ckpt.directory)
        return True

    def _load_extra(self, step: int, meta: dict):
        if not meta.get("mode_extra"):
            return None
        path = self._extra_path(step)
        if not os.path.exists(path):
            raise RuntimeError(f"checkpoint {step} in {self.ckpt.directory} needs {path}, "
                               "which is missing; restore it or move the directory away")
        with np.load(path) as f:
            return {key: f[key] for key in f.files}

    def close(self) -> None:
        self.ckpt.close()


def restore(run) -> bool:
    """Loads the newest checkpoint in ``run.workdir`` into ``run`` and lets the directory go
    (for tools that read a finished or killed run); False when there is none."""
    checkpoints = RunCheckpoints(run.workdir, run.settings.max_to_keep)
    try:
        return checkpoints.restore(run)
    finally:
        checkpoints.close()
