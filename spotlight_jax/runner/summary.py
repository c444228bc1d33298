"""The end-of-run summary a command prints: held-out reward before and after (and whether the
gain is beyond its interval), the constraints' accuracies, the emulated deployment's time and
cost, throughput and MFU, and where the run's files are."""
from __future__ import annotations

import os

import numpy as np

from spotlight_jax.config import RunSpec
from spotlight_jax.world.video import PARTS


def gain_line(first: dict, last: dict) -> str:
    """One line: the held-out gain and whether it is beyond the evaluations' 95% interval (the
    two evaluations' half-widths combined as independent: a conservative bound, as both use the
    same prompts and seeds)."""
    gain = last["val_reward"] - first["val_reward"]
    half = (first.get("val_reward_ci95", 0.0) ** 2 + last.get("val_reward_ci95", 0.0) ** 2) ** 0.5
    verdict = "beyond" if abs(gain) > half else "inside"
    return f"gain {gain:+.3f}: {verdict} the 95% interval of the difference (±{half:.3f})"


def paired_gain_line(last: dict) -> str:
    """One line: the gain measured on the same held-out prompts and seeds before and after
    (the mean per-sample difference) and whether it is beyond its own 95% interval."""
    gain, half = last["val_gain_paired"], last["val_gain_paired_ci95"]
    verdict = "beyond" if abs(gain) > half else "inside"
    return (f"paired gain (same prompts and seeds) {gain:+.3f}: {verdict} its 95% interval "
            f"(±{half:.3f})")


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
        if "val_gain_paired" in b:
            lines.append(paired_gain_line(b))
        if any(k.startswith("val_acc_") for k in b):
            lines.append("  constraint  exact accuracy   its share of the missing reward")
        for k in sorted(k for k in b if k.startswith("val_acc_")):
            m = "val_missing_" + k[8:]
            share = (f"   {a.get(m, float('nan')):.3f} -> {b[m]:.3f}" if m in b else "")
            lines.append(f"  {k[8:]:<9}   {a.get(k, float('nan')):.2f} -> {b[k]:.2f}{share}")
        kinds = [k for k in b if k.startswith("val_kind_")]
        if "val_part_applied" in b:             # an editing run: the two factors, each kind
            lines.append(f"  edit applied {a.get('val_part_applied', float('nan')):.2f} -> "
                         f"{b['val_part_applied']:.2f}, rest of the source kept "
                         f"{a.get('val_part_preserved', float('nan')):.2f} -> "
                         f"{b['val_part_preserved']:.2f}; by kind: " + ", ".join(
                             f"{k[9:]} {a.get(k, float('nan')):.2f} -> {b[k]:.2f}"
                             for k in kinds))
        if "val_part_persistence" in b:         # a video run: the reward's four parts
            lines.append("  part          held-out mean (the reward is their mean)")
            for k in (*PARTS, "exact"):
                key = f"val_part_{k}" if k != "exact" else "val_exact"
                name = k if k != "exact" else "exact (all four)"
                lines.append(f"  {name:<16}  {a.get(key, float('nan')):.2f} -> {b[key]:.2f}")
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
