"""The mode comparison's reports, written from run histories: the target, each mode's time,
cost and iterations to it, the ratios to ``baseline``, the plots, and the ratios' spread over
config seeds. ``runner.compare`` runs the modes and calls these; ``studies.compare_grid`` rebuilds
them from archived runs.

Target: ``base + target_frac x (best validation reward of baseline - base)`` (or ``base +
target_gain``), i.e. the share of the baseline's own gain that every mode must reach;
time/cost-to-target are the emulated hours and dollars of the first evaluation at or above it
(``None``: not reached). Ratios are ``baseline / mode`` (> 1: the mode is faster or cheaper).
"""
from __future__ import annotations

import json
import os

from spotlight_jax.registry import BASELINE, RENAMED_MODES
from spotlight_jax.reporting.plots import plot_curves


def evals(history: list[dict]) -> list[dict]:
    return [h for h in history if "val_reward" in h]


def target_reward(histories: dict[str, list[dict]], frac: float,
                  gain: float = 0.0) -> float | None:
    """``base + gain`` with ``gain`` > 0 (a fixed gain over baseline's start), else ``base +
    frac x (best baseline - base)``; None when the baseline did not improve (or has no
    evaluation after its start)."""
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"compare.target_frac must be in (0, 1], got {frac}")
    if gain < 0:
        raise ValueError(f"compare.target_gain must be >= 0 (0 = use target_frac), got {gain}")
    ev = evals(histories.get(BASELINE, []))
    if len(ev) < 2:
        return None
    base, best = ev[0]["val_reward"], max(h["val_reward"] for h in ev[1:])
    if gain:
        return base + gain
    return base + frac * (best - base) if best > base else None


def first_reaching(history: list[dict], target: float | None, key: str) -> float | None:
    """``key`` (e.g. ``vtime_s``, ``dollars``) of the first evaluation after iteration 0 whose
    validation reward is >= ``target``."""
    if target is None:
        return None
    for h in evals(history)[1:]:
        if h["val_reward"] >= target:
            return float(h[key])
    return None


def _per_iteration_h(history: list[dict], target: float | None) -> float | None:
    """Emulated hours per iteration up to the first evaluation at or above ``target`` (None
    when the run never reaches it)."""
    t, its = (first_reaching(history, target, k) for k in ("vtime_s", "iteration"))
    return t / 3600.0 / its if t is not None and its else None


def mode_summary(history: list[dict], target: float | None) -> dict:
    """Per-mode numbers of the report's main table."""
    ev, steps = evals(history), [h for h in history if "reward_mean" in h]
    last = history[-1] if history else {}
    explore = [h.get("explore_candidates", 0) for h in steps]
    return {
        "iterations": last.get("iteration", 0),
        "base_reward": ev[0]["val_reward"] if ev else None,
        "final_reward": ev[-1]["val_reward"] if ev else None,
        "best_reward": max(h["val_reward"] for h in ev) if ev else None,
        "hours": last.get("vtime_s", 0.0) / 3600.0,
        "dollars": last.get("dollars", 0.0),
        "time_to_target_h": (None if (t := first_reaching(history, target, "vtime_s")) is None
                             else t / 3600.0),
        "cost_to_target": first_reaching(history, target, "dollars"),
        "iterations_to_target": first_reaching(history, target, "iteration"),
        # one definition of a per-iteration time, the headline's: up to the target, so the
        # speed-up is the iteration ratio times the per-iteration ratio
        "h_per_iteration": _per_iteration_h(history, target),
        "spot_util": last.get("spot_util", 0.0),
        "explore_per_iter": sum(explore) / len(explore) if explore else 0.0,
        "preemptions": last.get("preemptions", 0),
        "abrupt_losses": last.get("abrupt_losses", 0),
        "joins": last.get("joins", 0),
        "regroups": last.get("regroups", 0),
        "regroup_s": last.get("regroup_s", 0.0),
        "lost_work_s": last.get("lost_work_s", 0.0),
        # real regroups of the SpotFleet (spotlight, emulated transport), measured wall time
        "fleet_regroups": sum(h.get("fleet_regroups", 0) for h in history),
        "fleet_regroup_max_ms": 1e3 * max((h.get("fleet_regroup_max_s", 0.0) for h in history),
                                          default=0.0),
        "fleet_compiles": sum(h.get("fleet_compiles", 0) for h in history),
        # the shared update (deployment.shared_update): its windows, the trainer alone, and
        # the share of its gradient shards the spot groups computed
        "update_s": sum(h.get("update_s", 0.0) for h in steps),
        "update_trainer_s": sum(h.get("update_trainer_s", 0.0) for h in steps),
        "update_spot_shards": sum(h.get("update_shards_spot", 0) for h in steps),
        "update_shards": sum(h.get("update_shards", 0) for h in steps),
        "update_split": _mean([h["update_split"] for h in steps if "update_split" in h]),
    }


def _ratio(base, x):
    return None if base is None or x is None or x <= 0 else base / x


# a run that never reached the target took longer than its whole run: its total bounds it
_RUN_TOTALS = {"time_to_target_h": "hours", "cost_to_target": "dollars",
               "iterations_to_target": "iterations"}


def ratio_bound(base: dict, row: dict, key: str) -> tuple[str, float] | None:
    """baseline / mode for ``key`` of two :func:`mode_summary` rows, as ``(kind, value)``:
    ``("=", r)`` when both reached the target (or ``key`` is not a to-target quantity);
    ``(">", r)`` when only the mode did (baseline's whole run over the mode's to-target value:
    the ratio is at least that); ``("<", r)`` when only baseline did; None when neither did."""
    exact = _ratio(base.get(key), row.get(key))
    if exact is not None:
        return "=", exact
    total = _RUN_TOTALS.get(key)
    if total is None or not base:       # not a to-target quantity, or no baseline run
        return None
    if base.get(key) is None and row.get(key) is not None:
        bound = _ratio(base.get(total), row[key])
        return None if bound is None else (">", bound)
    if base.get(key) is not None and row.get(key) is None:
        bound = _ratio(base[key], row.get(total))
        return None if bound is None else ("<", bound)
    return None


def bound_cell(b: tuple[str, float] | None) -> str:
    """A :func:`ratio_bound` as ``2.00x``, ``> 1.43x`` or ``< 0.80x`` (``—`` for None)."""
    if b is None:
        return "—"
    kind, value = b
    return f"{value:.2f}x" if kind == "=" else f"{kind} {value:.2f}x"


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _f(x, fmt):
    return "—" if x is None else format(x, fmt)


def _target_lines(target, target_frac: float, target_gain: float) -> list[str]:
    """The report's paragraph on the target (or on why there is none)."""
    if target is None:
        return ["**No target**: baseline's validation reward never rose above its start, so "
                "time- and cost-to-target are undefined; the curves below still compare the "
                "modes on the emulated time and cost axes.", ""]
    how = (f"start + {target_gain:.3f}" if target_gain
           else f"start + {target_frac:.0%} of baseline's best gain")
    return [f"Target validation reward: **{target:.3f}** ({how}). Ratios are baseline / "
            "mode: > 1 means faster or cheaper. The speed-up is the product of the "
            "iteration ratio (fewer iterations to the target) and the per-iteration time "
            "ratio (a cheaper critical path; emulated hours per iteration up to the "
            "target). Where only one of the two runs reached the target, the other's whole "
            "run bounds the ratio: "
            "'> 1.4x' (baseline did not reach it) or '< 0.8x' (the mode did not).", ""]


def _modes_table(rows: dict[str, dict]) -> list[str]:
    """Each mode's iterations, reward, time, cost and its ratios to ``baseline``."""
    base = rows.get(BASELINE, {})
    lines = ["| mode | iterations | reward start → final (best) | emulated h | $ | "
             "h to target | $ to target | speed-up | cost ratio | iterations to target | "
             "iteration ratio | per-iteration time ratio (to target) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, r in rows.items():
        its = r["iterations_to_target"]
        lines.append(
            f"| {m} | {r['iterations']} | {_f(r['base_reward'], '.3f')} → "
            f"{_f(r['final_reward'], '.3f')} ({_f(r['best_reward'], '.3f')}) | "
            f"{r['hours']:.2f} | {r['dollars']:.2f} | {_f(r['time_to_target_h'], '.2f')} | "
            f"{_f(r['cost_to_target'], '.2f')} | "
            f"{bound_cell(ratio_bound(base, r, 'time_to_target_h'))} | "
            f"{bound_cell(ratio_bound(base, r, 'cost_to_target'))} | "
            f"{'—' if its is None else int(its)} | "
            f"{bound_cell(ratio_bound(base, r, 'iterations_to_target'))} | "
            f"{_f(_ratio(base.get('h_per_iteration'), r['h_per_iteration']), '.2f')}"
            f"{'x' if _ratio(base.get('h_per_iteration'), r['h_per_iteration']) else ''} |")
    return lines


def _spot_table(rows: dict[str, dict]) -> list[str]:
    """What the spot devices did in each mode: utilisation, exploration, the trace's events."""
    lines = ["", "## Spot devices", "",
             "| mode | spot utilisation | exploration rollouts / iter | preemptions (abrupt) | "
             "joins | regroups | regroup s (total) | lost work s | measured regroups "
             "(max ms, compiles) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, r in rows.items():
        measured = (f"{r['fleet_regroups']} ({r['fleet_regroup_max_ms']:.1f} ms, "
                    f"{r['fleet_compiles']})" if r["fleet_regroups"] else "—")
        lines.append(f"| {m} | {r['spot_util']:.0%} | {r['explore_per_iter']:.0f} | "
                     f"{r['preemptions']} ({r['abrupt_losses']}) | {r['joins']} | "
                     f"{r['regroups']} | {r['regroup_s']:.2f} | {r['lost_work_s']:.1f} | "
                     f"{measured} |")
    return lines


def _detail_tables(rows: dict[str, dict], phases, assumptions) -> list[str]:
    """The critical path per phase, the shared update's split and the cost model's
    assumptions, where the runs have them."""
    lines = []
    if phases:
        lines += ["", "## Where the emulated time goes (critical-path seconds per phase)", ""]
        labels = sorted({lab for p in phases.values() for lab in p})
        lines += ["| mode | " + " | ".join(labels) + " |",
                  "|---|" + "---|" * len(labels)]
        for m, p in phases.items():
            lines.append(f"| {m} | " + " | ".join(
                f"{p[lab]['critical_s']:.0f}" if lab in p else "—" for lab in labels) + " |")
    shared = {m: r for m, r in rows.items() if r.get("update_shards")}
    if shared:
        lines += ["", "## The shared update (critical-path seconds of the update, whole run)",
                  "", "| mode | update (shared) | the trainer alone | mean split | "
                  "shards on spot groups |", "|---|---|---|---|---|"]
        lines += [f"| {m} | {r['update_s']:.0f} | {r['update_trainer_s']:.0f} | "
                  f"{_f(r['update_split'], '.2f')} | "
                  f"{r['update_spot_shards']} of {r['update_shards']} "
                  f"({r['update_spot_shards'] / r['update_shards']:.0%}) |"
                  for m, r in shared.items()]
    if assumptions:
        lines += ["", "## Assumptions of the cost model", "", "| name | value | unit | source |",
                  "|---|---|---|---|"]
        lines += [f"| {a.name} | {a.value} | {a.unit} | {a.source} |" for a in assumptions]
    return lines


def _plot_reward_axes(workdir: str, histories: dict[str, list[dict]], target) -> None:
    """``reward_vs_time.png`` and ``reward_vs_cost.png``: each mode's held-out curve on the
    emulated time and dollar axes, with the target."""
    for axis, key, scale, fname in (("emulated hours", "vtime_s", 1 / 3600.0,
                                     "reward_vs_time.png"),
                                    ("dollars", "dollars", 1.0, "reward_vs_cost.png")):
        series = {m: ([h.get(key, 0.0) * scale for h in evals(hist)],
                      [h["val_reward"] for h in evals(hist)])
                  for m, hist in histories.items() if evals(hist)}
        if target is not None:
            xmax = max((x[-1] for x, _ in series.values() if x), default=1.0)
            series["target"] = ([0.0, xmax], [target, target])
        plot_curves(os.path.join(workdir, fname), series, xlabel=axis,
                    ylabel="held-out reward (ODE)", title=f"validation reward vs {axis}")


def write_report(workdir: str, histories: dict[str, list[dict]], *, target_frac: float,
                 target_gain: float = 0.0, phases: dict[str, dict] | None = None,
                 assumptions: list | None = None, header: str = "", timeline: str = "") -> str:
    """Writes ``report.md``, ``compare.json`` and the two plots into ``workdir``; returns the
    report's path. ``timeline``: a spot-timeline image in ``workdir`` to show under the
    plots."""
    target = target_reward(histories, target_frac, target_gain)
    rows = {m: mode_summary(h, target) for m, h in histories.items()}
    lines = ["# Mode comparison", ""] + ([header, ""] if header else [])
    lines += _target_lines(target, target_frac, target_gain)
    lines += _modes_table(rows) + _spot_table(rows) + _detail_tables(rows, phases, assumptions)
    lines += ["", "![reward vs time](reward_vs_time.png) ![reward vs cost](reward_vs_cost.png)",
              ""]
    if timeline:
        lines += [f"![spot devices during the spotlight run]({timeline})", ""]
    _plot_reward_axes(workdir, histories, target)
    path = os.path.join(workdir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(workdir, "compare.json"), "w") as f:
        json.dump({"target": target, "modes": rows}, f, indent=1)
    return path


RATIOS = (("speed-up", "time_to_target_h"), ("cost ratio", "cost_to_target"),
          ("iteration ratio", "iterations_to_target"),
          ("per-iteration time ratio (to target)", "h_per_iteration"))


def seed_ratios(reports: dict[int, dict]) -> dict[str, dict[str, dict]]:
    """Each mode's ratios to baseline (``RATIOS``) over config seeds: per mode and ratio, the
    values by seed (None where the mode or baseline missed the target), their mean, min and
    max over the seeds that have one, and ``bounds``: seed -> ``[">" or "<", value]`` where
    only one of the two reached it (:func:`ratio_bound`). ``reports``: seed -> its
    ``compare.json``."""
    modes = list(dict.fromkeys(m for r in reports.values() for m in r["modes"]))
    out = {}
    for m in modes:
        out[m] = {}
        for name, key in RATIOS:
            by_seed, bounds = {}, {}
            for seed, r in reports.items():
                rows = r["modes"]
                b = ratio_bound(rows.get(BASELINE, {}), rows[m], key) if m in rows else None
                by_seed[seed] = b[1] if b is not None and b[0] == "=" else None
                if b is not None and b[0] != "=":
                    bounds[seed] = list(b)
            got = [v for v in by_seed.values() if v is not None]
            out[m][name] = {"by_seed": by_seed, "n": len(got), "bounds": bounds,
                            "mean": sum(got) / len(got) if got else None,
                            "min": min(got, default=None), "max": max(got, default=None)}
    return out


def ratio_cell(c: dict, seeds: int) -> str:
    """One ratio over seeds (a :func:`seed_ratios` entry) as ``mean [min, max] (n=k/seeds)``,
    then the seeds where only one run reached the target, e.g. ``; seed 1: > 1.43x``."""
    cell = (f"— (n=0/{seeds})" if c["mean"] is None else
            f"{c['mean']:.2f}x [{c['min']:.2f}, {c['max']:.2f}] (n={c['n']}/{seeds})")
    for seed, b in c.get("bounds", {}).items():
        cell += f"; seed {seed}: {bound_cell(tuple(b))}"
    return cell


def _seed_cell(c: dict, seed) -> str:
    if c["by_seed"].get(seed) is not None:
        return f"{c['by_seed'][seed]:.2f}x"
    b = c.get("bounds", {}).get(seed)
    return bound_cell(None if b is None else tuple(b))


def write_seed_report(workdir: str, seed_dirs: dict[int, str], header: str = "") -> str:
    """``report_seeds.md`` and ``compare_seeds.json`` in ``workdir`` from the comparisons of
    several config seeds (``seed -> directory holding its compare.json``): every ratio's mean
    and [min, max] over seeds, and each seed's target. Returns the report's path."""
    reports = {}
    for seed, d in seed_dirs.items():
        path = os.path.join(d, "compare.json")
        try:
            with open(path) as f:
                reports[seed] = json.load(f)
            reports[seed]["modes"] = {RENAMED_MODES.get(m, m): row        # earlier recordings
                                      for m, row in reports[seed]["modes"].items()}
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"seed {seed}: cannot read {path} ({type(e).__name__}: {e}); run "
                             "that seed's comparison first") from e
    ratios = seed_ratios(reports)
    seeds = list(reports)
    lines = ["# Mode comparison over config seeds", ""]
    if header:
        lines += [header, ""]
    targets = ", ".join(f"seed {s}: " + _f(reports[s]["target"], ".3f") for s in seeds)
    lines += [f"Seeds {', '.join(map(str, seeds))}; targets {targets}. Each cell: mean "
              "[min, max] over the seeds where both the mode and baseline reached the target "
              "(n of them), then the seeds where only one did, bounded by the other's whole run "
              "('> x': baseline did not reach it); > 1 means faster or cheaper than "
              "baseline.", "",
              "| mode | " + " | ".join(n for n, _ in RATIOS) + " |",
              "|---|" + "---|" * len(RATIOS)]

    for m, rs in ratios.items():
        lines.append(f"| {m} | " + " | ".join(ratio_cell(rs[n], len(seeds))
                                                for n, _ in RATIOS) + " |")
    lines += ["", "Per seed (speed-up / cost ratio):", "", "| mode | " + " | ".join(
        f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for m, rs in ratios.items():
        lines.append(f"| {m} | " + " | ".join(
            f"{_seed_cell(rs['speed-up'], s)} / {_seed_cell(rs['cost ratio'], s)}"
            for s in seeds) + " |")
    lines += ["", "Each seed's report: " + ", ".join(
        f"[seed {s}]({os.path.relpath(os.path.join(seed_dirs[s], 'report.md'), workdir)})"
        for s in seeds), ""]
    path = os.path.join(workdir, "report_seeds.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(workdir, "compare_seeds.json"), "w") as f:
        json.dump({"seeds": seeds, "targets": {s: reports[s]["target"] for s in seeds},
                   "ratios": ratios}, f, indent=1)
    return path
