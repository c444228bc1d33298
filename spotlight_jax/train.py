"""Library entry point: ``train_and_evaluate(config, workdir)`` (called by main, tests, notebooks).

Order of business: (1) the base model — the shipped checkpoint for this model config if there is
one, else ``<workdir>/base`` if a previous run pretrained it, else pretrain now and save it there;
(2) the post-training mode (``config.mode``) run by the controller, resuming from ``workdir``.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
from absl import logging

from spotlight_jax import checkpoint
from spotlight_jax.builders import (
    abstract_model,
    create_model,
    model_config,
    sampler_config,
)
from spotlight_jax.dry_run import dry_run
from spotlight_jax.pretrain import PretrainConfig, pretrain

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
__all__ = ["train_and_evaluate", "dry_run", "load_or_pretrain_base", "shipped_base_dir"]


def pretrain_config(config) -> PretrainConfig:
    names = {f.name for f in dataclasses.fields(PretrainConfig)}
    return PretrainConfig(**{k: v for k, v in dict(config.pretrain).items() if k in names})


def _model_fingerprint(config) -> dict:
    return dataclasses.asdict(model_config(config))


def shipped_base_dir(config) -> str | None:
    """The shipped base checkpoint whose model config equals this config's, if any."""
    if not os.path.isdir(ASSETS):
        return None
    want = _model_fingerprint(config)
    for name in sorted(os.listdir(ASSETS)):
        path = os.path.join(ASSETS, name)
        meta = os.path.join(path, "meta.json")
        if os.path.exists(meta):
            with open(meta) as f:
                if json.load(f).get("model") == want:
                    return path
    return None


def load_or_pretrain_base(config, workdir: str, *, progress: bool = True):
    """``(graphdef, base_state, source)`` following the priority order in the module docstring."""
    cfg = model_config(config)
    choice = config.get("base_checkpoint", "auto")
    candidates = []
    if choice not in ("auto", "none", "", None):
        candidates.append(choice)
    elif choice == "auto":
        shipped = shipped_base_dir(config)
        if shipped:
            candidates.append(shipped)
    local = os.path.join(workdir, "base")
    candidates.append(local)
    graphdef, abstract = abstract_model(cfg, config.seed)
    for path in candidates:
        if os.path.isdir(os.path.join(path, "params")):
            state = checkpoint.load_params(path, abstract)
            logging.info("base model: loaded %s", path)
            return graphdef, state, path
        if path == choice:
            raise ValueError(f"config.base_checkpoint={choice!r} has no checkpoint "
                             f"(expected {choice}/params)")
    logging.info("base model: pretraining %d steps into %s", config.pretrain.steps, local)
    graphdef, state = create_model(cfg, seed=config.seed)
    pcfg = pretrain_config(config)
    _, _, ema, history = pretrain(graphdef, state, cfg, pcfg, sampler_config(config,
                                  evaluation=True), workdir=workdir, seed=config.seed,
                                  progress=progress)
    checkpoint.save_params(local, ema, {
        "model": _model_fingerprint(config), "pretrain": dataclasses.asdict(pcfg),
        "code_version": checkpoint.code_version(), "history": history})
    return graphdef, ema, local


def train_and_evaluate(config, workdir: str):
    """Runs ``config.mode`` end to end in ``workdir`` (resuming whatever is there)."""
    os.makedirs(workdir, exist_ok=True)
    logging.info("devices: %s", jax.devices())
    graphdef, base, source = load_or_pretrain_base(config, workdir)
    from spotlight_jax import controller  # noqa: PLC0415 - heavy, only when training
    return controller.run(config, workdir, graphdef, base, base_source=source)
