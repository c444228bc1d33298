"""Budgeted bandit planner: how many extra candidate seeds each prompt of the next iteration gets.

Problem. Exploration runs in a time budget (device-seconds of spot time that the training phase
leaves idle). Every prompt trains on G seeds; its G base candidates are run anyway (they are free
here: the caller does not charge them to the budget). Each EXTRA candidate of prompt p costs
``cost_s[p]`` seconds and may raise the variance of p's max-variance-selected G-group. The planner
chooses the extras to maximise the expected total selected-group variance within the budget.

Model (why it is sound and cheap). For one prompt, let f(m) = E[max variance of a G-subset of m
candidate rewards]. f is non-decreasing in m (more candidates, more subsets) and in practice
concave (diminishing returns). Each ``update(prompt_id, candidate_rewards)`` turns one observed
pool of n rewards into an estimate of the marginal gains g(k) = f(G + k) - f(G + k - 1),
k = 1..max_extra, by resampling: every resample is a random permutation of the n observed rewards
(so for m <= n, the prefix of length m is an exact random m-subset -- an unbiased subsampling
estimate) continued by draws with replacement from them (plug-in extrapolation for m > n). Using
prefixes of the same resamples makes each resampled curve monotone, and the mean curve is projected
onto non-increasing sequences (isotonic regression), so greedy allocation below is consistent.

Arms. An arm is a prompt, or a cluster of prompts (``key_fn(prompt_id)``, e.g. the task kind). An
arm's statistics are the gain curves of its recent observations (at most ``window``; weights decay
by ``discount`` per planning iteration because the policy, hence the reward distribution, drifts).
Its posterior over the mean gain curve is Normal with a prior pseudo-observation of weight
``prior_weight`` at the empirical-Bayes prior (the weighted mean and spread of all arms' curves):

    mu(k) = (n0 mu0(k) + sum_i w_i g_i(k)) / W,       W = n0 + sum_i w_i
    se(k) = sqrt(v(k) / W),  v(k) = (n0 (v0(k) + (mu0 - mu)^2) + sum_i w_i (g_i - mu)^2) / W

* ``ucb``: value(k) = mu(k) + c se(k)  (an optimistic posterior quantile, c = exploration_coef).
* ``thompson``: value(k) = mu(k) X_arm, with X_arm ~ Gamma(mean 1, coefficient of variation
  c |se| / |mu|) drawn once per arm per plan: a moment-matched posterior draw that keeps the curve's
  shape and, unlike a Gaussian draw, cannot turn a (necessarily non-negative) gain negative.
* ``uniform``: the baseline -- extras dealt round-robin (random order per round) to every prompt,
  ignoring statistics and saturation, until the budget or max_extra_per_prompt stops it.
Values are clipped at 0 and made non-increasing in k. Unseen arms get the prior (so with no data at
all, every prompt is worth the same and allocation degenerates to round-robin).

Allocation (greedy, documented). First, forced extras: a prompt being re-checked after saturation
gets ``recheck_extra`` and every eligible prompt gets ``min_extra`` (round-robin in order of first-
seed value per cost, while the budget allows). Then repeatedly give one more seed to the prompt with
the highest value(next k) / cost_s[p] whose seed still fits in the remaining budget, until no
positive-value seed fits. For concave gains and equal costs this greedy is optimal; with unequal
costs it is the fractional-knapsack heuristic. Ties go to the earlier prompt in ``prompt_ids``. The
spent cost is accounted exactly (``fractions.Fraction``), so ``math.fsum`` of the costs of the
returned extras never exceeds the budget.

Saturation. A prompt whose rewards over its last ``saturation_window`` observations all lie within
``saturation_tol`` of each other (all 1s, all 0s, ...) is saturated: it showed no contrast to
select for, so it gets no extras (the gate is explicit, not left to a near-zero estimate). Its base
G seeds still run whenever it is sampled, and every ``update`` refreshes the verdict. Because a rare
contrasting seed (p = 0.95) can hide behind G equal rewards, a saturated prompt is re-checked --
given ``recheck_extra`` seeds -- once ``recheck_after`` plans have passed since it was first
observed or last got extras (0 disables this), or with probability ``recheck_prob`` in any plan.

State. ``state_dict()`` is plain JSON-able data (ints, floats, strings, lists, dicts; prompt ids and
arm keys are stored in lists of records, so int ids stay ints) including the numpy Generator's
``bit_generator.state``; ``json.loads(json.dumps(sd))`` restores a planner whose decisions are
identical to the original's. ``key_fn`` is code, not state: pass the same one on restore. The state
holds at most ``window`` gain curves per arm and one small record per prompt ever observed.

Default algorithm: ``ucb``, by measurement: ``python -m spotlight_jax.studies.planner`` compares
the algorithms against uniform allocation and an oracle on synthetic prompts (results in
docs/performance.md). UCB is never measurably worse than Thompson sampling, learns faster with
per-prompt arms, is deterministic given the state and is insensitive to its coefficient. Optimism
buys little here because every sampled prompt's base G seeds are observed for free whatever the
allocation, so the posterior mean is already well-informed and Thompson's randomisation mostly adds
allocation noise.
"""
from __future__ import annotations

import copy
import dataclasses
import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from spotlight_jax.explore.selection import prefix_max_subset_variances

__all__ = ["Planner", "PlannerConfig"]

ALGORITHMS = ("ucb", "thompson", "uniform")
_STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class PlannerConfig:
    """Planner settings (see the module docstring for the model they parametrise).

    Attributes:
      group_size: G, seeds trained per prompt; also the selected subset size.
      algorithm: 'ucb' | 'thompson' | 'uniform'.
      exploration_coef: c, the width of the optimism (ucb) or of the posterior samples (thompson).
      min_extra: extras every eligible (non-saturated) prompt gets before the greedy phase.
      max_extra_per_prompt: cap on extras per prompt (the pool is at most G + this).
      saturation_tol: rewards within this range of each other count as "all the same".
      saturation_window: how many of a prompt's most recent observations must be saturated.
      recheck_after: plans after which a saturated prompt is re-checked (0: never by age).
      recheck_prob: per-plan probability that a saturated prompt is re-checked anyway.
      recheck_extra: extras given to a prompt being re-checked.
      prior_weight: n0, weight of the empirical-Bayes prior pseudo-observation in each arm.
      discount: per-plan decay of an observation's weight (non-stationary rewards).
      window: most recent observations kept per arm.
      n_resamples: resamples per observation for its gain curve.
      seed: seed of the planner's numpy Generator.
    """

    group_size: int = 8
    algorithm: str = "ucb"
    exploration_coef: float = 1.0
    min_extra: int = 0
    max_extra_per_prompt: int = 24
    saturation_tol: float = 1e-6
    saturation_window: int = 1
    recheck_after: int = 10
    recheck_prob: float = 0.05
    recheck_extra: int = 4
    prior_weight: float = 1.0
    discount: float = 0.9
    window: int = 64
    n_resamples: int = 32
    seed: int = 0

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm={self.algorithm!r}; expected one of {ALGORITHMS}")
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size} must be >= 2")
        ints = {"min_extra": self.min_extra, "max_extra_per_prompt": self.max_extra_per_prompt,
                "recheck_after": self.recheck_after, "recheck_extra": self.recheck_extra}
        for name, v in ints.items():
            if v < 0:
                raise ValueError(f"{name}={v} must be >= 0")
        if self.min_extra > self.max_extra_per_prompt:
            raise ValueError(f"min_extra={self.min_extra} exceeds "
                             f"max_extra_per_prompt={self.max_extra_per_prompt}")
        for name in ("saturation_window", "window", "n_resamples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if not (self.exploration_coef >= 0 and math.isfinite(self.exploration_coef)):
            raise ValueError(f"exploration_coef={self.exploration_coef} must be finite and >= 0")
        if not 0.0 <= self.recheck_prob <= 1.0:
            raise ValueError(f"recheck_prob={self.recheck_prob} must be in [0, 1]")
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"discount={self.discount} must be in (0, 1]")
        if not (self.prior_weight > 0 and math.isfinite(self.prior_weight)):
            raise ValueError(f"prior_weight={self.prior_weight} must be finite and > 0")
        if not self.saturation_tol >= 0:
            raise ValueError(f"saturation_tol={self.saturation_tol} must be >= 0")


def _check_id(x, what: str):
    # bool is an int subclass but would come back from JSON as a bool, not an int: still exact;
    # floats and tuples would not round-trip as dict keys / records reliably, so refuse them.
    if not isinstance(x, (str, int)):
        raise TypeError(f"{what} must be a str or int (JSON-able), got {x!r} of type {type(x)}")
    return x


def _nonincreasing(y: np.ndarray) -> np.ndarray:
    """L2 projection of ``y`` onto non-increasing sequences (pool-adjacent-violators)."""
    sums: list[float] = []
    counts: list[int] = []
    for v in y.tolist():
        sums.append(v)
        counts.append(1)
        while len(sums) > 1 and sums[-2] / counts[-2] < sums[-1] / counts[-1]:
            s, c = sums.pop(), counts.pop()
            sums[-1] += s
            counts[-1] += c
    return np.repeat(np.array(sums) / np.array(counts), counts) if sums else np.zeros(0)


def gain_curve(rewards, group_size: int, max_extra: int, n_resamples: int,
               rng: np.random.Generator) -> np.ndarray:
    """Estimated marginal gains g(k) = f(G+k) - f(G+k-1), k = 1..max_extra, from one reward pool.

    f(m) is the expected max-variance of a G-subset of m candidates; see the module docstring for
    the permutation-then-bootstrap resampling. Returns a non-negative, non-increasing float64 array.
    """
    r = np.asarray(rewards, dtype=np.float64)
    n, g, m_max = r.shape[0], group_size, group_size + max_extra
    if max_extra == 0:
        return np.zeros(0)
    perm = np.argsort(rng.random((n_resamples, n)), axis=1)[:, :min(n, m_max)]
    if m_max > n:
        perm = np.concatenate([perm, rng.integers(0, n, size=(n_resamples, m_max - n))], axis=1)
    f = prefix_max_subset_variances(r[perm], g, np.arange(g, m_max + 1)).mean(axis=1)
    return np.maximum(_nonincreasing(np.diff(f)), 0.0)


def greedy_allocate(values: Sequence[np.ndarray], costs: Sequence[float], budget: float,
                     forced: Sequence[int], max_extra: int) -> tuple[list[int], Fraction]:
    """Forced extras round-robin, then greedy by value/cost; exact budget accounting.

    ``values[i][k]`` is prompt i's value of its (k+1)-th extra seed. Returns (extras, spent).
    """
    n = len(costs)
    extra = [0] * n
    fcost = [Fraction(c) for c in costs]
    remaining = Fraction(budget)
    first = [float(v[0]) / c if len(v) else 0.0 for v, c in zip(values, costs)]
    rank = sorted(range(n), key=lambda i: (-first[i], i))
    want = [min(f, max_extra) for f in forced]
    progress = True
    while progress:
        progress = False
        for i in rank:
            if extra[i] < want[i] and fcost[i] <= remaining:
                extra[i] += 1
                remaining -= fcost[i]
                progress = True
    heap = [(-float(values[i][extra[i]]) / costs[i], i) for i in range(n)
            if extra[i] < min(max_extra, len(values[i])) and values[i][extra[i]] > 0]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        if fcost[i] > remaining:
            continue  # this prompt's seeds no longer fit; cheaper prompts may
        extra[i] += 1
        remaining -= fcost[i]
        k = extra[i]
        if k < min(max_extra, len(values[i])) and values[i][k] > 0:
            heapq.heappush(heap, (-float(values[i][k]) / costs[i], i))
    return extra, Fraction(budget) - remaining


class Planner:
    """The exploration planner: ``plan`` before exploring, ``update`` with each explored pool.

    Args:
      config: a ``PlannerConfig``.
      key_fn: prompt id -> arm key (str or int). Default: every prompt is its own arm. Use e.g. the
        task kind when prompts recur too rarely to learn about each one.
    """

    def __init__(self, config: PlannerConfig | None = None,
                 key_fn: Callable[[Hashable], Any] | None = None):
        self.config = config or PlannerConfig()
        self.key_fn = key_fn if key_fn is not None else (lambda pid: pid)
        self._rng = np.random.default_rng(self.config.seed)
        self._iteration = 0  # number of plan() calls so far
        # arm key -> list of {"it": plan iteration of the observation, "gains": [float, ...]}
        self._arms: dict[Any, list[dict]] = {}
        # prompt id -> {"arm", "ranges": [[min, max], ...], "n_obs", "last_explored"}
        self._prompts: dict[Any, dict] = {}
        self.last_plan: dict = {}  # diagnostics of the latest plan (not part of the state)

    # ----------------------------------------------------------------------------------- learning
    def update(self, prompt_id, candidate_rewards) -> None:
        """Record the rewards of all candidates explored for ``prompt_id`` (base + extras)."""
        _check_id(prompt_id, "prompt_id")
        r = np.asarray(candidate_rewards, dtype=np.float64)
        if r.ndim != 1 or r.size == 0:
            raise ValueError(
                f"candidate_rewards must be a non-empty 1-D array, got shape {r.shape}")
        if not np.all(np.isfinite(r)):
            raise ValueError(f"candidate_rewards of prompt {prompt_id!r} must be finite: {r}")
        cfg = self.config
        arm = _check_id(self.key_fn(prompt_id), "key_fn(prompt_id)")
        gains = gain_curve(r, cfg.group_size, cfg.max_extra_per_prompt, cfg.n_resamples, self._rng)
        obs = self._arms.setdefault(arm, [])
        obs.append({"it": self._iteration, "gains": [float(x) for x in gains],
                    # the variance of the G base candidates (listed first), for expected_gain's
                    # callers that weigh the selection's gain against it
                    "base_var": float(np.var(r[:cfg.group_size]))})
        del obs[:-cfg.window]
        rec = self._prompts.get(prompt_id)
        if rec is None:
            rec = self._prompts[prompt_id] = {"arm": arm, "ranges": [], "n_obs": 0,
                                              "last_explored": self._iteration}
        rec["arm"] = arm
        rec["ranges"].append([float(r.min()), float(r.max())])
        del rec["ranges"][:-cfg.saturation_window]
        rec["n_obs"] += 1

    def is_saturated(self, prompt_id) -> bool:
        """True if the prompt's last ``saturation_window`` observations all had equal rewards."""
        rec = self._prompts.get(prompt_id)
        cfg = self.config
        if rec is None or len(rec["ranges"]) < cfg.saturation_window:
            return False
        lo = min(a for a, _ in rec["ranges"])
        hi = max(b for _, b in rec["ranges"])
        return hi - lo <= cfg.saturation_tol

    def _prior(self) -> tuple[np.ndarray, np.ndarray]:
        """Empirical-Bayes prior: mean and variance of the gain curve over all observations."""
        m = self.config.max_extra_per_prompt
        gains, weights = [], []
        for obs in self._arms.values():
            for o in obs:
                gains.append(o["gains"])
                weights.append(self.config.discount ** (self._iteration - o["it"]))
        if not gains:
            mu0 = 1.0 / np.arange(1, m + 1)  # no data: equal, diminishing -> round-robin
            return mu0, mu0 * mu0
        g, w = np.asarray(gains), np.asarray(weights)[:, None]
        mu0 = (w * g).sum(0) / w.sum()
        v0 = (w * (g - mu0) ** 2).sum(0) / w.sum()
        return mu0, v0

    def arm_posterior(self, arm, prior=None) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard error of an arm's gain curve (see module docstring)."""
        cfg = self.config
        mu0, v0 = self._prior() if prior is None else prior
        obs = self._arms.get(arm, [])
        n0 = cfg.prior_weight
        if not obs:
            return mu0.copy(), np.sqrt(v0 / n0)
        g = np.asarray([o["gains"] for o in obs])
        w = np.asarray([cfg.discount ** (self._iteration - o["it"]) for o in obs])[:, None]
        total = n0 + w.sum()
        mu = (n0 * mu0 + (w * g).sum(0)) / total
        var = (n0 * (v0 + (mu0 - mu) ** 2) + (w * (g - mu) ** 2).sum(0)) / total
        return mu, np.sqrt(var / total)

    # ----------------------------------------------------------------------------------- planning
    def plan(self, prompt_ids: Sequence, budget_s: float,
             cost_s: float | Mapping[Any, float]) -> dict:
        """Number of candidates (G + extras) for each prompt of the next iteration.

        Args:
          prompt_ids: the next iteration's prompts (unique str/int ids).
          budget_s: device-seconds available for extra candidates (>= 0).
          cost_s: seconds per extra candidate rollout, a number or a mapping prompt id -> number.

        Returns:
          ``{prompt_id: n_candidates}`` with ``G <= n_candidates <= G + max_extra_per_prompt`` and
          the extras' total cost within ``budget_s``. ``self.last_plan`` holds diagnostics.
        """
        cfg = self.config
        ids = list(prompt_ids)
        for pid in ids:
            _check_id(pid, "prompt id")
        if len(set(ids)) != len(ids):
            dup = sorted({str(p) for p in ids if ids.count(p) > 1})
            raise ValueError(f"duplicate prompt ids in plan(): {dup}")
        budget = float(budget_s)
        if not (budget >= 0 and math.isfinite(budget)):
            raise ValueError(f"budget_s={budget_s} must be finite and >= 0")
        costs = [float(cost_s[p] if isinstance(cost_s, Mapping) else cost_s) for p in ids]
        for pid, c in zip(ids, costs):
            if not (c > 0 and math.isfinite(c)):
                raise ValueError(f"cost_s for prompt {pid!r} is {c}; must be finite and > 0")
        self._iteration += 1
        g, m = cfg.group_size, cfg.max_extra_per_prompt

        if cfg.algorithm == "uniform":
            extra, spent = self._uniform(costs, budget)
            saturated, rechecked = [], []
        else:
            prior = self._prior()
            curves: dict[Any, np.ndarray] = {}
            values, forced, saturated, rechecked = [], [], [], []
            for pid in ids:
                arm = (self._prompts[pid]["arm"] if pid in self._prompts
                       else _check_id(self.key_fn(pid), "key_fn(prompt_id)"))
                if self.is_saturated(pid):
                    rec = self._prompts[pid]
                    due = cfg.recheck_after > 0 and (
                        self._iteration - rec["last_explored"] >= cfg.recheck_after)
                    lucky = cfg.recheck_prob > 0 and self._rng.random() < cfg.recheck_prob
                    if not (due or lucky):
                        saturated.append(pid)
                        values.append(np.zeros(m))
                        forced.append(0)
                        continue
                    rechecked.append(pid)
                    forced.append(max(cfg.min_extra, cfg.recheck_extra))
                else:
                    forced.append(cfg.min_extra)
                if arm not in curves:
                    curves[arm] = self._arm_value(arm, prior)
                values.append(curves[arm])
            extra, spent = greedy_allocate(values, costs, budget, forced, m)

        for pid, e in zip(ids, extra):
            if e > 0 and pid in self._prompts:
                self._prompts[pid]["last_explored"] = self._iteration
        self.last_plan = {"iteration": self._iteration, "spent_s": float(spent),
                          "budget_s": budget, "extra": dict(zip(ids, extra)),
                          "saturated": saturated, "rechecked": rechecked}
        return {pid: g + e for pid, e in zip(ids, extra)}

    def expected_gain(self, prompt_ids: Sequence, budget_s: float,
                      cost_s: float | Mapping[Any, float]) -> float:
        """The posterior-mean total gain in selected-group variance of the best allocation of
        ``budget_s`` device-seconds of extras over ``prompt_ids`` (the greedy of :meth:`plan` on
        the arms' posterior means, without optimism). Saturated prompts count nothing, as in a
        plan without re-checks. Changes no state: a caller may weigh budgets before planning.
        0.0 before any observation (nothing is known about the gains then)."""
        return self.gain_of_budget(prompt_ids, cost_s)(budget_s)

    def gain_of_budget(self, prompt_ids: Sequence, cost_s: float | Mapping[Any, float]):
        """``gain(budget_s)``: :meth:`expected_gain` for any budget, the posteriors computed
        once (a caller weighing several budgets of the same prompts)."""
        cfg = self.config
        if not self._arms:
            return lambda budget_s: 0.0
        ids = list(prompt_ids)
        costs = [float(cost_s[p] if isinstance(cost_s, Mapping) else cost_s) for p in ids]
        prior = self._prior()
        curves: dict[Any, np.ndarray] = {}
        values = []
        for pid in ids:
            if self.is_saturated(pid):
                values.append(np.zeros(cfg.max_extra_per_prompt))
                continue
            arm = (self._prompts[pid]["arm"] if pid in self._prompts else self.key_fn(pid))
            if arm not in curves:
                mu, _ = self.arm_posterior(arm, prior)
                curves[arm] = np.maximum(_nonincreasing(np.maximum(mu, 0.0)), 0.0)
            values.append(curves[arm])

        def gain(budget_s: float) -> float:
            if budget_s <= 0:
                return 0.0
            extra, _ = greedy_allocate(values, costs, float(budget_s), [0] * len(ids),
                                        cfg.max_extra_per_prompt)
            return float(math.fsum(float(np.sum(v[:e])) for v, e in zip(values, extra)))

        return gain

    def base_variance(self, prompt_ids: Sequence) -> float | None:
        """The expected reward variance of a prompt's G base candidates, averaged over
        ``prompt_ids``: each arm's discounted mean over its observations, an arm never observed
        taking the mean over all arms. None before any observation."""
        def mean(obs):
            pairs = [(self.config.discount ** (self._iteration - o["it"]), o["base_var"])
                     for o in obs if "base_var" in o]
            w = sum(p[0] for p in pairs)
            return sum(a * b for a, b in pairs) / w if w > 0 else None

        overall = mean([o for obs in self._arms.values() for o in obs])
        if overall is None:
            return None
        per = []
        for pid in prompt_ids:
            arm = (self._prompts[pid]["arm"] if pid in self._prompts else self.key_fn(pid))
            v = mean(self._arms.get(arm, []))
            per.append(overall if v is None else v)
        return float(np.mean(per)) if per else overall

    def _arm_value(self, arm, prior) -> np.ndarray:
        mu, se = self.arm_posterior(arm, prior)
        c = self.config.exploration_coef
        if self.config.algorithm == "ucb":
            v = mu + c * se
        else:
            # Thompson: one draw per arm of a mean-1 Gamma scale factor whose coefficient of
            # variation is c * |se| / |mu|: it keeps the curve's shape and, unlike a Gaussian draw,
            # never makes a non-negative gain negative (which would starve an arm for a round).
            norm = float(np.linalg.norm(mu))
            cv = c * float(np.linalg.norm(se)) / norm if norm > 0 else 0.0
            shape = 1.0 / (cv * cv) if cv > 0 else 0.0
            v = mu * (self._rng.gamma(shape, 1.0 / shape) if shape > 0 else 1.0)
        return np.maximum(_nonincreasing(np.maximum(v, 0.0)), 0.0)

    def _uniform(self, costs: list[float], budget: float) -> tuple[list[int], Fraction]:
        """Round-robin extras in a fresh random order each round, until nothing more fits."""
        n, m = len(costs), self.config.max_extra_per_prompt
        extra = [0] * n
        fcost = [Fraction(c) for c in costs]
        remaining = Fraction(budget)
        progress = n > 0
        while progress:
            progress = False
            for i in self._rng.permutation(n).tolist():
                if extra[i] < m and fcost[i] <= remaining:
                    extra[i] += 1
                    remaining -= fcost[i]
                    progress = True
        return extra, Fraction(budget) - remaining

    # -------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Plain-data state (JSON round-trips exactly; see the module docstring)."""
        return {
            "version": _STATE_VERSION,
            "config": dataclasses.asdict(self.config),
            "iteration": self._iteration,
            "rng": copy.deepcopy(self._rng.bit_generator.state),
            "arms": [{"key": k, "obs": copy.deepcopy(v)} for k, v in self._arms.items()],
            "prompts": [dict(copy.deepcopy(v), id=k) for k, v in self._prompts.items()],
        }

    def load_state_dict(self, state: Mapping, strict: bool = True) -> None:
        """Restore from ``state_dict()`` output (possibly after a JSON round trip).

        With ``strict`` the saved config must equal this planner's; otherwise only the fields that
        shape the statistics (group_size, max_extra_per_prompt) must match, so e.g. the algorithm or
        exploration_coef may change on resume.
        """
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"planner state version {state.get('version')!r}; "
                             f"expected {_STATE_VERSION}")
        mine = dataclasses.asdict(self.config)
        saved = dict(state["config"])
        keys = mine if strict else ("group_size", "max_extra_per_prompt")
        diff = {k: (saved.get(k), mine[k]) for k in keys if saved.get(k) != mine[k]}
        if diff:
            raise ValueError(f"planner state was saved with a different config "
                             f"(field: (saved, current)): {diff}")
        rng = np.random.default_rng()
        rng.bit_generator.state = copy.deepcopy(state["rng"])
        self._rng = rng
        self._iteration = int(state["iteration"])
        self._arms = {a["key"]: copy.deepcopy(a["obs"]) for a in state["arms"]}
        self._prompts = {}
        for p in state["prompts"]:
            rec = copy.deepcopy(dict(p))
            self._prompts[rec.pop("id")] = rec
