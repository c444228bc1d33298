"""The run loop's hooks: what runs beside the mode's step, each at its own cadence.

A hook is ``fn(run, last)`` added with ``every=N`` (it runs after iterations that are multiples
of N, and after the run's last iteration; ``every=0``: only after the last). A hook added with
``metrics=True`` returns a dict that joins the iteration's metrics row before the row is written
(held-out evaluation); the others run after the row is in the history (checkpoints, plots,
exports), so what they save includes it. Hooks run in the order they were added.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Hook:
    fn: Callable
    every: int
    metrics: bool = False

    def due(self, iteration: int, last: bool) -> bool:
        return last or (self.every > 0 and iteration % self.every == 0)


class Hooks:
    """An ordered list of hooks (``add(fn, every=N)``)."""

    def __init__(self):
        self.hooks: list[Hook] = []

    def add(self, fn: Callable, every: int, *, metrics: bool = False) -> Hooks:
        if every < 0:
            raise ValueError(f"every={every}: a hook's cadence is >= 0 iterations (0: last only)")
        self.hooks.append(Hook(fn, int(every), metrics))
        return self

    def extend(self, other: Hooks | None) -> Hooks:
        self.hooks.extend(other.hooks if other is not None else ())
        return self

    def metrics(self, run, last: bool) -> dict:
        """The metrics the due metric hooks add to the iteration's row."""
        out = {}
        for h in self.hooks:
            if h.metrics and h.due(run.iteration, last):
                out.update(h.fn(run, last) or {})
        return out

    def after_row(self, run, last: bool) -> None:
        """Runs the due hooks that act on the run once the iteration's row is kept."""
        for h in self.hooks:
            if not h.metrics and h.due(run.iteration, last):
                h.fn(run, last)
