"""Study: how the exploration planner's algorithms learn on synthetic prompts with known rewards.

  python -m spotlight_jax.studies.planner [--scenarios A,B,C] [--num_seeds 10] [--iterations 30]

Prompts have Bernoulli rewards of known success probability p, of three kinds: saturated
(p in {0, 1}), informative (p ~ U(0.3, 0.7)) and rare-contrast (p within 0.03..0.15 of 0 or 1).
Each iteration a batch of prompts gets G = 8 base seeds plus a budget of 8 extra rollouts per
prompt, allocated by each algorithm (``PlannerConfig.algorithm``), by nobody (``none``) or by an
``oracle`` that knows every p; the printed number is the mean variance of the max-variance
selected G-groups, with bootstrap CIs over seeds and the paired difference to ``uniform``
(common random numbers: every algorithm sees the same draws). Scenarios:

* **A**: arms = prompts; 48 prompts (40% saturated, 30% informative, 30% rare), batch 16.
* **B**: as A, with per-prompt costs (lognormal, sigma 0.5; the budget is in seconds, so the
  number of extras differs) and every p drifting towards 1 by 3% per iteration.
* **C**: arms = task kind; 1000 prompts, so each prompt is seen about once.

``simulate`` and ``compare`` are the same runs as functions (the planner's tests use them).
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
from absl import app, flags

# The oracle allocates with the planner's own greedy rule, so the two differ only in the values.
from spotlight_jax.explore.planner import Planner, PlannerConfig, greedy_allocate
from spotlight_jax.explore.selection import max_subset_variance
from spotlight_jax.explore.stats import MeanCI, bootstrap_mean_ci

__all__ = ["SimResult", "bernoulli_gain_curve", "compare", "format_table", "simulate"]

FLAGS = flags.FLAGS


_KINDS = ("saturated", "informative", "rare")


@dataclasses.dataclass
class SimResult:
    """Per-iteration outcome of ``simulate``: mean selected-group variance over the batch, and the
    number of extra candidate rollouts and their cost spent that iteration."""

    algorithm: str
    selected_var: list[float]
    extra_rollouts: list[int]
    spent_s: list[float]


def bernoulli_gain_curve(p: float, group_size: int, max_extra: int) -> np.ndarray:
    """Exact marginal gains of f(m) for Bernoulli(p) rewards (the oracle's knowledge).

    With s successes among m candidates the best G-subset takes j ones and G - j zeros with j as
    close to G/2 as s and m - s allow; its variance is j (G - j) / G^2.
    """
    g = group_size
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, g + max_extra + 1)))])
    f = []
    for m in range(g, g + max_extra + 1):
        s = np.arange(m + 1)
        j = np.clip(g // 2, np.maximum(0, g - (m - s)), np.minimum(s, g))
        best = j * (g - j) / g**2
        if p <= 0.0 or p >= 1.0:
            pmf = (s == (0 if p <= 0 else m)).astype(float)
        else:
            log_binom = log_fact[m] - log_fact[s] - log_fact[m - s]
            pmf = np.exp(log_binom + s * math.log(p) + (m - s) * math.log1p(-p))
        f.append(float(pmf @ best))
    return np.maximum(np.diff(np.asarray(f)), 0.0)


def _make_world(n_prompts: int, mix: Sequence[float], cost_spread: float, rng):
    kinds = rng.choice(len(_KINDS), size=n_prompts, p=np.asarray(mix) / np.sum(mix))
    p = np.empty(n_prompts)
    for i, kd in enumerate(kinds):
        if _KINDS[kd] == "saturated":
            p[i] = float(rng.integers(0, 2))
        elif _KINDS[kd] == "informative":
            p[i] = rng.uniform(0.3, 0.7)
        else:
            q = rng.uniform(0.03, 0.15)
            p[i] = q if rng.random() < 0.5 else 1.0 - q
    costs = np.exp(cost_spread * rng.standard_normal(n_prompts)) if cost_spread else np.ones(
        n_prompts)
    return kinds, p, costs / costs.mean()


def simulate(algorithm: str = "ucb", *, n_prompts: int = 48, batch_size: int = 16,
             group_size: int = 8, iterations: int = 30, extra_per_prompt: float = 8.0,
             max_extra_per_prompt: int = 24, mix: Sequence[float] = (0.4, 0.3, 0.3),
             cost_spread: float = 0.0, drift: float = 0.0, cluster_by_kind: bool = False,
             seed: int = 0, **config_overrides) -> SimResult:
    """Run a planner against synthetic prompts with known Bernoulli success probabilities.

    Prompts are of three kinds (fractions ``mix``): saturated (p = 0 or 1), informative
    (p ~ U(0.3, 0.7)) and rare-contrast (p within 0.03..0.15 of 0 or 1). Each iteration samples
    ``batch_size`` prompts, gives the planner a budget of ``extra_per_prompt`` mean-cost rollouts
    per prompt, draws each prompt's candidate rewards (0/1), selects the max-variance G-group,
    records its variance and feeds the pool back with ``update``. ``drift`` > 0 moves every p > 0
    towards 1 each iteration (an improving policy, so prompts saturate over time).

    ``algorithm`` is a ``PlannerConfig.algorithm`` or one of the references: 'none' (no extras) and
    'oracle' (greedy on the exact gains of the true p -- a ceiling for any planner).

    The world, the prompt batches and the per-candidate reward draws depend only on ``seed``
    (common random numbers), so algorithms are compared on identical draws: candidate j of a prompt
    has the same reward whatever the planner decided.
    """
    world_rng = np.random.default_rng([seed, 0])
    kinds, p0, costs = _make_world(n_prompts, mix, cost_spread, world_rng)
    batch_rng = np.random.default_rng([seed, 1])
    g, m = group_size, max_extra_per_prompt
    planner = None
    if algorithm not in ("none", "oracle"):
        cfg = PlannerConfig(group_size=g, algorithm=algorithm, max_extra_per_prompt=m, seed=seed,
                            **config_overrides)
        key_fn = (lambda pid: int(kinds[pid])) if cluster_by_kind else None
        planner = Planner(cfg, key_fn=key_fn)
    out = SimResult(algorithm, [], [], [])
    for it in range(iterations):
        p = np.where(p0 > 0, 1.0 - (1.0 - p0) * (1.0 - drift) ** it, 0.0)
        batch = [int(i) for i in batch_rng.choice(n_prompts, size=batch_size, replace=False)]
        budget = extra_per_prompt * batch_size  # mean cost is 1
        cost_map = {pid: float(costs[pid]) for pid in batch}
        if planner is not None:
            n_cand = planner.plan(batch, budget, cost_map)
            spent = planner.last_plan["spent_s"]
        elif algorithm == "oracle":
            values = [bernoulli_gain_curve(p[pid], g, m) for pid in batch]
            extra, spent = greedy_allocate(values, [cost_map[b] for b in batch], budget,
                                            [0] * len(batch), m)
            n_cand = {pid: g + e for pid, e in zip(batch, extra)}
            spent = float(spent)
        else:
            n_cand, spent = {pid: g for pid in batch}, 0.0
        u = np.random.default_rng([seed, 2, it]).random((batch_size, g + m))
        sel = []
        for row, pid in enumerate(batch):
            rewards = (u[row, :n_cand[pid]] < p[pid]).astype(np.float64)
            sel.append(float(max_subset_variance(rewards, g)))
            if planner is not None:
                planner.update(pid, rewards)
        out.selected_var.append(float(np.mean(sel)))
        out.extra_rollouts.append(int(sum(n_cand.values()) - g * batch_size))
        out.spent_s.append(float(spent))
    return out


def compare(algorithms: Sequence[str] = ("none", "uniform", "ucb", "thompson", "oracle"),
            seeds: Sequence[int] = tuple(range(10)), **sim_kwargs) -> dict[str, dict]:
    """Run ``simulate`` for each algorithm and seed; summarise over seeds with bootstrap CIs.

    Per algorithm: ``per_seed`` ([seeds, iterations] selected variance), ``mean`` (MeanCI over
    seeds of the mean over iterations), ``extra`` (mean extra rollouts per iteration) and, when
    'uniform' is among the algorithms, ``delta`` (MeanCI of the paired per-seed difference to
    uniform: the draws are common random numbers, so this is far tighter than comparing the two
    ``mean`` intervals). When 'uniform' and 'oracle' both are, ``gap_closed`` gives the fraction
    (alg - uniform) / (oracle - uniform) of seed-averaged variance in iteration windows
    ``windows`` -- how fast a learning planner converges towards the oracle.
    """
    results: dict[str, dict] = {}
    for alg in algorithms:
        runs = [simulate(alg, seed=s, **sim_kwargs) for s in seeds]
        v = np.asarray([r.selected_var for r in runs])
        results[alg] = {"per_seed": v, "mean": bootstrap_mean_ci(v.mean(1)),
                        "extra": float(np.mean([r.extra_rollouts for r in runs]))}
    if "uniform" in results:
        base = results["uniform"]["per_seed"]
        for res in results.values():
            res["delta"] = bootstrap_mean_ci((res["per_seed"] - base).mean(1))
        if "oracle" in results:
            n_it = base.shape[1]
            windows = [(0, min(5, n_it)), (min(5, n_it), min(15, n_it)), (min(15, n_it), n_it)]
            windows = [w for w in windows if w[1] > w[0]]
            top = results["oracle"]["per_seed"]
            for res in results.values():
                res["windows"] = windows
                res["gap_closed"] = [
                    float((res["per_seed"][:, a:b] - base[:, a:b]).mean()
                          / max((top[:, a:b] - base[:, a:b]).mean(), 1e-12))
                    for a, b in windows]
    return results


def format_table(results: Mapping[str, Mapping], title: str = "") -> str:
    """A plain-text table of ``compare`` output."""

    def ci(x: MeanCI, signed: bool = False) -> str:
        f = "+.4f" if signed else ".4f"
        return f"{x.mean:{f}} [{x.lo:{f}}, {x.hi:{f}}]"

    any_r = next(iter(results.values()))
    wins = any_r.get("windows", [])
    gap_head = " ".join(f"{f'it {a + 1}-{b}':>8}" for a, b in wins)
    head = (f"{'algorithm':<10} {'selected var (95% CI)':<26} {'vs uniform, paired (95% CI)':<30} "
            f"{'extra/iter':>10}   gap to oracle closed: {gap_head}")
    lines = ([title] if title else []) + [head, "-" * len(head)]
    for alg, r in results.items():
        delta = ci(r["delta"], signed=True) if "delta" in r else "-"
        gaps = " ".join(f"{g:>8.0%}" for g in r.get("gap_closed", [])) if alg != "none" else ""
        lines.append(f"{alg:<10} {ci(r['mean']):<26} {delta:<30} {r['extra']:>10.1f}   "
                     f"{'':<21} {gaps}")
    return "\n".join(lines)


SCENARIOS = {
    "A": ("A. arms = prompts: 48 prompts (40% saturated p in {0,1}, 30% p~U(.3,.7), 30% "
          "rare-contrast), batch 16, G=8, budget 8 extras/prompt", {}),
    "B": ("B. as A, with per-prompt costs (lognormal, sigma 0.5; equal budget in seconds, so "
          "extras differ) and drift 0.03/iteration towards p=1",
          {"cost_spread": 0.5, "drift": 0.03}),
    "C": ("C. arms = task kind: 1000 prompts (each seen about once), otherwise as A",
          {"n_prompts": 1000, "cluster_by_kind": True}),
}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_list("scenarios", list(SCENARIOS), f"Which of {sorted(SCENARIOS)} to run.", **fv)
    flags.DEFINE_integer("num_seeds", 10, "Seeds 0..N-1 per algorithm (paired over seeds).", **fv)
    flags.DEFINE_integer("iterations", 30, "Planning iterations per run.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    unknown = [s for s in FLAGS.scenarios if s not in SCENARIOS]
    if unknown:
        raise app.UsageError(f"--scenarios: unknown {unknown}; choose from {sorted(SCENARIOS)}")
    for name in FLAGS.scenarios:
        title, kw = SCENARIOS[name]
        t0 = time.time()
        res = compare(seeds=range(FLAGS.num_seeds), iterations=FLAGS.iterations, **kw)
        print(format_table(res, f"{title}, {FLAGS.iterations} iterations, "
                                f"{FLAGS.num_seeds} seeds"))
        print(f"({time.time() - t0:.1f} s)\n")


if __name__ == "__main__":
    define_flags()
    app.run(main)
