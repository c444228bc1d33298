"""The base model a run post-trains, found once before the runner starts.

Priority order: a diffusers pipeline folder (``base_checkpoint`` naming one: its transformer
converted and streamed onto the trainer's mesh); ``base_checkpoint`` naming an Orbax base
folder; with ``base_checkpoint='auto'`` the shipped base (``spotlight_jax/assets``) whose model
config and world equal the run's (their *fingerprints* in its ``meta.json``); else
``<workdir>/base`` if an earlier run pretrained it; else pretraining now (``pretrain``), saved
there with its fingerprints.
"""
from __future__ import annotations

import dataclasses
import json
import os

from absl import logging

from spotlight_jax import world
from spotlight_jax.config import RunSpec
from spotlight_jax.io import checkpoints
from spotlight_jax.models.factory import (
    ModelConfig,
    abstract_model,
    create_model,
    is_edit,
    is_video,
)
from spotlight_jax.pretrain import pretrain

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")


def model_fingerprint(cfg: ModelConfig) -> dict:
    """The model config as its meta.json records it (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def world_fingerprint(cfg: ModelConfig) -> dict:
    """The world a base model is pretrained on (the default world at the model's image size),
    with derived sizes resolved (a default that changes how the world is drawn changes it)."""
    w = world.WorldConfig(image_size=cfg.image_size)
    fingerprint = dataclasses.asdict(dataclasses.replace(w, text_scale=w.glyph_scale))
    if is_video(cfg):           # the video world's clips also depend on how fast objects move
        fingerprint["video_speed"] = world.video.SPEED
    if is_edit(cfg):            # the editing world's tasks: its kinds and its train split
        fingerprint["edit_kinds"] = list(world.edit.EDIT_KINDS)
    return json.loads(json.dumps(fingerprint))


def shipped_base_dir(cfg: ModelConfig) -> str | None:
    """The shipped base checkpoint whose model config and world equal ``cfg``'s, if any (a
    checkpoint that records no world was pretrained on an earlier world and never matches)."""
    if not os.path.isdir(ASSETS):
        return None
    want = model_fingerprint(cfg)
    # fields added to MMDiTConfig after a checkpoint was recorded take their defaults (which
    # leave the recorded model unchanged, e.g. pixel_head=0)
    defaults = model_fingerprint(type(cfg)())
    want_world = world_fingerprint(cfg)
    for name in sorted(os.listdir(ASSETS)):
        path = os.path.join(ASSETS, name)
        meta = os.path.join(path, "meta.json")
        if os.path.exists(meta):
            with open(meta) as f:
                meta = json.load(f)
            recorded = meta.get("model")
            if (recorded is not None and {**defaults, **recorded} == want
                    and meta.get("world") == want_world):
                return path
    return None


def check_base_kind(path: str, cfg) -> None:
    """A one-line ValueError when the checkpoint at ``path`` records an image model and ``cfg``
    is a video one, or the reverse (a video model's config has ``frames``)."""
    meta = os.path.join(path, "meta.json")
    if not os.path.exists(meta):
        return
    with open(meta) as f:
        recorded = json.load(f).get("model") or {}
    if recorded and ("frames" in recorded) != is_video(cfg):
        have, want = ("video", "image") if "frames" in recorded else ("image", "video")
        article = "a" if have == "video" else "an"
        raise ValueError(f"config.base_checkpoint={path!r} holds {article} {have} model and this "
                         f"run's model (model.family) draws {want}s; use a {want} base (e.g. "
                         f"base_checkpoint='auto') or the {have} config")


def load_or_pretrain_base(spec: RunSpec, workdir: str, *, progress: bool = True,
                          allow_pretrain: bool = True):
    """``(graphdef, base_state, source)`` of the run ``spec`` following the priority order in
    the module docstring. With ``allow_pretrain=False`` a missing base is a ValueError instead
    of a pretraining run."""
    choice = spec.process.base_checkpoint
    if spec.diffusers_base is not None:
        # streamed onto the trainer's mesh, each parameter straight onto its shards
        graphdef, state = spec.load_diffusers_base(spec.build_mesh(spec.trainer_devices()))
        logging.info("base model: converted %s/transformer (diffusers)", choice)
        return graphdef, state, choice
    cfg = spec.model
    candidates = []
    if choice not in ("auto", "none", "", None):
        candidates.append(choice)
    elif choice == "auto":
        shipped = shipped_base_dir(cfg)
        if shipped:
            candidates.append(shipped)
    local = os.path.join(workdir, "base")
    candidates.append(local)
    graphdef, abstract = abstract_model(cfg, spec.seed)
    for path in candidates:
        if os.path.isdir(os.path.join(path, "params")):
            check_base_kind(path, cfg)
            state = checkpoints.load_params(path, abstract)
            logging.info("base model: loaded %s", path)
            return graphdef, state, path
        if path == choice:
            raise ValueError(f"config.base_checkpoint={choice!r} has no checkpoint "
                             f"(expected {choice}/params)")
    if not allow_pretrain:
        raise ValueError(f"no base model for this config: no shipped checkpoint matches it and "
                         f"{local} has none; pretrain one first (python -m spotlight_jax.main "
                         "... --config.rl.iterations=0) or set config.base_checkpoint")
    tokenize = spec.prompt_source().tokenize      # a bad embedding file fails before work
    pcfg = spec.pretrain
    logging.info("base model: pretraining %d steps into %s", pcfg.steps, local)
    graphdef, state = create_model(cfg, seed=spec.seed)
    if pcfg.init_from:
        state, loaded, new = checkpoints.grow_params(pcfg.init_from, state)
        logging.info("base model: %d parameters from %s, %d new: %s", len(loaded),
                     pcfg.init_from, len(new), ", ".join(new))
    _, _, ema, history = pretrain(graphdef, state, cfg, pcfg, spec.eval_sampler,
                                  workdir=workdir, seed=spec.seed, progress=progress,
                                  tokenize=tokenize)
    checkpoints.save_params(local, ema, {
        "model": model_fingerprint(cfg), "world": world_fingerprint(cfg),
        "pretrain": dataclasses.asdict(pcfg),
        "code_version": checkpoints.code_version(), "history": history})
    return graphdef, ema, local
