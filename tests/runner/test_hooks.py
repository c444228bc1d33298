"""The run loop's hooks: each runs at its cadence and after the last iteration; metric hooks add
to the iteration's row before it is written, the others act once it is kept. Its progress bar
projects the run's end from the recent iterations."""
import types

import pytest

from spotlight_jax.runner import loop, outputs
from spotlight_jax.runner.hooks import Hooks


def _run(iteration=0):
    return types.SimpleNamespace(iteration=iteration, history=[],
                                 settings=types.SimpleNamespace(eval_every=3, checkpoint_every=4))


def _drive(hooks, run, iterations):
    """The loop's calls, iteration by iteration; returns the rows."""
    rows = []
    for k in range(iterations):
        run.iteration = k + 1
        last = run.iteration == iterations
        row = {"iteration": run.iteration, **hooks.metrics(run, last)}
        run.history.append(row)
        rows.append(row)
        hooks.after_row(run, last)
    return rows


def test_hooks_run_at_their_cadence_and_after_the_last_iteration():
    calls = []
    hooks = (Hooks().add(lambda r, last: calls.append(("every 2", r.iteration)), every=2)
             .add(lambda r, last: calls.append(("last only", r.iteration)), every=0)
             .add(lambda r, last: {"val": r.iteration * 10}, every=3, metrics=True))
    run = _run()
    rows = _drive(hooks, run, 7)
    assert [c for c in calls if c[0] == "every 2"] == [("every 2", i) for i in (2, 4, 6, 7)]
    assert [c for c in calls if c[0] == "last only"] == [("last only", 7)]
    assert [r.get("val") for r in rows] == [None, None, 30, None, None, 60, 70]
    with pytest.raises(ValueError, match="every=-1"):
        Hooks().add(print, every=-1)


def test_after_row_hooks_see_the_row_and_metric_hooks_do_not():
    seen = []
    hooks = (Hooks().add(lambda r, last: seen.append(("metrics", len(r.history))), every=1,
                         metrics=True)
             .add(lambda r, last: seen.append(("after", len(r.history))), every=1))
    _drive(hooks, _run(), 2)
    assert seen == [("metrics", 0), ("after", 1), ("metrics", 1), ("after", 2)]


def test_default_hooks_evaluate_checkpoint_plot_and_export_in_order(monkeypatch):
    calls = []
    monkeypatch.setattr(outputs, "evaluate", lambda r, k: calls.append(("eval", k)) or
                        {"reward": 0.5})
    monkeypatch.setattr(outputs, "plot_rewards", lambda r: calls.append(("plot", r.iteration)))
    monkeypatch.setattr(outputs, "export_lora",
                        lambda r, src: calls.append(("export", r.iteration, src)))
    ckpt = types.SimpleNamespace(save=lambda r: calls.append(("save", r.iteration)))
    run = _run()
    rows = _drive(loop.default_hooks(run, ckpt, "base/dir"), run, 5)
    assert [r.get("val_reward") for r in rows] == [None, None, 0.5, None, 0.5]
    assert calls == [("eval", 3), ("save", 4), ("plot", 4),
                     ("eval", 5), ("save", 5), ("plot", 5), ("export", 5, "base/dir")]
    run.settings.eval_every = 0      # no evaluation at all, not even after the last
    calls.clear()
    _drive(loop.default_hooks(run, ckpt), run, 1)
    assert [c[0] for c in calls] == ["save", "plot", "export"]


def test_the_progress_bars_projection_forgets_the_first_iterations_compiles():
    """A run of 100 iterations whose first took 30 RL seconds (compiles) and the rest 2 each:
    after 10 iterations the bar projects 30 + 99 x 2 = 228 s (the recent median), where the
    mean so far (4.8 s per iteration) would project 480 s; within a time budget the total is
    the budget."""
    bar = loop._Progress("t", 0.0, 0, 100, 0.0, enabled=False)
    spent = 0.0
    for it, dt in enumerate([30.0] + [2.0] * 9, start=1):
        spent += dt
        projected = bar.projected_s(it, spent)
    assert projected == pytest.approx(30.0 + 99 * 2.0)
    bar = loop._Progress("t", 120.0, 0, 100, 0.0, enabled=False)
    bar.update(1, 30.0, {})
    bar.update(3, 34.0, {})                   # two iterations at once: 2 s each
    assert bar.bar.total == 2.0               # the budget (120 s) comes first
    assert bar.recent == [30.0, 2.0, 2.0]
