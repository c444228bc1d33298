"""The runner's trainer when the trainer is a ``jax.distributed`` job of several processes.

In a multi-process JAX job every process must run the same collective programs. The runner
(rollouts, rewards, selection, evaluation, checkpoints) runs in process 0 only; the other
processes run ``follow``, a loop that receives process 0's commands (``broadcast_tree``) and joins
the collective program each one names:

  update   the GRPO update on the global mesh, on the batch process 0 broadcasts with it;
  gather   copies of the trainable weights / optimizer state / EMA on every process
           (``process_allgather``), which process 0 keeps for its samplers and checkpoints;
  set      new trainable weights / optimizer state / EMA (a resumed checkpoint), placed on
           every process's part of the global mesh;
  stop     leave the loop.

``TrainerJob`` is what process 0's runner holds in place of the objective's trainer
(``GRPOTrainer`` or ``NFTTrainer``): it has the same attributes (``trainable``, ``opt_state``,
``ema``, the nft sampling policy ``old``, ``sampling_state()``,
``eval_state()``, ``update()``) and sends the command before running its part. Its weights for
sampling live in a shadow trainer on process 0's own devices, refreshed after every update, so
rollouts and evaluation never touch the other processes' devices. Followers need no file system:
process 0 broadcasts the base weights when the job starts.
"""
from __future__ import annotations

import logging

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from spotlight_jax.cluster.distributed import broadcast_tree
from spotlight_jax.diffusion import batches
from spotlight_jax.io import checkpoints
from spotlight_jax.models.factory import abstract_model
from spotlight_jax.parallel.sharding import shard_state
from spotlight_jax.rl import trainer_class

logger = logging.getLogger(__name__)
_OP = "__op__"


def _command(op: str, **arrays) -> dict:
    return {_OP: np.frombuffer(op.encode(), np.uint8).copy(), **arrays}


def _op(cmd: dict) -> str:
    return bytes(cmd[_OP]).decode()


def _flat(prefix: str, tree) -> dict:
    return {f"{prefix}/{i:05d}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(tree))}


def _unflat(prefix: str, cmd: dict, like):
    leaves = [cmd[k] for k in sorted(k for k in cmd if k.startswith(prefix + "/"))]
    treedef = jax.tree.structure(like)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(f"command has {len(leaves)} {prefix} leaves, the trainer "
                         f"{treedef.num_leaves}")
    return jax.tree.unflatten(treedef, leaves)


def _place_like(host, like):
    """Host arrays ``host`` placed with the dtypes and shardings of the arrays ``like``."""
    return jax.tree.map(lambda h, c: jax.device_put(np.asarray(h, c.dtype), c.sharding),
                        host, like)


def broadcast_base(base) -> dict:
    """Process 0's base weights (an NNX state or pure dict; others pass None) on every process,
    as a host pure dict, so follower hosts need no copy of the checkpoint."""

    flat = None
    if jax.process_index() == 0:
        pure = base if isinstance(base, dict) else nnx.to_pure_dict(base)
        flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
                for path, v in jax.tree_util.tree_leaves_with_path(pure)}
    got = broadcast_tree(flat)
    out: dict = {}
    for name, v in got.items():
        node = out
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(int(p) if p.isdigit() else p, {})
        node[int(leaf) if leaf.isdigit() else leaf] = v
    return out


def _trainer(graphdef, base_state, rl_cfg, sampler_cfg, mesh, seed: int = 0):

    return trainer_class(rl_cfg)(graphdef, shard_state(base_state, mesh), rl_cfg, sampler_cfg,
                                 mesh=mesh, seed=seed)


class _Replica:
    """The objective's trainer on the job's global mesh, as every process holds it."""

    def __init__(self, graphdef, base_state, rl_cfg, sampler_cfg, mesh, seed: int = 0):
        self.trainer = _trainer(graphdef, base_state, rl_cfg, sampler_cfg, mesh, seed)

    def run(self, cmd: dict):
        """Runs one command's collective part on this process; returns what it produced."""

        t, op = self.trainer, _op(cmd)
        if op == "update":
            batch = batches.unflatten({k[2:]: v for k, v in cmd.items() if k.startswith("b/")})
            key = jax.random.wrap_key_data(cmd["key"])
            return t.update(batch, key, int(cmd["step"]))
        if op == "gather":
            parts = {p: getattr(t, p) for p in t.state_parts if getattr(t, p) is not None}
            return multihost_utils.process_allgather(parts, tiled=True)
        if op == "set":
            for p in t.state_parts:
                cur = getattr(t, p)
                if cur is None or not any(k.startswith(p + "/") for k in cmd):
                    continue
                setattr(t, p, _place_like(_unflat(p, cmd, cur), cur))
            return None
        if op == "stop":
            return None
        raise ValueError(f"unknown trainer job command {op!r}")


def follow(graphdef, base_state, rl_cfg, sampler_cfg, mesh, seed: int = 0) -> int:
    """A follower process's whole life in the job: serve process 0's commands until ``stop``.
    Returns the number of updates it took part in."""
    if jax.process_index() == 0:
        raise RuntimeError("process 0 leads the trainer job (TrainerJob); it does not follow")
    replica = _Replica(graphdef, base_state, rl_cfg, sampler_cfg, mesh, seed)
    updates = 0
    while True:
        cmd = broadcast_tree(None)
        op = _op(cmd)
        replica.run(cmd)
        updates += op == "update"
        if op == "stop":
            logger.info("trainer process %d: stop after %d updates", jax.process_index(),
                        updates)
            return updates


class TrainerJob:
    """Process 0's view of the job's trainer: a :class:`spotlight_jax.rl.Trainer` that the
    runner uses in place of the objective's trainer.

    ``mesh`` spans every process's devices (the job's trainer mesh); ``local_mesh`` is process
    0's own devices, where the shadow trainer keeps the current weights for sampling."""

    def __init__(self, graphdef, base_state, rl_cfg, sampler_cfg, mesh, local_mesh,
                 seed: int = 0):
        if jax.process_index() != 0:
            raise RuntimeError("TrainerJob runs in process 0; other processes call follow()")
        self.mesh, self.local_mesh = mesh, local_mesh
        self._replica = _Replica(graphdef, base_state, rl_cfg, sampler_cfg, mesh, seed)
        self.local = _trainer(graphdef, base_state, rl_cfg, sampler_cfg, local_mesh, seed)
        self.cfg = rl_cfg
        self.batch_keys, self.state_parts = self.local.batch_keys, self.local.state_parts
        self._opt_stale = False      # the shadow's optimizer state lags the job's
        self.stopped = False

    def _send(self, op: str, **arrays):
        if self.stopped:
            raise RuntimeError("the trainer job was stopped")
        cmd = broadcast_tree(_command(op, **arrays))
        return self._replica.run(cmd)

    def _pull(self, with_opt_state: bool):
        """Copies the job's weights (and optimizer state) into the shadow trainer."""
        got = self._send("gather")
        for p in self.state_parts:
            if p not in got or (p == "opt_state" and not with_opt_state):
                continue
            setattr(self.local, p, _place_like(got[p], getattr(self.local, p)))
        if with_opt_state:
            self._opt_stale = False

    # -- the trainer interface the runner uses --------------------------------------------
    def update(self, batch: dict, key, step: int, generator=None) -> dict:
        if generator is not None:
            raise NotImplementedError(
                "a multi-process trainer job trains on its own iteration's rollouts only; run "
                "mode spotlight_pipelined in a single-process trainer")
        # flat names: tokens may be a pytree (a prompt's pooled embedding and null prompt)
        arrays = {f"b/{k}": np.asarray(v) for k, v in batches.flatten(batch).items()}
        metrics = self._send("update", key=np.asarray(jax.random.key_data(key)),
                             step=np.asarray(step, np.int64), **arrays)
        self._opt_stale = True
        self._pull(with_opt_state=False)
        return metrics

    @property
    def work(self):
        return self.local.work

    def advantages(self, rewards, prompt_ids, parts=None, weights=None):
        return self.local.advantages(rewards, prompt_ids, parts, weights)

    def sampling_state(self):
        return self.local.sampling_state()

    def sampling_trainable(self):
        return self.local.sampling_trainable()

    def generator(self):
        return self.local.generator()

    def update_sharded(self, batch: dict, key, step: int, shards: int, run,
                       generator=None) -> dict:
        raise NotImplementedError(
            "a multi-process trainer job computes the whole update on its own mesh; run with "
            "--config.deployment.shared_update=off (the shared update needs a single-process "
            "trainer)")

    def eval_state(self):
        return self.local.eval_state()

    def exported_lora(self):
        return self.local.exported_lora()   # pulled from the job after every update

    @property
    def trainable(self):
        return self.local.trainable

    @trainable.setter
    def trainable(self, value):
        self._set("trainable", value)

    @property
    def opt_state(self):
        if self._opt_stale:
            self._pull(with_opt_state=True)
        return self.local.opt_state

    @opt_state.setter
    def opt_state(self, value):
        self._set("opt_state", value)

    @property
    def old(self):
        """The nft objective's sampling policy θ_old (None for Flow-GRPO)."""
        return getattr(self.local, "old", None)

    @old.setter
    def old(self, value):
        self._set("old", value)

    @property
    def ema(self):
        return self.local.ema

    @ema.setter
    def ema(self, value):
        self._set("ema", value)

    def _set(self, part: str, value):
        self._send("set", **_flat(part, value))
        setattr(self.local, part, _place_like(value, getattr(self.local, part)))

    def stop(self):
        """Releases the followers (they return from ``follow``)."""
        if not self.stopped:
            self._send("stop")
            self.stopped = True


def update_from_files(spec, base_dir: str, batch_path: str, out_path: str | None,
                      step: int = 0) -> dict:
    """One GRPO update of the run ``spec``'s trainer on the batch saved at ``batch_path`` (read by
    process 0, broadcast to all; a pytree entry such as tokens with a pooled embedding is saved
    under flat names, ``tokens/embeds``..., see ``diffusion.prompt.flatten``), over a mesh of
    every process's devices. Process 0 writes the updated trainable parameters
    (``leaf_00000``... in ``jax.tree.leaves`` order) to ``out_path``. Returns the metrics."""

    mesh = spec.build_mesh(jax.devices())
    graphdef, abstract = abstract_model(spec.model, spec.seed)
    # every process reads the checkpoint to host memory, then places it on the global mesh
    # (device_put of identical host values; arrays committed to one process's device cannot
    # be moved onto devices of other processes)
    host = jax.tree.map(np.asarray, checkpoints.load_params(base_dir, abstract))
    base = shard_state(host, mesh)
    trainer = spec.make_trainer(graphdef, base, mesh=mesh)
    batch = None
    if jax.process_index() == 0:
        with np.load(batch_path) as f:
            batch = {k: f[k] for k in f.files}
    batch = batches.unflatten(broadcast_tree(batch))   # "tokens/embeds"... -> nested
    metrics = trainer.update(batch, jax.random.key(spec.seed), step)
    leaves = [np.asarray(x) for x in jax.tree.leaves(trainer.trainable)]
    if jax.process_index() == 0 and out_path:   # in jax.tree.leaves order (LoRA or full)
        np.savez(out_path, **{f"leaf_{i:05d}": x for i, x in enumerate(leaves)})
    return metrics
