"""The headline comparison measured so that no single crossing decides it.

Per trace, for each spot mode against ``baseline`` over the config seeds of a grid
(``studies.compare_grid``):

* **time and cost to target** at several gains over baseline's start (default +0.06 to
  +0.09), each run's crossing *interpolated* between the two evaluations around it (linear in
  the emulated seconds or dollars), so evaluations every few iterations do not quantise the
  ratio; the cost at the top gain also by the *evaluation* that first reaches it (no
  interpolation: what a per-seed claim such as "cheaper on every seed" rests on);
* the **curve-level speed-up**: at evenly spaced reward levels over the range both runs reach,
  baseline's time to first reach the level over the mode's, their geometric mean (one number
  that uses the whole curve rather than one crossing);
* **intervals over seeds**: the bootstrap's (seeds resampled with their baseline paired, the
  mean's 2.5 and 97.5 percentiles) and Student's t 95% interval beside it (with five seeds the
  percentile bootstrap is too narrow);
* **against a reference**: ``baseline`` (on-demand devices only), or any other mode, e.g.
  ``spot_rollout`` (the same on-demand and spot devices used synchronously: what the spot
  mode's own ideas add beyond more devices);
* **what bounds it**: at the top gain, each decided seed's time ratio is the product of its
  iteration ratio (baseline's iterations to the target over the mode's, interpolated like the
  seconds) and its per-iteration ratio (baseline's emulated seconds per iteration *up to the
  target* over the mode's: the one definition of a per-iteration ratio the reports use); both
  are reported, with what either would need to be for a goal (3x) at the
  other's measured value;
* a seed whose baseline never reaches a target is **censored**: its ratio is at least
  baseline's whole run over the mode's time (a bound, shown apart, never averaged as a value);
  the mean over decided seeds and the mean with censored seeds at their bound (itself a lower
  bound of the true mean) are both given.

Pure functions over histories (``compare_grid.grid_runs`` + ``_load``); ``write_headline``
writes ``headline.md``, ``headline.json`` and ``headline.png`` (every seed's curve) into the
grid.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np

from spotlight_jax.registry import BASELINE

GAINS = (0.06, 0.07, 0.08, 0.09)
LEVELS = 20
RESAMPLES = 10_000


GOAL = 3.0
COLUMNS = {"vtime_s": 1, "dollars": 2, "iteration": 3}


def _evals(history: list[dict]) -> list[tuple[float, float, float, float]]:
    """``(val_reward, vtime_s, dollars, iteration)`` of every evaluation, in order."""
    return [(float(h["val_reward"]), float(h.get("vtime_s", 0.0)), float(h.get("dollars", 0.0)),
             float(h.get("iteration", 0)))
            for h in history if "val_reward" in h]


def crossing(history: list[dict], target: float, key: str = "vtime_s",
             interpolate: bool = True) -> float | None:
    """The emulated seconds (``key='vtime_s'``), dollars (``'dollars'``) or iterations
    (``'iteration'``) at which the run's validation reward first reaches ``target``, linear
    between the evaluation before and the one at or above it (``interpolate=False``: at that
    evaluation); None when it never does (0 when it starts there)."""
    col = COLUMNS[key]
    ev = _evals(history)
    for i, row in enumerate(ev):
        if row[0] >= target:
            if i == 0:
                return 0.0
            if not interpolate:
                return row[col]
            prev = ev[i - 1]
            frac = (target - prev[0]) / (row[0] - prev[0])
            return prev[col] + frac * (row[col] - prev[col])
    return None


def run_total(history: list[dict], key: str = "vtime_s") -> float:
    """The whole run's seconds or dollars (what a censored crossing is bounded by)."""
    return float(history[-1].get(key, 0.0)) if history else 0.0


def curve_speedup(base: list[dict], mode: list[dict], levels: int = LEVELS) -> float | None:
    """Geometric mean over ``levels`` reward levels, evenly spaced above both starts up to the
    lower of the two best rewards, of baseline's time to first reach the level over the
    mode's; None when the two curves share no range above their starts."""
    eb, em = _evals(base), _evals(mode)
    if len(eb) < 2 or len(em) < 2:
        return None
    lo = max(eb[0][0], em[0][0])
    hi = min(max(r for r, *_ in eb), max(r for r, *_ in em))
    if hi <= lo:
        return None
    logs = []
    for j in range(1, levels + 1):
        level = lo + (hi - lo) * j / levels
        tb, tm = crossing(base, level), crossing(mode, level)
        if tb and tm:
            logs.append(math.log(tb / tm))
    return math.exp(sum(logs) / len(logs)) if logs else None


def bootstrap_mean(values, resamples: int = RESAMPLES, seed: int = 0):
    """``(mean, low, high)``: the mean and the 2.5/97.5 percentiles of the mean over
    ``resamples`` resamplings of ``values`` with replacement (one value: no interval)."""
    x = np.asarray(values, float)
    if x.size == 0:
        return None
    if x.size == 1:
        return float(x[0]), float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
    return float(x.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def seed_ratio(base: list[dict], mode: list[dict], gain: float, key: str,
               interpolate: bool = True) -> dict:
    """One seed's reference (``base``) / mode ratio at ``base start + gain``: ``{"value": r}``
    when both reach it, ``{"at_least": r}`` when only the mode does (censored: the reference's
    whole run), ``{"at_most": r}`` when only the reference does, ``{}`` when neither."""
    target = _evals(base)[0][0] + gain
    tb, tm = (crossing(base, target, key, interpolate),
              crossing(mode, target, key, interpolate))
    if tb is not None and tm:
        return {"value": tb / tm}
    if tb is None and tm:
        return {"at_least": run_total(base, key) / tm}
    if tb is not None and tm is None and run_total(mode, key):
        return {"at_most": tb / run_total(mode, key)}
    return {}


def t_interval(values) -> tuple[float, float] | None:
    """Student's t 95% interval of the mean of ``values`` (None for fewer than two)."""
    from scipy import stats  # noqa: PLC0415 - a JAX dependency, needed only here

    x = np.asarray(values, float)
    if x.size < 2:
        return None
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def summarise(cells: list[dict]) -> dict:
    """Seeds' :func:`seed_ratio` cells -> the mean, bootstrap and t intervals of the decided
    ones, the mean with censored seeds at their lower bound, and the bounds themselves."""
    decided = [c["value"] for c in cells if "value" in c]
    with_bounds = decided + [c["at_least"] for c in cells if "at_least" in c]
    out = {"seeds": len(cells), "decided": len(decided),
           "at_least": [c["at_least"] for c in cells if "at_least" in c],
           "at_most": [c["at_most"] for c in cells if "at_most" in c]}
    if decided:
        out["mean"], out["low"], out["high"] = bootstrap_mean(decided)
        t = t_interval(decided)
        if t is not None:
            out["t_low"], out["t_high"] = t
        out["least"], out["most"] = min(decided), max(decided)    # a per-seed target's test
    if len(with_bounds) > len(decided):
        out["mean_censored_at_bound"] = bootstrap_mean(with_bounds)[0]
    return out


def per_iteration_ratio(base: list[dict], mode: list[dict], gain: float) -> dict:
    """One seed's baseline / mode emulated seconds per iteration up to ``base start + gain``
    (``{"value": r}`` when both reach it, else ``{}``): the time ratio over the iteration
    ratio, so the two multiply to the time ratio exactly."""
    time, its = (seed_ratio(base, mode, gain, k) for k in ("vtime_s", "iteration"))
    if "value" in time and "value" in its and its["value"] > 0:
        return {"value": time["value"] / its["value"]}
    return {}


def bound(rows: dict, gain: float, goal: float = GOAL) -> str | None:
    """The sentence saying what bounds the time ratio at ``gain``: the mean iteration and
    per-iteration ratios of the decided seeds, and what either would need to be for ``goal``
    at the other's value (None without a decided seed)."""
    its, per = rows[f"iterations to +{gain:g}"], rows[f"s per iteration to +{gain:g}"]
    if "mean" not in its or "mean" not in per:
        return None
    return (f"time to +{gain:g} = iterations x per iteration: {its['mean']:.2f}x x "
            f"{per['mean']:.2f}x (means of the decided seeds); {goal:g}x needs "
            f"{goal / per['mean']:.2f}x the iteration ratio at this per-iteration ratio, or "
            f"{goal / its['mean']:.2f}x per iteration at this iteration ratio")


def trace_rows(by_seed: dict[int, dict[str, list[dict]]], mode: str, gains=GAINS,
               reference: str = BASELINE) -> dict[str, dict]:
    """Every row of one trace's table for ``mode`` against ``reference``: the curve-level
    speed-up, time and cost at each gain, the cost at the top gain by evaluation, and what the
    time at the top gain is made of (iterations x seconds per iteration)."""
    pairs = [(s, runs[reference], runs[mode]) for s, runs in sorted(by_seed.items())
             if reference in runs and mode in runs]
    curves = [curve_speedup(b, m) for _, b, m in pairs]
    rows = {"curve-level speed-up": summarise([{"value": c} for c in curves if c is not None])}
    rows["curve-level speed-up"]["seeds"] = len(pairs)
    for gain in gains:
        rows[f"time to +{gain:g}"] = summarise(
            [seed_ratio(b, m, gain, "vtime_s") for _, b, m in pairs])
    for gain in gains:
        rows[f"cost to +{gain:g}"] = summarise(
            [seed_ratio(b, m, gain, "dollars") for _, b, m in pairs])
    top = max(gains)
    rows[f"cost to +{top:g}, by evaluation"] = summarise(
        [seed_ratio(b, m, top, "dollars", interpolate=False) for _, b, m in pairs])
    rows[f"iterations to +{top:g}"] = summarise(
        [seed_ratio(b, m, top, "iteration") for _, b, m in pairs])
    rows[f"s per iteration to +{top:g}"] = summarise(
        [per_iteration_ratio(b, m, top) for _, b, m in pairs])
    return rows


def cell(row: dict) -> str:
    """A table cell: ``2.71x [2.40, 3.02] t [2.01, 3.47] (4/5; seeds 2.21-3.30x)`` (bootstrap,
    then t interval), then censored bounds (``> 3.10x``)."""
    parts = []
    if "mean" in row:
        t = (f" t [{row['t_low']:.2f}, {row['t_high']:.2f}]" if "t_low" in row else "")
        parts.append(f"{row['mean']:.2f}x [{row['low']:.2f}, {row['high']:.2f}]{t} "
                     f"({row['decided']}/{row['seeds']}; seeds {row['least']:.2f}-"
                     f"{row['most']:.2f}x)")
    else:
        parts.append(f"— (0/{row['seeds']})")
    if row.get("at_least"):
        parts.append("censored: " + ", ".join(f"> {b:.2f}x" for b in row["at_least"])
                     + f"; mean with them at their bound {row['mean_censored_at_bound']:.2f}x")
    if row.get("at_most"):
        parts.append("mode short of it: " + ", ".join(f"< {b:.2f}x" for b in row["at_most"]))
    return "; ".join(parts)


def _plot(path: str, runs: dict, result: dict, gain: float) -> None:
    """``headline.png``: per trace, every seed's held-out gain over emulated hours, baseline
    and each reported mode."""
    from spotlight_jax.reporting import plots  # noqa: PLC0415

    panels = {}
    for trace, modes in result.items():
        by_seed = runs[trace]
        panels[trace] = {m: [([e[1] / 3600.0 for e in _evals(r[m])],
                              [e[0] for e in _evals(r[m])])
                             for r in by_seed.values() if m in r and BASELINE in r]
                         for m in [BASELINE, *modes]}
    plots.gain_panels(path, panels, target_gain=gain)


REFERENCES = (BASELINE, "spot_rollout")
"""What each spot mode is set against, where the grid has it: ``baseline`` (the on-demand
devices only, what the paper compares with) and ``spot_rollout`` (the same on-demand and spot
devices used synchronously: rollouts on both, no exploration, no pipelining)."""


def write_headline(grid: str, runs: dict[str, dict[int, dict[str, list[dict]]]],
                   modes: list[str], gains=GAINS, code_line: str = "",
                   references=REFERENCES) -> str:
    """``headline.md`` and ``headline.json`` in ``grid``: per trace and reference, one table, a
    row per measure, a column per mode. ``runs``: trace -> seed -> mode -> history."""
    result, lines = {}, [
        "# The headline, measured on every crossing", "",
        "Each cell: reference / mode, the mean over the seeds where both reached the target "
        "[bootstrap 95% interval over seeds] t [Student's t 95% interval] (decided / run; the "
        "least and most of those seeds); crossings interpolated between evaluations (the row "
        "'by evaluation': at the first evaluation that reaches the target); a seed whose "
        "reference never reached the target is censored and shown as a bound (its mean at the "
        "bound is a lower bound). Curve-level: the geometric mean over "
        f"{LEVELS} reward levels both runs reach of the time ratio to first reach each. Per "
        "iteration: emulated seconds per iteration up to the target, so time = iterations x "
        "per iteration. Built by `studies.compare_grid report` "
        "(`spotlight_jax.reporting.headline`).", ""]
    if code_line:
        lines += [code_line, ""]
    for trace, by_seed in runs.items():
        for ref in references:
            present = [m for m in modes if m not in (BASELINE, ref)
                       and any(m in r and ref in r for r in by_seed.values())]
            if not present:
                continue
            tables = {m: trace_rows(by_seed, m, gains, reference=ref) for m in present}
            result.setdefault(trace, {})[ref] = tables
            lines += [f"## {trace}: against `{ref}`", "",
                      "| measure | " + " | ".join(present) + " |",
                      "|---|" + "---|" * len(present)]
            for name in tables[present[0]]:
                lines.append(f"| {name} | " + " | ".join(cell(tables[m][name])
                                                         for m in present) + " |")
            lines.append("")
            for m in present:
                said = bound(tables[m], max(gains))
                if said:
                    lines += [f"What bounds `{m}` against `{ref}`: {said}.", ""]
    if result:
        shown = {t: [m for m in modes if m != BASELINE
                     and any(m in r for r in runs[t].values())] for t in result}
        _plot(os.path.join(grid, "headline.png"), runs, shown, max(gains))
        lines += ["![held-out gain vs emulated hours, every seed](headline.png)", ""]
    with open(os.path.join(grid, "headline.json"), "w") as f:
        json.dump(result, f, indent=1)
    path = os.path.join(grid, "headline.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path
