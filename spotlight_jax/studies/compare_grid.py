"""The mode comparison over config seeds and spot traces, assembled from finished runs.

  python -m spotlight_jax.studies.compare_grid run --workdir=RUN --grid=DIR --trace=T --seed=S
      --modes=MODE --iterations=N [--set=key=value ...] [--code=CHECKOUT]
  python -m spotlight_jax.studies.compare_grid archive --workdir=RUN --grid=DIR --trace=T --seed=S
  python -m spotlight_jax.studies.compare_grid report --grid=DIR [--target_gain=0.08]

``run`` makes one grid run of each of ``--modes`` (``RUN/<mode>``: ``spotlight_jax.main`` on
``configs/tiny.py`` with the grid's evaluation settings, :data:`GRID_SETTINGS`, the trace's
flags, :data:`TRACES`, and ``--set``'s overrides), one after the other, then archives it; run the
same command again to resume an interrupted run. ``--code``: the checkout to run from (a grid
reports runs of one commit: ``git worktree add CHECKOUT COMMIT`` adds to a grid made by an
earlier commit).

The full comparison (every mode x config seeds x traces) is many hours of CPU, more than one
sitting; its runs are kept as they finish. ``archive`` copies what the report needs out of each
finished mode run in ``RUN/<mode>`` (the history's report columns, rounded, as
``history.jsonl``, and the critical-path ``phases.json``: a few tens of KB, no checkpoints) into
``DIR/<trace>/seed_<s>/<mode>``. Modes that never use a spot device (``baseline``,
``explore_sync``) do not depend on the trace (tested: ``tests/studies/test_compare_grid.py``), so
they are archived once per seed under ``DIR/on_demand`` and every trace's report uses them.

``report`` refuses runs made by different commits (each run records its commit in
``phases.json``) unless ``--allow_mixed_commits``; it writes, for every trace and seed with a
``baseline`` run, the comparison's ``report.md``, ``compare.json`` and plots
(``runner.reports.write_report``), then per trace the ratios' mean and [min, max] over seeds
(``report_seeds.md``), ``DIR/grid.md``: one table of every mode's speed-up, cost, iteration
and per-iteration time ratios on every trace, and which runs are still missing, and
``DIR/headline.md`` (``spotlight_jax.reporting.headline``: several targets, interpolated
crossings, the curve-level speed-up, bootstrap intervals over seeds, censored seeds as bounds).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

from absl import app, flags

from spotlight_jax import registry
from spotlight_jax.emulation.deployment import PRICING_RULE
from spotlight_jax.io.metrics import read_jsonl
from spotlight_jax.registry import BASELINE
from spotlight_jax.reporting import headline

FLAGS = flags.FLAGS
COMMANDS = ("run", "archive", "report")  # the program's first word
ON_DEMAND = "on_demand"
TRACE_FREE_MODES = tuple(m.name for m in registry.MODES if not m.uses_spot)
# history columns the report reads (runner.reports.mode_summary, the plots); the rest stays in
# the run's own rl.jsonl
# the trace's events, which every run counts; a trace-free mode's archive drops them (its
# report row would otherwise show the events of whichever trace it happened to run on)
TRACE_EVENTS = ("spot_alive", "preemptions", "abrupt_losses", "joins", "regroups", "regroup_s",
                "lost_work_s")
# the shared update's columns: its critical-path seconds and where its shards ran
UPDATE = ("update_s", "update_trainer_s", "update_split", "update_shards", "update_shards_spot")
KEEP = ("iteration", "vtime_s", "dollars", "reward_mean", "explore_candidates", "spot_util",
        "fleet_regroups", "fleet_regroup_max_s", "fleet_compiles", "pipelined") + TRACE_EVENTS \
    + UPDATE


# the grid's runs: evaluation every 5 iterations on the 62-prompt x 8-seed set, no time limit
GRID_SETTINGS = {"rl.max_minutes": 0, "rl.eval_every": 5, "rl.eval_seeds": 8,
                 "compare.target_gain": 0.08}
_GCP = "skypilot/preemption/1-node/gcp-04-30-2023"
TRACES = {
    "synthetic": {},
    # 4 V100 nodes in us-east-2a, from the second where the grid starts (their preemptions)
    "aws": {"trace.path": "skypilot/preemption/4-node/aws-08-03-2023/us-east-2a_v100_1.json",
            "trace.start_s": 529800},
    # four 1-node GCP zones merged into one 4-node pool
    "gcp": {"trace.path": ",".join(f"{_GCP}/{z}_c3-88.json" for z in (
        "us-central1-a", "us-central1-b", "us-central1-c", "us-east1-b")),
        "trace.cloud": "gcp", "trace.start_s": 2730},
}
"""The grid's traces by name -> their config overrides (``trace.path`` relative to the trace
folder, ``$SPOTLIGHT_TRACES`` or ``../shared/traces``)."""
SEED_WINDOW_S = 4 * 3600.0
"""A recorded trace's window per config seed: seed ``s`` replays it from ``trace.start_s + s x``
this (longer than any grid run's emulated span), so the seeds of a trace are independent
stretches of it, not one realisation; the synthetic trace draws its own (``trace.seed = s``)."""


def trace_overrides(trace: str, seed: int = 0, trace_dir=None) -> dict:
    """The config overrides of the grid's trace ``trace`` (:data:`TRACES`) for config seed
    ``seed`` (its own trace draw or window, :data:`SEED_WINDOW_S`), paths absolute."""
    from spotlight_jax.emulation.traces import default_trace_dir  # noqa: PLC0415
    if trace not in TRACES:
        raise ValueError(f"--trace={trace!r}: the grid's traces are {', '.join(TRACES)}")
    root = pathlib.Path(trace_dir) if trace_dir else default_trace_dir()
    out = {**TRACES[trace], "trace.seed": seed}
    if "trace.path" in out:
        out["trace.path"] = ",".join(str(root / p) for p in out["trace.path"].split(","))
        out["trace.start_s"] = out.get("trace.start_s", 0) + seed * SEED_WINDOW_S
    return out


def run_command(workdir: str, trace: str, seed: int, mode: str, iterations: int,
                overrides=(), trace_dir=None) -> list[str]:
    """The argv of one grid run (``python -m spotlight_jax.main ...``): the grid's settings,
    the trace's flags, then ``overrides`` (``key=value``; they win)."""
    if mode not in modes():
        raise ValueError(f"--modes: unknown {mode!r}; the modes are {', '.join(modes())}")
    keys = {"mode": mode, "seed": seed, "rl.iterations": iterations, **GRID_SETTINGS,
            **trace_overrides(trace, seed, trace_dir)}
    return [sys.executable, "-m", "spotlight_jax.main", "--config=configs/tiny.py",
            f"--workdir={os.path.join(workdir, mode)}",
            *(f"--config.{k}={v}" for k, v in keys.items()),
            *(f"--config.{kv}" for kv in overrides)]


def run(workdir: str, grid: str, trace: str, seed: int, modes_: tuple[str, ...],
        iterations: int, overrides=(), code: str | None = None) -> list[str]:
    """Each of ``modes_`` run (:func:`run_command`, from the checkout ``code``, default this
    one) and archived into ``grid``; returns the modes archived. A run that fails stops here
    with its log's last lines (its work directory kept: the same command resumes it)."""
    import subprocess  # noqa: PLC0415
    if not modes_:
        raise ValueError("run: give the modes to run (--modes=baseline,spotlight_pipelined)")
    cwd = os.path.abspath(code) if code else str(pathlib.Path(__file__).resolve().parents[2])
    os.makedirs(workdir, exist_ok=True)
    done = []
    for mode in modes_:
        cmd = run_command(os.path.abspath(workdir), trace, seed, mode, iterations, overrides)
        log = os.path.join(workdir, f"{mode}.log")
        with open(log, "w") as f:
            finished = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
        if finished.returncode:
            tail = open(log).read()[-800:]
            raise RuntimeError(f"{mode} (trace {trace}, seed {seed}) failed; {log} ends:\n{tail}")
        done += archive(workdir, grid, trace, seed, iterations, (mode,))
    return done


def modes() -> tuple[str, ...]:
    return registry.mode_names()


def history_from_jsonl(path: str) -> list[dict]:
    """A run's history as ``runner.loop.run`` returns it, rebuilt from its ``rl.jsonl`` (``step`` is
    the iteration; the start row has no clock columns, which are 0 there)."""
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no rows; is it the rl.jsonl of a run that started?")
    out = []
    for r in rows:
        h = {k: v for k, v in r.items() if k not in ("step", "time")}
        h["iteration"] = int(r["step"])
        if h["iteration"] == 0:
            h.setdefault("vtime_s", 0.0)
            h.setdefault("dollars", 0.0)
        out.append(h)
    return out


def compact(row: dict, mode: str) -> dict:
    """The history row's report columns, floats rounded to 6 decimals."""
    drop = TRACE_EVENTS if mode in TRACE_FREE_MODES else ()
    keep = {k: v for k, v in row.items()
            if (k in KEEP or k.startswith("val_")) and k not in drop}
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in keep.items()}


def mode_dir(grid: str, trace: str, seed: int, mode: str) -> str:
    """Where a mode's archived run lives: per trace, or once per seed for a trace-free mode."""
    where = ON_DEMAND if mode in TRACE_FREE_MODES else trace
    return os.path.join(grid, where, f"seed_{seed}", mode)


def archive(workdir: str, grid: str, trace: str, seed: int, iterations: int,
            only: tuple[str, ...] = ()) -> list[str]:
    """Copies every mode run under ``workdir`` (or those named in ``only``), each of which must
    have finished ``iterations``, into the grid; returns the modes archived. A run that stopped
    early is refused (its time to the target would be a different experiment's)."""
    if not trace or trace == ON_DEMAND or os.sep in trace:
        raise ValueError(f"--trace={trace!r}: give a plain name (e.g. synthetic, aws, gcp), not "
                         f"{ON_DEMAND!r} or a path")
    unknown = sorted(set(only) - set(modes()))
    if unknown:
        raise ValueError(f"--modes: unknown {unknown}; the modes are {', '.join(modes())}")
    done = []
    for mode in only or modes():
        src = os.path.join(workdir, mode)
        jsonl, phases = os.path.join(src, "rl.jsonl"), os.path.join(src, "phases.json")
        if not os.path.exists(jsonl):
            continue
        hist = history_from_jsonl(jsonl)
        if hist[-1]["iteration"] != iterations or not os.path.exists(phases):
            raise ValueError(f"{src}: the run is at iteration {hist[-1]['iteration']} of "
                             f"{iterations} (or has no phases.json); finish it (run the same "
                             "command again: it resumes) before archiving")
        dst = mode_dir(grid, trace, seed, mode)
        rows = [compact(h, mode) for h in hist]
        kept = os.path.join(dst, "history.jsonl")
        if (mode in TRACE_FREE_MODES and os.path.exists(kept)
                and read_jsonl(kept) != rows):
            raise ValueError(f"{src}: {mode} never uses a spot device, yet its run differs from "
                             f"the one archived for seed {seed} ({kept}); were the two run "
                             "with different settings?")
        os.makedirs(dst, exist_ok=True)
        with open(kept, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        shutil.copyfile(phases, os.path.join(dst, "phases.json"))
        done.append(mode)
    if not done:
        raise ValueError(f"--workdir={workdir}: no <mode>/rl.jsonl under it (modes: "
                         f"{', '.join(modes())})")
    return done


def _load(path: str) -> tuple[list[dict], dict]:
    with open(os.path.join(path, "phases.json")) as f:
        info = json.load(f)
    return read_jsonl(os.path.join(path, "history.jsonl")), info


def grid_runs(grid: str) -> dict[str, dict[int, dict[str, str]]]:
    """``trace -> seed -> mode -> archived run directory`` for every trace folder of the grid,
    the trace-free modes taken from ``on_demand`` for each seed that has them."""
    out = {}

    def has_seeds(d):      # a trace's folder holds seed_<s> folders (others: notes, sweeps)
        return os.path.isdir(d) and any(x.startswith("seed_") for x in os.listdir(d))

    traces = sorted(t for t in os.listdir(grid)
                    if t != ON_DEMAND and has_seeds(os.path.join(grid, t)))
    seeds = set()
    for t in traces + [ON_DEMAND]:
        d = os.path.join(grid, t)
        if os.path.isdir(d):
            seeds |= {int(s[5:]) for s in os.listdir(d) if s.startswith("seed_")}
    for t in traces:
        out[t] = {}
        for s in sorted(seeds):
            runs = {m: mode_dir(grid, t, s, m) for m in modes()}
            runs = {m: p for m, p in runs.items()
                    if os.path.exists(os.path.join(p, "history.jsonl"))}
            if runs:
                out[t][s] = runs
    return out


def pricing_of(info: dict) -> int:
    """The pricing rule a run's ``phases.json`` records (1: runs from before it was recorded;
    ``emulation.deployment.PRICING_RULE``)."""
    return int(info.get("pricing", 1))


def repriced_rewards(history: list[dict], info: dict) -> tuple[list[dict], dict]:
    """A ``baseline`` run priced by rule 1, re-priced by the current rule from its recorded
    phases: its rewards were charged one image after another on its on-demand devices, and are
    now split over them. Its learning does not depend on its clock, so only ``vtime_s`` and,
    in proportion (it pays for its on-demand devices alone), ``dollars`` change; the phases'
    reward row is re-priced with them. A ValueError when the run cannot be re-priced exactly
    (iterations of different lengths)."""
    reward = info["phases"]["reward"]
    devices = reward["busy_on_demand_device_s"] / reward["critical_s"]
    iterations = history[-1]["iteration"]
    if abs(devices - round(devices)) > 1e-6 or iterations < 1:
        raise ValueError(f"cannot re-price: rewards on {devices:g} devices over {iterations} "
                         "iterations")
    devices = round(devices)
    per_iteration = history[-1]["vtime_s"] / iterations
    if any(abs(h["vtime_s"] - h["iteration"] * per_iteration) > 1e-3 * max(h["iteration"], 1)
           for h in history):
        raise ValueError("cannot re-price: the run's iterations differ in length (a trace "
                         "or a varying batch decided them)")
    saved = reward["critical_s"] / iterations * (1.0 - 1.0 / devices)
    scale = (per_iteration - saved) / per_iteration
    out = [{**h, "vtime_s": h["vtime_s"] - h["iteration"] * saved,
            "dollars": h.get("dollars", 0.0) * scale} for h in history]
    phases = {**info["phases"], "reward": {
        **reward, "critical_s": reward["critical_s"] / devices,
        "charged_s": reward["charged_s"] / devices,
        "busy_on_demand_device_s": reward["busy_on_demand_device_s"] / devices}}
    return out, {**info, "phases": phases, "pricing": PRICING_RULE, "repriced_from": 1}


def code_of(runs: dict[str, dict[int, dict[str, str]]]) -> str:
    """The one commit every archived run was made by, as a line for ``grid.md``; a ValueError
    naming the runs when they were made by different commits or from a checkout with changes
    (a ratio of two runs of different code measures the code change as well as the mode).
    ``baseline`` runs priced by an earlier rule are re-priced (:func:`repriced_rewards`), not
    re-run: their commit is stated apart. A spot mode's run priced by an earlier rule is
    refused (its clock decided which spot devices it had: re-run it)."""
    seen: dict[str, list[str]] = {}
    repriced: set[str] = set()
    for seeds in runs.values():
        for seed, by_mode in seeds.items():
            for mode, path in by_mode.items():
                with open(os.path.join(path, "phases.json")) as f:
                    info = json.load(f)
                code = info.get("code") or {}
                if pricing_of(info) != PRICING_RULE:
                    if mode != BASELINE:
                        raise ValueError(
                            f"{path}: priced by rule {pricing_of(info)}, not the current "
                            f"{PRICING_RULE}; only {BASELINE} runs can be re-priced (a "
                            "spot mode's clock decided its devices): re-run it")
                    repriced.add(code.get("commit", "unrecorded")[:12])
                    continue
                key = ("unrecorded" if not code.get("commit") else
                       code["commit"][:12] + (" with local changes" if code.get("dirty") else ""))
                where = (f"{ON_DEMAND} seed {seed} {mode}" if mode in TRACE_FREE_MODES
                         else path)
                if where not in seen.get(key, []):
                    seen.setdefault(key, []).append(where)
    apart = (f" {BASELINE} made by commit {', '.join(sorted(repriced))} under pricing rule 1 "
             f"and re-priced by rule {PRICING_RULE} from its recorded phases (its learning "
             "does not depend on its clock)." if repriced else "")
    if not seen:
        return f"Code:{apart}" if apart else ""
    if len(seen) > 1 or any("with local changes" in k for k in seen):
        detail = "; ".join(f"{k}: {len(v)} run(s), e.g. {v[0]}" for k, v in sorted(seen.items()))
        raise ValueError(f"the grid's runs were not all made by one clean commit ({detail}); "
                         "re-run the odd ones from the grid's commit, or pass "
                         "--allow_mixed_commits to report them anyway")
    (key,) = seen
    if key == "unrecorded":
        return "Code: the runs record no commit (archived before runs recorded one)." + apart
    return (f"Code: every run made by commit {key}." if not apart else
            f"Code: every run priced by rule {PRICING_RULE} made by commit {key};{apart}")


def repriced(history: list[dict], dollars_per_hour: float) -> list[dict]:
    """``history`` with its dollars re-priced at ``dollars_per_hour`` of emulated time."""
    return [{**h, "dollars": float(h.get("vtime_s", 0.0)) * dollars_per_hour / 3600.0}
            for h in history]


def write_grid(grid: str, target_gain: float, target_frac: float = 1.0,
               allow_mixed_commits: bool = False, baseline_dollars_per_hour: float = 0.0) -> str:
    """Every trace's and seed's report, each trace's seed summary, and ``grid.md``. Refuses
    runs made by different commits (``code_of``) unless ``allow_mixed_commits``.
    ``baseline_dollars_per_hour`` > 0: the trace-free modes' dollars re-priced at that rate
    (their on-demand devices): runs recorded before such modes stopped paying for the
    deployment's idle spot nodes."""
    from spotlight_jax.emulation.cost_models import Assumption  # noqa: PLC0415
    from spotlight_jax.reporting import compare_report  # noqa: PLC0415

    runs = grid_runs(grid)
    try:
        code = code_of(runs)
    except ValueError as e:
        if not allow_mixed_commits:
            raise
        code = f"Code: **mixed commits** (reported with --allow_mixed_commits): {e}"
    all_modes = modes()
    if baseline_dollars_per_hour > 0:
        code = (code + " " if code else "") + (
            f"Trace-free modes ({', '.join(TRACE_FREE_MODES)}) re-priced at "
            f"${baseline_dollars_per_hour:g}/h, their on-demand devices only (as recorded they "
            "also paid for the deployment's idle spot nodes).")

    def load(mode, path):
        hist, info = _load(path)
        if mode == BASELINE and pricing_of(info) != PRICING_RULE:
            hist, info = repriced_rewards(hist, info)
        if mode in TRACE_FREE_MODES and baseline_dollars_per_hour > 0:
            hist = repriced(hist, baseline_dollars_per_hour)
        return hist, info

    lines = ["# Mode comparison: every trace and config seed", "",
             f"Built by `python -m spotlight_jax.studies.compare_grid report --grid={grid} "
             f"--target_gain={target_gain:g}` from the archived runs below it. Each cell: "
             "mean [min, max] over the seeds where both the mode and baseline reached the "
             "target (n of the seeds run), then the seeds where only one did, bounded by the "
             "other's whole run ('> x': baseline did not reach it, '< x': the mode did not); "
             "> 1 means faster or cheaper than baseline.", ""] + ([code, ""] if code else [])
    for trace, seeds in runs.items():
        seed_dirs = {}
        for seed, by_mode in seeds.items():
            if BASELINE not in by_mode:
                continue
            loaded = {m: load(m, p) for m, p in by_mode.items()}
            out = os.path.join(grid, trace, f"seed_{seed}")
            os.makedirs(out, exist_ok=True)
            assumptions = next(iter(loaded.values()))[1]["assumptions"]
            compare_report.write_report(
                out, {m: h for m, (h, _) in loaded.items()}, target_frac=target_frac,
                target_gain=target_gain, phases={m: i["phases"] for m, (_, i) in loaded.items()},
                assumptions=[Assumption(**a) for a in assumptions],
                header=f"Config seed {seed}; trace: {trace}. Learning is real (tiny model); "
                       "time and cost are emulated from the cost model below.")
            seed_dirs[seed] = out
        if not seed_dirs:
            continue
        compare_report.write_seed_report(os.path.join(grid, trace), seed_dirs,
                                         header=f"Trace: {trace}.")
        with open(os.path.join(grid, trace, "compare_seeds.json")) as f:
            ratios = json.load(f)["ratios"]
        lines += [f"## {trace}", "", f"Seeds: {', '.join(map(str, seed_dirs))} "
                  f"([report]({trace}/report_seeds.md)).", "",
                  "| mode | " + " | ".join(n for n, _ in compare_report.RATIOS) + " |",
                  "|---|" + "---|" * len(compare_report.RATIOS)]
        for m in all_modes:
            if m not in ratios:
                continue
            lines.append(f"| {m} | " + " | ".join(
                compare_report.ratio_cell(ratios[m][name], len(seed_dirs))
                for name, _ in compare_report.RATIOS) + " |")
        lines.append("")
    # what a seed lacks of the modes the grid runs (those archived for some trace and seed)
    grid_modes = [m for m in all_modes if any(m in by_mode for seeds in runs.values()
                                              for by_mode in seeds.values())]
    missing = [f"{t} seed {s}: {', '.join(m for m in grid_modes if m not in by_mode)}"
               for t, seeds in runs.items() for s, by_mode in seeds.items()
               if any(m not in by_mode for m in grid_modes)]
    lines += ["## Runs not archived yet", ""] + ([f"- {x}" for x in missing] or ["none"]) + [""]
    histories = {t: {s: {m: load(m, p)[0] for m, p in by_mode.items()}
                     for s, by_mode in seeds.items()} for t, seeds in runs.items()}
    headline.write_headline(grid, histories, list(all_modes), code_line=code)
    lines += ["Every crossing, interpolated, with bootstrap intervals over seeds and the "
              "curve-level speed-up: [headline.md](headline.md).", ""]
    path = os.path.join(grid, "grid.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This program's flags (defined only when it runs; see ``programs``)."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("workdir", None, "run, archive: a run directory holding <mode>/ folders",
                        **fv)
    flags.DEFINE_string("grid", None, "the grid directory (e.g. docs/compare_grid)", **fv)
    flags.DEFINE_string("trace", "synthetic", "run, archive: the trace's name in the grid (run: "
                        f"one of {', '.join(TRACES)})", **fv)
    flags.DEFINE_integer("seed", 0, "run, archive: the runs' config seed", **fv)
    flags.DEFINE_list("modes", [], "run: the modes to run; archive: only these modes "
                      "(default: every one in workdir)", **fv)
    flags.DEFINE_integer("iterations", 120, "run: the runs' iterations; archive: the iterations "
                         "every run must have done", **fv)
    flags.DEFINE_multi_string("set", [], "run: a config override key=value, repeated (e.g. "
                              "--set=deployment.spot_nodes=8 --set=num_cpu_devices=20)", **fv)
    flags.DEFINE_string("code", None, "run: the checkout to run from (default: this one)", **fv)
    flags.DEFINE_float("target_gain", 0.08, "report: target = baseline's start + this", **fv)
    flags.DEFINE_bool("allow_mixed_commits", False,
                      "report: report runs made by different commits (marked as such)", **fv)
    flags.DEFINE_float("baseline_dollars_per_hour", 0.0,
                       "report: re-price the trace-free modes at this $/h of emulated time "
                       "(their on-demand devices; 0 = as recorded)", **fv)


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError("give one command: run, archive or report")
    if not FLAGS.grid:
        raise app.UsageError("--grid=DIR is required")
    if argv[1] == "run":
        if not FLAGS.workdir:
            raise app.UsageError("run needs --workdir=RUN")
        try:
            done = run(FLAGS.workdir, FLAGS.grid, FLAGS.trace, FLAGS.seed, tuple(FLAGS.modes),
                       FLAGS.iterations, tuple(FLAGS.set), FLAGS.code)
        except (ValueError, RuntimeError) as e:
            raise app.UsageError(str(e)) from None
        print(f"ran and archived {', '.join(done)} (trace {FLAGS.trace}, seed {FLAGS.seed})")
    elif argv[1] == "archive":
        if not FLAGS.workdir:
            raise app.UsageError("archive needs --workdir=RUN")
        done = archive(FLAGS.workdir, FLAGS.grid, FLAGS.trace, FLAGS.seed, FLAGS.iterations,
                       tuple(FLAGS.modes))
        print(f"archived {', '.join(done)} (trace {FLAGS.trace}, seed {FLAGS.seed})")
    else:
        try:
            path = write_grid(FLAGS.grid, FLAGS.target_gain,
                              allow_mixed_commits=FLAGS.allow_mixed_commits,
                              baseline_dollars_per_hour=FLAGS.baseline_dollars_per_hour)
        except ValueError as e:
            raise app.UsageError(str(e)) from None
        print(open(path).read())


if __name__ == "__main__":
    define_flags()
    app.run(main)
