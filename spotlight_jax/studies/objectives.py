"""Flow-GRPO vs the forward-process objective from the shipped base: same seeds, same RL minutes.

  python -m spotlight_jax.studies.objectives [--seeds 0,1,2] [--minutes 15] [--out DIR]
  python -m spotlight_jax.studies.objectives --out DIR --report_only     # tables from DIR's runs
  python -m spotlight_jax.studies.objectives --seeds 0 -- --config.rl.lr=1e-3  # more config flags

Each (objective, seed) is one ``python -m spotlight_jax.main`` run of ``configs/tiny.py`` in
``baseline`` mode (no spot devices: the objective alone) into ``DIR/<objective>_s<seed>``; a run
already there resumes (or, when finished, is only read). The held-out reward (62 prompts x
``--eval_seeds`` seeds, ODE) is printed against RL minutes and against trained images, as a mean
over seeds with the spread, with each constraint's exact accuracy at the end; ``DIR/objectives.png``
plots both axes and ``DIR/objectives.json`` keeps every curve. Run on a quiet machine: the budget
is wall time.

Arguments after ``--`` are more ``--config.x=y`` overrides, passed to every run's
``spotlight_jax.main`` command line after this benchmark's own (absl leaves everything after
``--`` unparsed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from absl import app, flags

from spotlight_jax import programs, registry

FLAGS = flags.FLAGS

OBJECTIVES = registry.OBJECTIVES
# iterations between evaluations: about every 3.4 RL minutes at each objective's speed
EVAL_EVERY = {"flow_grpo": 40, "nft": 80}


def run_one(out: str, objective: str, seed: int, minutes: float, eval_seeds: int,
            extra: list[str]) -> str:
    workdir = os.path.join(out, f"{objective}_s{seed}")
    cmd = [sys.executable, "-m", "spotlight_jax.main", "--config=configs/tiny.py",
           f"--workdir={workdir}", "--config.mode=baseline", f"--config.seed={seed}",
           f"--config.rl.objective={objective}", f"--config.rl.max_minutes={minutes}",
           f"--config.rl.eval_every={EVAL_EVERY[objective]}",
           f"--config.rl.eval_seeds={eval_seeds}", *extra]
    print("$", " ".join(cmd[1:]), flush=True)
    with open(workdir + ".log", "a") as log:
        subprocess.run(cmd, check=True, cwd=programs.REPO, stdout=log, stderr=subprocess.STDOUT)
    return workdir


def curve(workdir: str, images_per_iteration: int) -> dict:
    """The run's evaluations: RL minutes, iterations, trained images, held-out reward (+ CI)
    and each constraint's exact accuracy."""
    from spotlight_jax.io.metrics import read_jsonl  # noqa: PLC0415

    rows = read_jsonl(os.path.join(workdir, "rl.jsonl"))
    out = {"minutes": [], "iteration": [], "images": [], "reward": [], "ci95": [], "acc": {}}
    for r in rows:
        if "val_reward" not in r:
            continue
        it = int(r["step"])
        out["minutes"].append(float(r.get("rl_time_s", 0.0)) / 60)
        out["iteration"].append(it)
        out["images"].append(it * images_per_iteration)
        out["reward"].append(float(r["val_reward"]))
        out["ci95"].append(float(r.get("val_reward_ci95", 0.0)))
        for k, v in r.items():
            if k.startswith("val_acc_"):
                out["acc"].setdefault(k[8:], []).append(float(v))
    times = [r["time_rollout"] + r["time_train"] for r in rows if "time_train" in r][1:]
    out["s_per_iteration"] = float(np.median(times)) if times else float("nan")
    return out


def at(c: dict, axis: str, x: float) -> float:
    """The held-out reward interpolated at ``x`` on ``axis`` (NaN past the run's end)."""
    xs = np.asarray(c[axis])
    return float(np.interp(x, xs, c["reward"])) if len(xs) and x <= xs[-1] + 1e-9 \
        else float("nan")


def report(curves: dict, minutes: float) -> str:
    grid = [0.0] + [minutes * f for f in (1 / 6, 1 / 3, 1 / 2, 2 / 3, 5 / 6)]
    lines = ["held-out reward (62 prompts, ODE) vs RL minutes: mean over seeds [min, max]",
             f"{'objective':<10}" + "".join(f"{m:>20.1f}" for m in grid) + f"{'end':>20}"
             + f"{'gain':>20}{'s/it':>7}{'iters':>7}"]
    for obj, runs in curves.items():
        cells = []
        for m in grid:
            v = np.array([at(c, "minutes", m) for c in runs.values()])
            cells.append(_cell(v))
        ends = np.array([c["reward"][-1] for c in runs.values()])
        gains = ends - np.array([c["reward"][0] for c in runs.values()])
        its = np.mean([c["iteration"][-1] for c in runs.values()])
        spi = np.median([c["s_per_iteration"] for c in runs.values()])
        lines.append(f"{obj:<10}" + "".join(f"{x:>20}" for x in cells) + f"{_cell(ends):>20}"
                     + f"{_cell(gains, signed=True):>20}{spi:>7.2f}{its:>7.0f}")
    lines.append("")
    lines.append("per seed: base -> end (±95% CI at the end), exact accuracy per constraint "
                 "base -> end")
    for obj, runs in curves.items():
        for seed, c in runs.items():
            acc = "  ".join(f"{k} {v[0]:.2f}->{v[-1]:.2f}" for k, v in sorted(c["acc"].items()))
            lines.append(f"  {obj:<10} seed {seed}: {c['reward'][0]:.3f} -> {c['reward'][-1]:.3f}"
                         f" (±{c['ci95'][-1]:.3f}) at {c['minutes'][-1]:.1f} min, "
                         f"{c['iteration'][-1]} it.  {acc}")
    lines.append("")
    images = sorted({x for runs in curves.values() for c in runs.values() for x in c["images"]})
    marks = [x for x in (1280, 2560, 5120, 10240, 20480) if images and x <= images[-1]]
    lines.append("held-out reward vs trained images (prompts x G per iteration): mean over seeds")
    lines.append(f"{'objective':<10}" + "".join(f"{m:>10}" for m in marks))
    for obj, runs in curves.items():
        vals = [np.array([at(c, "images", m) for c in runs.values()]) for m in marks]
        lines.append(f"{obj:<10}" + "".join(
            f"{np.mean(v[np.isfinite(v)]):>10.3f}" if np.isfinite(v).any() else f"{'-':>10}"
            for v in vals))
    return "\n".join(lines)


def _cell(v, signed=False) -> str:
    v = v[np.isfinite(v)]
    if not len(v):
        return "-"
    f = "+.3f" if signed else ".3f"
    return f"{np.mean(v):{f}} [{np.min(v):.2f},{np.max(v):.2f}]"


def plot(curves: dict, path: str, minutes: float) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colors = {"flow_grpo": "tab:blue", "nft": "tab:red"}
    for obj, runs in curves.items():
        col = colors.get(obj, None)
        for axis, ax in zip(("minutes", "images"), axes):
            for c in runs.values():
                ax.plot(c[axis], c["reward"], color=col, alpha=0.35, lw=1)
            end = min(c[axis][-1] for c in runs.values())
            xs = np.linspace(0, end, 40)
            mean = np.mean([[at(c, axis, x) for x in xs] for c in runs.values()], axis=0)
            label = f"{obj} (mean of {len(runs)} seeds)" if len(runs) > 1 else f"{obj} (1 seed)"
            ax.plot(xs, mean, color=col, lw=2.2, label=label)
    base = np.mean([c["reward"][0] for runs in curves.values() for c in runs.values()])
    for ax in axes:
        ax.axhline(base, color="grey", ls=":", lw=1)
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("RL minutes (rollouts + updates, 2 CPU cores)")
    axes[1].set_xlabel("trained images")
    axes[0].set_ylabel("held-out geneval_lite (62 prompts, ODE 20 steps)")
    axes[0].legend(loc="lower right")
    fig.suptitle(f"Flow-GRPO vs forward-process (nft) objective from the shipped base, "
                 f"{minutes:g} RL minutes each (thin: single seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds, one run per objective each.",
                        **fv)
    flags.DEFINE_string("objectives", ",".join(OBJECTIVES),
                        f"Comma-separated objectives, from {OBJECTIVES}.", **fv)
    flags.DEFINE_float("minutes", 15.0, "RL minutes per run (rl.max_minutes).", **fv)
    flags.DEFINE_integer("eval_seeds", 8, "Seeds per held-out prompt (rl.eval_seeds).", **fv)
    flags.DEFINE_string("out", "/tmp/spotlight_objectives", "Directory of the runs and tables.",
                        **fv)
    flags.DEFINE_bool("report_only", False, "Only read the runs in --out.", **fv)


def main(argv):
    extra = argv[1:]
    bad = [a for a in extra if not a.startswith("--config.")]
    if bad:
        raise app.UsageError(f"unexpected arguments {bad}: after -- give only --config.x=y "
                             f"overrides for the runs")
    os.makedirs(FLAGS.out, exist_ok=True)
    seeds = [int(s) for s in FLAGS.seeds.split(",")]
    objectives = FLAGS.objectives.split(",")
    for obj in objectives:
        if obj not in OBJECTIVES:
            raise app.UsageError(f"--objectives: unknown {obj!r}; choose from {OBJECTIVES}")
    from spotlight_jax.config import load_config  # noqa: PLC0415
    rl = load_config("tiny").rl
    per_iteration = rl.prompts_per_iter * rl.group_size
    curves: dict = {}
    for obj in objectives:
        for seed in seeds:
            workdir = os.path.join(FLAGS.out, f"{obj}_s{seed}")
            if not FLAGS.report_only:
                run_one(FLAGS.out, obj, seed, FLAGS.minutes, FLAGS.eval_seeds, extra)
            if os.path.exists(os.path.join(workdir, "rl.jsonl")):
                curves.setdefault(obj, {})[seed] = curve(workdir, per_iteration)
    if not curves:
        raise SystemExit(f"no runs in {FLAGS.out}")
    text = report(curves, FLAGS.minutes)
    print(text)
    with open(os.path.join(FLAGS.out, "objectives.json"), "w") as f:
        json.dump(curves, f, indent=1)
    with open(os.path.join(FLAGS.out, "objectives.txt"), "w") as f:
        f.write(text + "\n")
    plot(curves, os.path.join(FLAGS.out, "objectives.png"), FLAGS.minutes)
    print(f"plot: {os.path.join(FLAGS.out, 'objectives.png')}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
