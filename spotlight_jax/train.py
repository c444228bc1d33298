"""Library entry point: ``train_and_evaluate(config, workdir)`` (called by main, tests, notebooks).

``config``: a :class:`~spotlight_jax.config.RunSpec`, or a ConfigDict it is built from once.
Order of business: (1) the base model — the shipped checkpoint for this model config if there is
one, else ``<workdir>/base`` if a previous run pretrained it, else pretrain now and save it there;
(2) the post-training mode (``config.mode``) run by ``spotlight_jax.runner``, resuming from
``workdir``. ``run_trainer_job`` is the same post-training as one process of a multi-process
trainer job (``spotlight_jax.cluster``).
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
from absl import logging
from flax import nnx

from spotlight_jax import checkpoint, registry, world
from spotlight_jax.cluster.job import TrainerJob, broadcast_base, follow
from spotlight_jax.config import RunSpec
from spotlight_jax.dry_run import dry_run
from spotlight_jax.models import MMDiTConfig
from spotlight_jax.models.build import abstract_model, create_model, is_video
from spotlight_jax.pretrain import pretrain
from spotlight_jax.runner import build_and_run, run_compare

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
__all__ = ["train_and_evaluate", "run_trainer_job", "dry_run", "load_or_pretrain_base",
           "shipped_base_dir"]


def _model_fingerprint(cfg: MMDiTConfig) -> dict:
    """The model config as its meta.json records it (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _world_fingerprint(cfg: MMDiTConfig) -> dict:
    """The world a base model is pretrained on (the default world at the model's image size),
    with derived sizes resolved (a default that changes how the world is drawn changes it)."""
    w = world.WorldConfig(image_size=cfg.image_size)
    fingerprint = dataclasses.asdict(dataclasses.replace(w, text_scale=w.glyph_scale))
    if is_video(cfg):           # the video world's clips also depend on how fast objects move
        fingerprint["video_speed"] = world.video.SPEED
    return json.loads(json.dumps(fingerprint))


def shipped_base_dir(cfg: MMDiTConfig) -> str | None:
    """The shipped base checkpoint whose model config and world equal ``cfg``'s, if any (a
    checkpoint that records no world was pretrained on an earlier world and never matches)."""
    if not os.path.isdir(ASSETS):
        return None
    want = _model_fingerprint(cfg)
    # fields added to MMDiTConfig after a checkpoint was recorded take their defaults (which
    # leave the recorded model unchanged, e.g. pixel_head=0)
    defaults = _model_fingerprint(type(cfg)())
    want_world = _world_fingerprint(cfg)
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


def _check_base_kind(path: str, cfg) -> None:
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
            _check_base_kind(path, cfg)
            state = checkpoint.load_params(path, abstract)
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
        state, loaded, new = checkpoint.grow_params(pcfg.init_from, state)
        logging.info("base model: %d parameters from %s, %d new: %s", len(loaded),
                     pcfg.init_from, len(new), ", ".join(new))
    _, _, ema, history = pretrain(graphdef, state, cfg, pcfg, spec.eval_sampler,
                                  workdir=workdir, seed=spec.seed, progress=progress,
                                  tokenize=tokenize)
    checkpoint.save_params(local, ema, {
        "model": _model_fingerprint(cfg), "world": _world_fingerprint(cfg),
        "pretrain": dataclasses.asdict(pcfg),
        "code_version": checkpoint.code_version(), "history": history})
    return graphdef, ema, local


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


def gain_line(first: dict, last: dict) -> str:
    """One line: the held-out gain and whether it is beyond the evaluations' 95% interval (the
    two evaluations' half-widths combined as independent: a conservative bound, as both use the
    same prompts and seeds)."""
    gain = last["val_reward"] - first["val_reward"]
    half = (first.get("val_reward_ci95", 0.0) ** 2 + last.get("val_reward_ci95", 0.0) ** 2) ** 0.5
    verdict = "beyond" if abs(gain) > half else "inside"
    return f"gain {gain:+.3f}: {verdict} the 95% interval of the difference (±{half:.3f})"


def summary(spec: RunSpec, workdir: str, history: list[dict], base_source: str) -> str:
    """The end-of-run table: held-out reward before/after, time and cost axes, where things are."""
    evals = [h for h in history if "val_reward" in h]
    last = history[-1] if history else {}
    lines = [f"== {spec.settings.mode}: {last.get('iteration', 0)} iterations  "
             f"(base: {base_source})"]
    if evals:
        a, b = evals[0], evals[-1]
        lines.append(f"held-out {spec.settings.eval_reward}: {a['val_reward']:.3f} -> "
                     f"{b['val_reward']:.3f} (±{b.get('val_reward_ci95', 0):.3f} 95%)")
        lines.append(gain_line(a, b))
        if any(k.startswith("val_acc_") for k in b):
            lines.append("  constraint  exact accuracy   its share of the missing reward")
        for k in sorted(k for k in b if k.startswith("val_acc_")):
            m = "val_missing_" + k[8:]
            share = (f"   {a.get(m, float('nan')):.3f} -> {b[m]:.3f}" if m in b else "")
            lines.append(f"  {k[8:]:<9}   {a.get(k, float('nan')):.2f} -> {b[k]:.2f}{share}")
    if "vtime_s" in last:
        lines.append(f"emulated deployment: {last['vtime_s'] / 3600:.2f} h, "
                     f"${last['dollars']:.2f}, spot utilisation "
                     f"{last.get('spot_util', 0):.0%}, preemptions "
                     f"{last.get('preemptions', 0)}")
    rollouts = [h["rollout_images_per_s"] for h in history if "rollout_images_per_s" in h]
    tokens = [h["rollout_tokens_per_s"] for h in history if "rollout_tokens_per_s" in h]
    updates = [h["train_images_per_s"] for h in history if "train_images_per_s" in h]
    if updates:
        line = f"throughput (median, wall clock here): update {np.median(updates):.1f} images/s"
        mfu = [h["train_mfu"] for h in history if "train_mfu" in h]
        if mfu:
            tflops = np.median([h["train_tflops"] for h in history if "train_tflops" in h])
            line += f" ({tflops:.3g} model TFLOP/s, MFU {np.median(mfu):.1%})"
        if rollouts:
            line += (f", rollouts {np.median(rollouts):.1f} images/s "
                     f"({np.median(tokens):,.0f} transformer tokens/s)")
        lines.append(line)
    gaps = [(float(g), int(t)) for h in history
            for t, g in h.get("rollout_logp_gap_by_step", {}).items()]
    if gaps:
        worst, at = max(gaps)
        ratio = max(h.get("first_ratio_dev", 0.0) for h in history)
        lines.append(f"log-prob gap, rollout vs trainer (Flow-GRPO): max {worst:.2g} "
                     f"(sampler step {at}); first inner step's |ratio - 1| max {ratio:.2g}")
    regroups = [h for h in history if h.get("fleet_regroups")]
    if regroups:
        worst = max(h["fleet_regroup_max_s"] for h in regroups)
        lines.append(f"spot fleet: {sum(h['fleet_regroups'] for h in regroups)} node regroups "
                     f"(slowest {1e3 * worst:.1f} ms, "
                     f"{sum(h['fleet_compiles'] for h in regroups)} compiles)")
    lines += [f"metrics:  {os.path.join(workdir, 'rl.jsonl')}  (TensorBoard: "
              f"{os.path.join(workdir, 'tb')})",
              f"samples:  {os.path.join(workdir, 'samples')}",
              f"curve:    {os.path.join(workdir, 'reward_curve.png')}"]
    return "\n".join(lines)


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
