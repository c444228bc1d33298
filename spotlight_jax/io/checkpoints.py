"""Orbax checkpoints: the shipped base model and full training state.

Base model: ``<dir>/params`` (Orbax StandardCheckpointer) + ``<dir>/meta.json`` (config, code
version, pretraining log summary). Parameters restore onto whatever mesh exists now: the target
is a tree of ``ShapeDtypeStruct`` with concrete shardings.
"""
from __future__ import annotations

import json
import os
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


def code_version() -> str:
    """``git describe`` of the source tree (or 'unknown' outside a checkout)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def restore_target(abstract_state, shardings=None):
    """Abstract pure-dict target for Orbax, with concrete shardings (or this process's first
    device: addressable in every process of a multi-process job)."""
    pure = nnx.to_pure_dict(abstract_state)
    if shardings is None:
        dev = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dev), pure)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), pure,
                        shardings)


def _process_local_options() -> ocp.options.MultiprocessingOptions:
    """Orbax options for a checkpoint that this process reads or writes alone (base weights,
    the runner's run state in a multi-process trainer job): no barriers with the others."""
    if jax.process_count() == 1:
        return ocp.options.MultiprocessingOptions()
    me = jax.process_index()
    return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})


def _params_checkpointer() -> ocp.StandardCheckpointer:
    return ocp.StandardCheckpointer(multiprocessing_options=_process_local_options())


def save_params(path: str, state, meta: dict) -> None:
    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)
    ckptr = _params_checkpointer()
    ckptr.save(os.path.join(path, "params"), nnx.to_pure_dict(state), force=True)
    ckptr.wait_until_finished()
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=str)


def load_params(path: str, abstract_state, shardings=None):
    """Restores parameters saved by ``save_params`` into an NNX state shaped like
    ``abstract_state``. Raises ValueError naming the path when it is missing or does not match."""
    path = os.path.abspath(path)
    if not os.path.isdir(os.path.join(path, "params")):
        raise ValueError(f"no base checkpoint at {path} (expected {path}/params); run pretraining "
                         "or set --config.base_checkpoint")
    target = restore_target(abstract_state, shardings)
    try:
        pure = _params_checkpointer().restore(os.path.join(path, "params"), target)
    except Exception as e:  # Orbax raises several types for shape/structure mismatches
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise ValueError(f"base checkpoint at {path} does not match the model config ({first}); "
                         "set --config.base_checkpoint to a checkpoint of this model") from e
    state = jax.tree.map(lambda x: x, abstract_state)
    nnx.replace_by_pure_dict(state, pure)
    return state


def grow_params(path: str, state):
    """``state`` (an NNX state) with every parameter that ``path``'s checkpoint also holds, at
    the same place and shape, replaced by the checkpoint's value: a model grown from a smaller
    one (new modules keep their initialisation; zero-initialised residual ones leave its
    function unchanged). Returns ``(state, loaded, new)`` with the dotted names of both kinds.
    Raises ValueError when nothing matches or a shared name changed shape."""
    path = os.path.abspath(path)
    if not os.path.isdir(os.path.join(path, "params")):
        raise ValueError(f"no checkpoint to grow from at {path} (expected {path}/params)")
    saved = _params_checkpointer().restore(os.path.join(path, "params"))
    flat_saved = dict(flatten_names(saved))
    pure = nnx.to_pure_dict(state)
    loaded, new = [], []

    def pick(keypath, x):
        name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in keypath)
        if name in flat_saved:
            v = flat_saved[name]
            if tuple(v.shape) != tuple(x.shape):
                raise ValueError(f"cannot grow from {path}: {name} has shape {tuple(v.shape)} "
                                 f"there and {tuple(x.shape)} in this model")
            loaded.append(name)
            return jax.device_put(np.asarray(v, x.dtype), x.sharding)
        new.append(name)
        return x

    pure = jax.tree_util.tree_map_with_path(pick, pure)
    if not loaded:
        raise ValueError(f"cannot grow from {path}: no parameter name matches this model")
    out = jax.tree.map(lambda x: x, state)
    nnx.replace_by_pure_dict(out, pure)
    return out, loaded, new


def flatten_names(tree, prefix: str = ""):
    """``(dotted name, leaf)`` pairs of a nested dict (the pure-dict form of an NNX state)."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from flatten_names(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, tree


class RunCheckpointer:
    """Full training state in an Orbax ``CheckpointManager`` (async saves, latest-first restore).

    ``this_process_only``: the manager runs in this process alone (the runner of a
    multi-process trainer job), saving arrays it holds on its own devices.
    ``save(step, tree, meta)`` writes ``Composite(state=StandardSave(tree), meta=JsonSave(meta))``.
    ``restore(target)`` restores the newest readable checkpoint onto the shardings of ``target``
    (a tree of arrays or ShapeDtypeStructs); a corrupt or half-written newest checkpoint makes it
    fall back to the previous one with a warning, never silently start from scratch.
    """

    def __init__(self, directory: str, max_to_keep: int = 3, this_process_only: bool = False):
        self.directory = os.path.abspath(directory)
        self.this_process_only = this_process_only and jax.process_count() > 1
        # In a multi-process job whose runner (process 0) alone saves arrays on its own
        # devices, Orbax must not wait for the other processes at its barriers.
        mp = (_process_local_options() if this_process_only
              else ocp.options.MultiprocessingOptions())
        if this_process_only:   # Orbax refuses create=True with active_processes
            os.makedirs(self.directory, exist_ok=True)
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, create=not this_process_only,
                multiprocessing_options=mp))

    def save(self, step: int, tree, meta: dict) -> None:
        if self.this_process_only:
            # Orbax serialises only global arrays in a multi-process job; this process's own
            # copies go as host arrays (they restore onto any target, single-process included)
            tree = jax.tree.map(np.asarray, tree)
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def steps(self, reload: bool = True) -> list[int]:
        """The saved steps; ``reload`` re-reads the directory (another process may have
        written). Not while a save of this manager may be in flight: re-read then, the
        manager forgets which old steps its retention already deleted and deletes them again."""
        if reload:
            self.manager.reload()
        return sorted(self.manager.all_steps())

    def restore(self, target):
        """``(step, tree, meta)`` of the newest good checkpoint, or ``None`` if there is none."""
        from absl import logging  # noqa: PLC0415

        if self.this_process_only:    # host arrays, as saved; the caller places them
            abstract = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), target)
        else:
            abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, sharding=getattr(x, "sharding", None)), target)
        steps = self.steps()
        for step in reversed(steps):
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
                return step, out["state"], out["meta"]
            except Exception as e:  # noqa: BLE001 - any failure means "this one is unreadable"
                logging.warning("checkpoint %d in %s is unreadable (%s: %s); falling back to the "
                                "previous one", step, self.directory, type(e).__name__, e)
        if steps:
            raise RuntimeError(f"no readable checkpoint in {self.directory} (tried {steps}); "
                               "move the directory away to start from scratch")
        return None

    def latest_meta(self) -> dict | None:
        """The JSON metadata of the newest checkpoint whose metadata reads (None if none)."""
        for step in reversed(self.steps()):
            try:
                return self.manager.restore(step, args=ocp.args.Composite(
                    meta=ocp.args.JsonRestore()))["meta"]
            except Exception:  # noqa: BLE001 - unreadable: try the previous one
                continue
        return None

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
