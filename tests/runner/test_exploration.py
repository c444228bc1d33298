"""One exploration round (``runner.exploration.explore``) when the explorer leaves candidates
unscored (NaN: dropped at the deadline on the Ray hosts): subsets are chosen among the scored
candidates only (checked by brute force over every G-subset), a prompt with fewer than G scored
keeps its base candidates and is counted short, and the planner only ever sees finite rewards."""
import itertools
import types

import numpy as np

from spotlight_jax.explore.planner import Planner, PlannerConfig
from spotlight_jax.runner.exploration import explore, within_capacity

G = 3


class _Explorer:
    """Rewards from a table; NaN where the candidate was 'dropped'."""

    def __init__(self, table):
        self.table = table
        self.asked = []

    def score(self, state, prompts, seeds_per_prompt, keep_trajectories=False):
        self.asked.append(list(prompts))
        assert not keep_trajectories         # these tests never keep a batch
        return [np.asarray(self.table[p][:len(s)], np.float32)
                for p, s in zip(prompts, seeds_per_prompt)]


def _state():
    settings = types.SimpleNamespace(group_size=G, seed=0)
    planner = Planner(PlannerConfig(group_size=G, max_extra_per_prompt=4, seed=0))
    return types.SimpleNamespace(settings=settings, planner=planner,
                                 train_sampler_cfg=types.SimpleNamespace(shared_init_bits=0))


def test_dropped_candidates_are_never_chosen_and_short_prompts_keep_their_base():
    nan = np.nan
    table = {"a red bar": [0.1, nan, 0.5, 0.9, 0.2, nan, 0.0],
             "two blue squares": [nan, 0.3, nan, nan, nan, nan, nan]}
    state = _state()
    budget = 1e9                           # the planner may ask for every extra candidate
    cands, chosen, batch, info = explore(state, 1, list(table), budget, 1.0,
                                         explorer=_Explorer(table), params=None)
    assert batch is None
    r = np.asarray(table["a red bar"][:len(cands[0])], np.float64)
    scored = np.flatnonzero(np.isfinite(r))
    assert set(chosen[0]) <= set(scored)
    best = max(np.var(r[list(c)]) for c in itertools.combinations(scored, G))
    assert np.isclose(np.var(r[chosen[0]]), best)
    np.testing.assert_array_equal(chosen[1], np.arange(G))   # short: its base candidates
    assert info["explore_short"] == 1
    assert np.isclose(info["explore_var_gain"], np.var(r[chosen[0]]) - np.var(r[scored[:G]]))


def test_a_complete_round_reports_no_short_prompt():
    table = {"a red bar": [0.1, 0.4, 0.5, 0.9, 0.2, 0.7, 0.0]}
    _, chosen, _, info = explore(_state(), 1, list(table), 1e9, 1.0,
                                 explorer=_Explorer(table), params=None)
    assert "explore_short" not in info and len(chosen[0]) == G


def test_a_window_scores_whole_pools_of_the_most_extended_prompts_first():
    assert within_capacity([12, 10, 8, 12], 8, 25) == [True, False, False, True]
    # the two 12-pools do not fit in 11; the 10-pool, next in line, does
    assert within_capacity([12, 10, 8, 12], 8, 11) == [False, True, False, False]
    assert within_capacity([12, 12], 8, 11.9) == [False, False]       # no whole pool fits
    assert within_capacity([8, 8], 8, 100) == [False, False]          # no extras: nothing gains
    # ties in extras go to the earlier prompt
    assert within_capacity([10, 10, 10], 8, 20) == [True, True, False]


def test_explore_within_a_capacity_scores_only_the_picked_prompts():
    table = {"a red bar": [0.1, 0.4, 0.5, 0.9, 0.2, 0.7, 0.0],
             "two blue squares": [0.3, 0.3, 0.8, 0.1, 0.6, 0.2, 0.5]}
    ex = _Explorer(table)
    cands, chosen, _, info = explore(_state(), 1, list(table), 1e9, 1.0, explorer=ex,
                                     params=None, capacity=len(table["a red bar"]))
    assert len(ex.asked) == 1 and len(ex.asked[0]) == 1        # one whole pool fits
    assert info["explore_prompts"] == 1 and info["explore_short"] == 1
    picked = list(table).index(ex.asked[0][0])
    np.testing.assert_array_equal(chosen[1 - picked], np.arange(G))  # unscored: base seeds
    assert info["explore_candidates"] == len(cands[picked])        # what was scored


def test_a_window_too_small_for_a_batch_explores_for_seeds_only():
    """``keep`` (the pipelined batch) with a window that cannot hold G per prompt: no batch is
    asked for or kept; the picked prompts are scored for their seeds, as ``spotlight``."""
    table = {"a red bar": [0.1, 0.4, 0.5, 0.9, 0.2, 0.7, 0.0],
             "two blue squares": [0.3, 0.3, 0.8, 0.1, 0.6, 0.2, 0.5],
             "a green column": [0.5, 0.1, 0.2, 0.9, 0.4, 0.3, 0.6]}
    ex = _Explorer(table)
    _, _, batch, info = explore(_state(), 1, list(table), 1e9, 1.0, explorer=ex, params=None,
                                keep=True, capacity=G * len(table) - 1)   # one pool of 7 fits
    assert batch is None and len(ex.asked) == 1 and len(ex.asked[0]) == 1
    assert info["explore_prompts"] == 1 and info["explore_short"] == 2

