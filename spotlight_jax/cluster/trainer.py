"""The trainer's ``jax.distributed`` job: one process per on-demand host, one mesh over all.

``initialize`` joins the job; ``broadcast_tree`` hands process 0's host data (the rollout batch
its controller assembled) to every process; ``run_job`` is post-training with the controller in
process 0 and the others following it (``spotlight_jax.cluster.job``):

    python -m spotlight_jax.cluster.trainer --coordinator=127.0.0.1:12355 --num_processes=2 \
        --process_id=0 --cpu_devices=2 --config=tiny --workdir=RUN_DIR

``update_from_files`` is one GRPO update on a saved batch (the multi-process equivalence test):

    python -m spotlight_jax.cluster.trainer --coordinator=127.0.0.1:12355 --num_processes=2 \\
        --process_id=0 --cpu_devices=2 --config=configs/tiny.py --base=BASE_DIR \\
        --batch=batch.npz --out=params.npz

On CPU the processes talk over gloo (``jax_cpu_collectives_implementation``); on GPUs over NCCL.
"""
from __future__ import annotations

import argparse
import json
import logging

import jax
import numpy as np

logger = logging.getLogger(__name__)
_HEADER_BYTES = 1 << 16


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, cpu_devices: int = 0,
               cpu_collectives: str = "gloo") -> tuple[int, int]:
    """Joins the trainer's ``jax.distributed`` job; returns ``(process_index, process_count)``.

    With no arguments JAX auto-detects the cluster (SLURM, Open MPI, Kubernetes, Cloud TPU).
    ``cpu_devices`` > 0 emulates that many devices per process on CPU. Must run before any JAX
    computation in the process (JAX's rule)."""
    if cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    if cpu_devices:
        jax.config.update("jax_num_cpu_devices", int(cpu_devices))
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    logger.info("trainer process %d of %d: %d local / %d global devices", jax.process_index(),
                jax.process_count(), jax.local_device_count(), jax.device_count())
    return jax.process_index(), jax.process_count()


def broadcast_tree(tree: dict | None) -> dict:
    """Process 0's flat dict of host arrays on every process (other processes pass None).

    Two collective broadcasts: a JSON header with names, shapes and dtypes (fixed size), then
    the arrays themselves, so followers need not know the shapes in advance."""
    from jax.experimental import multihost_utils  # noqa: PLC0415

    if jax.process_index() == 0:
        if tree is None:
            raise ValueError("process 0 must pass the tree to broadcast")
        meta = [(k, list(np.shape(v)), np.asarray(v).dtype.str) for k, v in tree.items()]
        raw = json.dumps(meta).encode()
        if len(raw) > _HEADER_BYTES:
            raise ValueError(f"broadcast header of {len(raw)} bytes exceeds {_HEADER_BYTES}")
        header = np.zeros(_HEADER_BYTES, np.uint8)
        header[:len(raw)] = np.frombuffer(raw, np.uint8)
    else:
        header = np.zeros(_HEADER_BYTES, np.uint8)
    header = np.asarray(multihost_utils.broadcast_one_to_all(header))
    meta = json.loads(bytes(header[header != 0]).decode())
    like = {k: (np.asarray(tree[k]) if jax.process_index() == 0
                else np.zeros(shape, np.dtype(dtype))) for k, shape, dtype in meta}
    out = multihost_utils.broadcast_one_to_all(like)
    return {k: np.asarray(v) for k, v in out.items()}


def update_from_files(config, base_dir: str, batch_path: str, out_path: str | None,
                      step: int = 0) -> dict:
    """One GRPO update of ``config``'s trainer on the batch saved at ``batch_path`` (read by
    process 0, broadcast to all), over a mesh of every process's devices. Process 0 writes the
    updated trainable parameters (``leaf_00000``... in ``jax.tree.leaves`` order) to
    ``out_path``. Returns the metrics."""
    from spotlight_jax import checkpoint  # noqa: PLC0415
    from spotlight_jax.builders import (  # noqa: PLC0415
        abstract_model,
        build_mesh,
        make_trainer,
        model_config,
    )
    from spotlight_jax.controller import shard_state  # noqa: PLC0415

    mesh = build_mesh(config, jax.devices())
    graphdef, abstract = abstract_model(model_config(config), config.seed)
    # every process reads the checkpoint to host memory, then places it on the global mesh
    # (device_put of identical host values; arrays committed to one process's device cannot
    # be moved onto devices of other processes)
    host = jax.tree.map(np.asarray, checkpoint.load_params(base_dir, abstract))
    base = shard_state(host, mesh)
    trainer = make_trainer(config, graphdef, base, mesh=mesh)
    batch = None
    if jax.process_index() == 0:
        with np.load(batch_path) as f:
            batch = {k: f[k] for k in f.files}
    batch = broadcast_tree(batch)
    metrics = trainer.update(batch, jax.random.key(config.seed), step)
    leaves = [np.asarray(x) for x in jax.tree.leaves(trainer.trainable)]
    if jax.process_index() == 0 and out_path:   # in jax.tree.leaves order (LoRA or full)
        np.savez(out_path, **{f"leaf_{i:05d}": x for i, x in enumerate(leaves)})
    return metrics


def run_job(config, workdir: str, *, progress: bool = False):
    """Post-training of ``config`` by this trainer job: process 0 runs the controller
    (``controller.run``) with a ``TrainerJob`` over every process's devices, writing the run
    (metrics, samples, checkpoints) to ``workdir``; the other processes follow its commands.
    The base model is process 0's (shipped, ``config.base_checkpoint`` or ``workdir/base``),
    broadcast to the others. Returns the history in process 0, None in the others."""
    from flax import nnx  # noqa: PLC0415

    from spotlight_jax import controller, train  # noqa: PLC0415
    from spotlight_jax.builders import (  # noqa: PLC0415
        abstract_model,
        build_mesh,
        model_config,
        rl_config,
        sampler_config,
    )
    from spotlight_jax.cluster.job import TrainerJob, broadcast_base, follow  # noqa: PLC0415

    mesh = build_mesh(config, jax.devices())
    graphdef, abstract = abstract_model(model_config(config), config.seed)
    base = None
    if jax.process_index() == 0:
        try:
            if config.get("base_checkpoint", "auto") == "none":
                raise ValueError("a trainer job does not pretrain: run the pretraining first "
                                 "(python -m spotlight_jax.main ... --config.rl.iterations=0) "
                                 "and point --config.base_checkpoint at it")
            graphdef, base, source = train.load_or_pretrain_base(
                config, workdir, progress=False, allow_pretrain=False)
        except Exception:
            broadcast_base({})     # releases the followers with an empty base
            raise
        logger.info("trainer job: base %s", source)
    pure = broadcast_base(base)
    if not pure:
        raise RuntimeError("process 0 found no base model; see its log")
    host = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(host, pure)
    rl_cfg, samp = rl_config(config), sampler_config(config)
    if jax.process_index() != 0:
        follow(graphdef, host, rl_cfg, samp, mesh)
        return None
    local = build_mesh(config, jax.local_devices())   # process 0's samplers and shadow weights
    job = TrainerJob(graphdef, host, rl_cfg, samp, mesh, local)
    try:
        return controller.run(config, workdir, graphdef, host, base_source=source,
                              progress=progress, trainer=job, devices=list(local.devices.flat))
    finally:
        job.stop()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="the trainer's jax.distributed job: post-training "
                                 "(--workdir) or one GRPO update on a saved batch (--batch)")
    ap.add_argument("--coordinator", default=None, help="host:port (default: auto-detect)")
    ap.add_argument("--num_processes", type=int, default=None)
    ap.add_argument("--process_id", type=int, default=None)
    ap.add_argument("--cpu_devices", type=int, default=0, help="emulated CPU devices per process")
    ap.add_argument("--config", required=True, help="configs/<name>.py or a name")
    ap.add_argument("--overrides", default="{}", help="JSON of dotted config overrides")
    ap.add_argument("--workdir", default=None, help="post-train into this directory (process 0 "
                    "runs the controller); the base comes from the config")
    ap.add_argument("--base", default=None, help="--batch: base checkpoint directory")
    ap.add_argument("--batch", default=None, help=".npz rollout batch (read by process 0)")
    ap.add_argument("--out", default=None, help=".npz of the updated trainable parameters")
    return ap


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    initialize(args.coordinator, args.num_processes, args.process_id,
               cpu_devices=args.cpu_devices)
    from spotlight_jax.builders import load_config  # noqa: PLC0415

    config = load_config(args.config, json.loads(args.overrides))
    if args.workdir:
        history = run_job(config, args.workdir, progress=jax.process_index() == 0)
        if history is not None:
            evals = [h for h in history if "val_reward" in h]
            print(json.dumps({"process": 0, "iterations": history[-1]["iteration"],
                              "val_reward": [h["val_reward"] for h in evals]}), flush=True)
    elif args.batch and args.base:
        metrics = update_from_files(config, args.base, args.batch, args.out)
        print(json.dumps({"process": jax.process_index(), **metrics}), flush=True)
    else:
        ap.error("give --workdir (post-training) or --batch and --base (one update)")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
