"""Library entry point: ``train_and_evaluate(config, workdir)`` (called by main, tests, notebooks).

``config``: a :class:`~spotlight_jax.config.RunSpec`, or a ConfigDict it is built from once.
Order of business: (1) the base model (``runner.base_model``: the shipped checkpoint for this
model config if there is one, else ``<workdir>/base`` if a previous run pretrained it, else
pretrain now and save it there); (2) the post-training mode (``config.mode``) run by
``spotlight_jax.runner``, resuming from ``workdir``, ending with its summary
(``runner.summary``). ``run_trainer_job`` is the same post-training as one process of a
multi-process trainer job (``spotlight_jax.cluster``).
"""
from __future__ import annotations

import os

import jax
from absl import logging
from flax import nnx

from spotlight_jax import registry
from spotlight_jax.cluster.job import TrainerJob, broadcast_base, follow
from spotlight_jax.config import RunSpec
from spotlight_jax.models.factory import abstract_model
from spotlight_jax.runner import build_and_run, run_compare
from spotlight_jax.runner.base_model import load_or_pretrain_base
from spotlight_jax.runner.summary import summary

__all__ = ["train_and_evaluate", "run_trainer_job"]


def train_and_evaluate(config, workdir: str):
    """Runs the mode of ``config`` (a RunSpec, or a ConfigDict built into one here) end to end
    in ``workdir`` (resuming whatever is there); ``compare`` runs every mode into
    ``workdir/<mode>`` and writes ``report.md``."""
    spec = RunSpec.of(config)
    os.makedirs(workdir, exist_ok=True)
    logging.info("devices: %s", jax.devices())
    graphdef, base, source = load_or_pretrain_base(spec, workdir)
    if registry.mode_spec(spec.settings.mode) is registry.COMPARE:
        path = run_compare(spec, workdir, graphdef, base, base_source=source)
        print(open(path).read().split("\n## ")[0])
        print(f"report: {path}  (plots next to it; each mode's run in {workdir}/<mode>)")
        return path
    history = build_and_run(spec, workdir, graphdef, base, base_source=source)
    print(summary(spec, workdir, history, source))
    return history


def run_trainer_job(spec: RunSpec, workdir: str, *, progress: bool = False):
    """Post-training of ``spec`` by this trainer job: process 0 runs the runner
    (``runner.build_and_run``) with a ``TrainerJob`` over every process's devices, writing the run
    (metrics, samples, checkpoints) to ``workdir``; the other processes follow its commands.
    The base model is process 0's (shipped, ``base_checkpoint`` or ``workdir/base``),
    broadcast to the others. Returns the history in process 0, None in the others."""
    mesh = spec.build_mesh(jax.devices())
    graphdef, abstract = abstract_model(spec.model, spec.seed)
    base = None
    if jax.process_index() == 0:
        try:
            if spec.process.base_checkpoint == "none":
                raise ValueError("a trainer job does not pretrain: run the pretraining first "
                                 "(python -m spotlight_jax.main ... --config.rl.iterations=0) "
                                 "and point --config.base_checkpoint at it")
            graphdef, base, source = load_or_pretrain_base(
                spec, workdir, progress=False, allow_pretrain=False)
        except Exception:
            broadcast_base({})     # releases the followers with an empty base
            raise
        logging.info("trainer job: base %s", source)
    pure = broadcast_base(base)
    if not pure:
        raise RuntimeError("process 0 found no base model; see its log")
    host = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(host, pure)
    rl_cfg, samp = spec.rl, spec.sampler
    if jax.process_index() != 0:
        follow(graphdef, host, rl_cfg, samp, mesh, seed=spec.seed)
        return None
    local = spec.build_mesh(jax.local_devices())   # process 0's samplers and shadow weights
    job = TrainerJob(graphdef, host, rl_cfg, samp, mesh, local, seed=spec.seed)
    try:
        return build_and_run(spec, workdir, graphdef, host, base_source=source,
                             progress=progress, trainer=job, devices=list(local.devices.flat))
    finally:
        job.stop()
