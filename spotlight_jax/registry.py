"""The names a run is made of, declared once: the modes (``config.mode``) and the objectives
(``rl.objective``).

A leaf module (it imports nothing of the project), so config validation, the entry points, the
runner and the benchmarks all read the same list. The runner binds one class to each mode name
(``runner/modes.py``) and the trainer layer one trainer to each objective (``rl/``); a test checks
that every name here has exactly one of each.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModeSpec:
    """A mode: who rolls out, explores and trains, where and when."""

    name: str
    uses_spot: bool     # spot devices take part (the run needs the deployment's devices)
    explores: bool      # candidate seeds beyond the G trained per prompt
    summary: str


MODES: tuple[ModeSpec, ...] = (
    ModeSpec("baseline", False, False,
             "random seeds, on-demand devices only: what every other mode is measured against"),
    ModeSpec("explore_sync", False, True,
             "explores candidate seeds with the current weights on the critical path"),
    ModeSpec("spot_rollout", True, False,
             "spot devices help with rollouts (pull scheduler), idle during the update"),
    ModeSpec("spotlight", True, True,
             "spot devices also explore next iteration's seeds with stale weights during the "
             "update"),
    ModeSpec("spotlight_pipelined", True, True,
             "the candidates the spot devices sample during update k are iteration k+1's batch"),
)
# runs every mode above into <workdir>/<mode> with the same seeds, prompts and trace
COMPARE = ModeSpec("compare", True, True, "every mode side by side, with a report")
BASELINE = MODES[0].name
# old name -> new name: the old name fails with a one-line "renamed to ..."
RENAMED_MODES = {"flow_grpo": BASELINE}

OBJECTIVES: tuple[str, ...] = ("nft", "flow_grpo")     # rl.objective; the first is the default


def mode_names() -> tuple[str, ...]:
    """The runnable modes, in the order reports list them."""
    return tuple(m.name for m in MODES)


def mode_spec(name: str) -> ModeSpec:
    """The spec of mode ``name`` (``compare`` included), or a one-line ValueError naming the
    choices (and the new name of a renamed mode)."""
    for m in (*MODES, COMPARE):
        if m.name == name:
            return m
    if name in RENAMED_MODES:
        raise ValueError(f"mode={name!r} was renamed to {RENAMED_MODES[name]!r} (the "
                         f"no-exploration, on-demand-only run; the objective is rl.objective)")
    raise ValueError(f"mode={name!r}: choose one of {(*mode_names(), COMPARE.name)}")


def check_objective(name: str) -> str:
    if name not in OBJECTIVES:
        raise ValueError(f"rl.objective={name!r}: choose one of {OBJECTIVES}")
    return name
