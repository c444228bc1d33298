"""Seed exploration: max-variance selection of candidate seeds and the budgeted bandit planner.

* ``max_variance_subset`` (contract): which G of a prompt's explored seeds to train on.
* ``Planner`` / ``PlannerConfig``: how many candidate seeds each prompt gets within an exploration
  time budget (UCB / Thompson sampling / uniform), with JSON-exact state.
* ``Explorer`` (protocol) / ``LocalExplorer``: rewards of candidate seeds under a (stale) policy
  (sampled by ``diffusion.engine.RolloutEngine``).
* ``stats``: Kendall tau-b, Spearman rho and bootstrap CIs for the exploration studies.
"""
from spotlight_jax.explore.selection import (
    max_subset_variance,
    max_variance_subset,
    subset_variance,
)
from spotlight_jax.explore.stats import bootstrap_mean_ci, kendall_tau_b, spearman_rho

_LAZY = {"Planner", "PlannerConfig"}
_LAZY_EXPLORER = {"Explorer", "LocalExplorer"}

__all__ = [
    "Explorer",
    "LocalExplorer",
    "Planner",
    "PlannerConfig",
    "bootstrap_mean_ci",
    "kendall_tau_b",
    "max_subset_variance",
    "max_variance_subset",
    "spearman_rho",
    "subset_variance",
]


def __getattr__(name):
    # The planner and the explorer are imported on first use (the explorer pulls in the sampler
    # and JAX); the planner's synthetic study is spotlight_jax.studies.planner.
    if name in _LAZY:
        from spotlight_jax.explore import planner

        return getattr(planner, name)
    if name in _LAZY_EXPLORER:
        from spotlight_jax.explore import explorer

        return getattr(explorer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
