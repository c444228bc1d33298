"""What a run leaves besides checkpoints and metric rows: held-out evaluations with their sample
grids, the reward curve, the exported LoRA and the emulated clock's phases.

Each is a function of the :class:`~spotlight_jax.runner.state.RunState`; the loop calls them
through its hooks (``spotlight_jax.runner.hooks``) at their cadence.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
from PIL import Image

from spotlight_jax.diffusion import prompt
from spotlight_jax.emulation.deployment import PRICING_RULE
from spotlight_jax.evaluate import evaluate as evaluate_policy
from spotlight_jax.io import provenance
from spotlight_jax.models import as_dtype
from spotlight_jax.parallel import kernels
from spotlight_jax.reporting.plots import plot_curves, plot_panels, save_grid
from spotlight_jax.rewards.motion import video_motion_parts
from spotlight_jax.rl import lora_export

LORA_EXPORT = "lora_diffusers.safetensors"


def evaluate(run, k: int) -> dict:
    """Held-out reward with the evaluation state (ODE sampler, fixed prompts and seeds); saves
    the captioned sample grid ``samples/val_<k>.png``. The first evaluation's per-sample scores
    are kept (``samples/val_scores_first.npy``) and every later one adds its paired gain over
    them (``gain_paired`` and its 95% interval: the same prompts and noise)."""
    st = run.settings
    first = os.path.join(run.workdir, "samples", "val_scores_first.npy")
    baseline = np.load(first) if os.path.exists(first) else None
    if baseline is not None and len(baseline) != len(run.val_prompts) * st.eval_seeds:
        baseline = None                 # another held-out set (a changed config): no pairing
    res, images, _ = evaluate_policy(run.eval_sampler, run.trainer.eval_state(),
                                     run.val_prompts, num_seeds=st.eval_seeds,
                                     text_len=run.mcfg.text_len, reward=run.eval_reward,
                                     tokenize=run.prompt_source.tokenize, baseline=baseline)
    scores = res.pop("scores")
    if not os.path.exists(first):
        os.makedirs(os.path.dirname(first), exist_ok=True)
        np.save(first, scores)
    pick = getattr(run.prompt_source, "shown", None)   # every edit kind / motion in the grid
    shown = pick(run.val_prompts, 32) if pick else list(range(min(32, len(run.val_prompts))))
    save_samples(run, k, images[::st.eval_seeds][shown], [run.val_prompts[i] for i in shown])
    return res


def save_samples(run, k: int, images, prompts) -> None:
    """``samples/val_<k>.png``: one image per validation prompt (its first seed, the same
    prompts and seeds every time) captioned with its prompt and reward; from the second
    evaluation on also ``samples/before_after_<k>.png``: the first evaluation's image (the
    base) next to this one for each prompt."""
    folder = os.path.join(run.workdir, "samples")
    os.makedirs(folder, exist_ok=True)
    scores = np.asarray(run.eval_reward(images, prompts), np.float64)
    parts = _part_notes(run, images, prompts)
    grid = os.path.join(folder, f"val_{k:05d}.png")
    save_grid(grid, images, cols=8,
              captions=[f"{p} [{r:.2f}{n}]" for p, r, n in zip(prompts, scores, parts)])
    with Image.open(grid) as im:                     # the captioned grid to TensorBoard / W&B
        run.writer.image(k, "samples/val", np.asarray(im.convert("RGB")),
                         caption=f"iteration {k}: one image per held-out prompt [its reward]")
    first = os.path.join(folder, "val_first.npz")
    if not os.path.exists(first):
        np.savez(first, images=images, scores=scores, iteration=k)
        return
    with np.load(first) as f:
        before, was, k0 = f["images"], f["scores"], int(f["iteration"])
    n = min(16, len(before), len(images))
    sources = _input_images(run, prompts[:n])
    if sources is None:
        pairs = np.stack([before[:n], images[:n]], 1).reshape(2 * n, *images.shape[1:])
        parts0 = _part_notes(run, before[:n], prompts[:n])
        captions = [c for p, r0, r1, n0, n1 in zip(prompts[:n], was, scores, parts0, parts)
                    for c in (f"{p} | it {k0}: {r0:.2f}{n0}", f"it {k}: {r1:.2f}{n1}")]
        save_grid(os.path.join(folder, f"before_after_{k:05d}.png"), pairs, cols=8,
                  captions=captions)
        return
    # an editing run: the image it edits | the base's edit | this one's, per prompt
    triples = np.stack([sources, before[:n], images[:n]], 1).reshape(3 * n, *images.shape[1:])
    captions = [c for p, r0, r1 in zip(prompts[:n], was, scores)
                for c in (f"source: {p.split(' | ')[0]}", f"it {k0}: {r0:.2f}",
                          f"it {k}: {r1:.2f}")]
    save_grid(os.path.join(folder, f"before_after_{k:05d}.png"), triples, cols=9,
              captions=captions)


def _part_notes(run, images, prompts) -> list[str]:
    """A caption's note per sample: the held-out reward's parts where it has them (the video
    world's count, shape, motion and persistence, so a filmstrip says what it got right), else
    empty."""
    if getattr(run.eval_reward, "name", None) != "video_motion":
        return [""] * len(prompts)
    parts = video_motion_parts(images, prompts)
    return [" = mean of " + ", ".join(f"{k} {v[i]:.2f}" for k, v in parts.items())
            for i in range(len(prompts))]


def _input_images(run, prompts):
    """The images an editing run's prompts carry for the model to edit, ``[N, H, W, 3]`` in
    [0, 1]; None for a text-to-image run (or input latents, which are no picture)."""
    tokens, _ = run.prompt_source.tokenize(prompts, run.mcfg.text_len)
    image = prompt.image_latents(tokens)
    if image is None or isinstance(image, (list, tuple)) or np.shape(image)[-1] != 3:
        return None
    return np.clip((np.asarray(image) + 1.0) / 2.0, 0.0, 1.0)


def plot_rewards(run) -> None:
    """``reward_curve.png``: the held-out reward and the training rollouts' mean so far, the
    latter per iteration (faint: it swings between batches) and as a trailing 10-iteration
    moving average (bold); with a reward mix also ``reward_terms.png``: each term of the
    training and held-out mixes on its own axis, the training terms drawn the same way."""
    window = 10             # iterations in the training reward's moving average
    evals = [h for h in run.history if "val_reward" in h]
    if not evals:
        return
    x = [h["iteration"] for h in evals]
    series = {"held-out (ODE)": (x, [h["val_reward"] for h in evals])}
    trains = [h for h in run.history if "reward_mean" in h]
    smooth = {}
    if trains:
        label = f"train rollouts ({run.train_sampler_cfg.sde_type.upper()})"
        series[label] = ([h["iteration"] for h in trains], [h["reward_mean"] for h in trains])
        smooth[label] = window
    st = run.settings
    title = f"{st.mode}: {st.reward} (held-out: {st.eval_reward})"
    plot_curves(os.path.join(run.workdir, "reward_curve.png"), series, title=title,
                smooth=smooth)
    terms = list(dict.fromkeys(  # the terms of the training and the held-out mixes, in order
        name for reward in (run.reward, run.eval_reward) if reward.is_mix
        for name in reward.term_names))
    if terms:               # a reward mix: ``reward_terms.png``, each term on its own axis
        panels = {}
        for term in terms:
            series = {}
            train = [h for h in trains if f"reward_{term}" in h]
            if train:
                series["train rollouts"] = ([h["iteration"] for h in train],
                                            [h[f"reward_{term}"] for h in train])
            held = [h for h in evals if f"val_reward_{term}" in h]
            if held:
                series["held-out (ODE)"] = ([h["iteration"] for h in held],
                                            [h[f"val_reward_{term}"] for h in held])
            if series:
                panels[term] = series
        if panels:
            plot_panels(os.path.join(run.workdir, "reward_terms.png"), panels,
                        title=f"{st.mode}: each reward term, clipped and unweighted\n"
                              f"train: {st.reward}   held-out: {st.eval_reward}",
                        smooth={"train rollouts": window})


def export_lora(run, base_source: str = "") -> str | None:
    """Writes the evaluated policy's LoRA (the EMA's when kept) in the PEFT/diffusers format to
    ``workdir/lora_diffusers.safetensors`` (for ``pipeline.load_lora_weights``); None when the
    run fine-tunes every weight or its trainer lives in another process."""
    cfg = run.trainer.cfg
    lora = run.trainer.exported_lora()
    if lora is None or jax.process_index() != 0:
        return None
    path = os.path.join(run.workdir, LORA_EXPORT)
    lora_export.export(jax.device_get(lora), cfg.lora_alpha / cfg.lora_rank, path,
                       rank=cfg.lora_rank, base=str(base_source), model=run.mcfg)
    return path


def attention_kernel(attn, mcfg) -> dict:
    """What attention the run's model computes with: the kernel ``attn``'s implementation
    resolves to for the model's dtype and head dim on its devices, the SP strategy, what was
    asked, and why no fused kernel (cuDNN flash attention, splash on TPUs) runs (when none
    does). Logged when the run is built and recorded in ``phases.json``: the first thing to
    check of an accelerator run's speed."""
    kernel = attn.resolved(as_dtype(mcfg.dtype), mcfg.head_dim).impl
    out = {"requested": attn.impl if isinstance(attn.impl, str) else attn.impl.impl,
           "kernel": kernel.impl, "strategy": attn.strategy}
    if kernel.impl not in ("cudnn", "splash"):
        devices = None if attn.mesh is None else attn.mesh.devices.flat
        out["not_cudnn"] = ("attention_impl='xla'" if out["requested"] == "xla" else
                            kernels.cudnn_refusal(as_dtype(mcfg.dtype), mcfg.head_dim, devices))
    return out


def write_phases(run) -> None:
    """``phases.json``: the emulated clock's per-phase breakdown, the cost model's assumptions
    (read by the comparison report), the pricing rule (``deployment.PRICING_RULE``), the code
    that ran (``provenance.code_version``) and the
    attention kernel the model computed with (:func:`attention_kernel`)."""
    info = {"phases": run.deploy.clock.breakdown(),
            "assumptions": [dataclasses.asdict(a) for a in run.deploy.assumptions()],
            "code": provenance.code_version(),
            "pricing": PRICING_RULE,
            "attention": attention_kernel(run.attn, run.mcfg)}
    with open(os.path.join(run.workdir, "phases.json"), "w") as f:
        json.dump(info, f, indent=1, default=str)
