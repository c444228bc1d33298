"""The run loop: resume, step the mode, run the hooks at their cadence, stop on budget.

It takes a built run (``runner.build.build_run``) and only steps it: nothing here reads the
config or resolves a reward.

What runs beside the mode's step (held-out evaluation, checkpoints, the reward curve, the LoRA
export) is a hook (``spotlight_jax.runner.hooks``): :func:`default_hooks` are the run's own, and
a caller adds more with ``run(..., hooks=Hooks().add(fn, every=N))``.

The run ends at ``rl.iterations`` or when the RL compute time (rollouts + updates +
exploration; not evaluation or start-up) reaches ``rl.max_minutes``, whichever comes first; the
progress bar counts toward that limit, so its ETA is the run's. A killed run resumes from its
last checkpoint and redoes the iterations after it (their metric rows are dropped first).
"""
from __future__ import annotations

import statistics

from absl import logging
from tqdm.auto import tqdm

from spotlight_jax.runner import outputs
from spotlight_jax.runner.checkpointing import RunCheckpoints
from spotlight_jax.runner.hooks import Hooks
from spotlight_jax.runner.state import RunState


class _Progress:
    """A tqdm bar in RL minutes whose total is the earlier of the time budget and the time the
    remaining iterations are projected to take: the median of the last :attr:`WINDOW`
    iterations' RL seconds each, so the first iterations' compiles (several times a later
    iteration's time) do not inflate the projection for the rest of the run."""

    WINDOW = 20

    def __init__(self, desc: str, budget_s: float, start_it: int, iterations: int,
                 spent_s: float, enabled: bool):
        self.budget_s, self.iterations = budget_s, iterations
        self.last_it, self.last_spent = start_it, spent_s
        self.recent: list[float] = []       # RL seconds per iteration, the last WINDOW
        total = budget_s or None
        self.bar = tqdm(total=None if total is None else round(total / 60, 2),
                        initial=round(spent_s / 60, 2), unit="RL min", desc=desc,
                        disable=not enabled, dynamic_ncols=True,
                        bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} "
                                   "[{elapsed}<{remaining}{postfix}]" if total else None)

    def projected_s(self, iteration: int, spent_s: float) -> float:
        """RL seconds at the run's last iteration, from the recent iterations' median."""
        done = iteration - self.last_it
        if done > 0:
            self.recent = (self.recent + [(spent_s - self.last_spent) / done] * done
                           )[-self.WINDOW:]
            self.last_it, self.last_spent = iteration, spent_s
        per_it = statistics.median(self.recent) if self.recent else 0.0
        return spent_s + per_it * (self.iterations - iteration)

    def update(self, iteration: int, spent_s: float, postfix: dict) -> None:
        projected = self.projected_s(iteration, spent_s)
        end = min(projected, self.budget_s) if self.budget_s else projected
        # set, not summed: rounded increments would overshoot the total
        self.bar.total = round(end / 60, 2)
        self.bar.n = round(min(spent_s, end) / 60, 2)
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def default_hooks(run: RunState, checkpoints: RunCheckpoints, base_source: str = "") -> Hooks:
    """Held-out evaluation every ``rl.eval_every`` (none at 0), a checkpoint and the reward
    curve every ``checkpoint_every``, the LoRA export after the last iteration; each also after
    the last."""
    st = run.settings
    hooks = Hooks()
    if st.eval_every:
        hooks.add(lambda r, last: {f"val_{k}": v
                                   for k, v in outputs.evaluate(r, r.iteration).items()},
                  every=st.eval_every, metrics=True)
    hooks.add(lambda r, last: checkpoints.save(r), every=st.checkpoint_every)
    hooks.add(lambda r, last: outputs.plot_rewards(r), every=st.checkpoint_every)
    hooks.add(lambda r, last: outputs.export_lora(r, base_source), every=0)
    return hooks


def run(state: RunState, *, base_source: str = "", progress: bool = True,
        hooks: Hooks | None = None):
    """Runs the mode of the built run ``state`` (``runner.build.build_run``) in its workdir,
    resuming whatever is there; returns the history.

    ``base_source``: where the base came from (the LoRA export's metadata). ``hooks``: more
    hooks, run after :func:`default_hooks` at their cadence.
    """
    r = state
    st = r.settings
    checkpoints = RunCheckpoints(r.workdir, st.max_to_keep)
    hooks = default_hooks(r, checkpoints, base_source).extend(hooks)
    restored = checkpoints.restore(r)
    # rows written after the checkpoint (a killed run) are redone: keep each iteration once
    dropped = r.writer.drop_after(r.iteration if restored else -1)
    if dropped:
        logging.info("rl.jsonl: dropped %d row(s) past iteration %d, which this run redoes",
                     dropped, r.iteration)
    if r.iteration == 0 and not r.history:
        res = {f"val_{k}": v for k, v in outputs.evaluate(r, 0).items()}
        r.history.append({"iteration": 0, "vtime_s": 0.0, "dollars": 0.0, **res})
        r.writer.write(0, **res)
    budget_s = 60.0 * st.max_minutes
    spent = sum(h.get("time_rollout", 0.0) + h.get("time_train", 0.0) for h in r.history)
    bar = _Progress(f"{st.mode} ({st.objective})", budget_s, r.iteration, st.iterations,
                    spent, progress)
    for k in range(r.iteration, st.iterations):
        row = r.step(k)
        spent += row["time_rollout"] + row["time_train"]
        row["rl_time_s"] = spent
        out_of_time = bool(budget_s) and spent >= budget_s
        last = out_of_time or r.iteration == st.iterations
        row.update(hooks.metrics(r, last))
        r.history.append(row)
        r.writer.write(r.iteration, **{k2: v for k2, v in row.items() if k2 != "iteration"})
        post = {"it": r.iteration, "reward": f"{row['reward_mean']:.3f}"}
        if r.mode.uses_spot:
            post.update(spot=row["spot_alive"], preempt=row["preemptions"])
        bar.update(r.iteration, spent, post)
        hooks.after_row(r, last)
        if out_of_time:
            logging.info("rl.max_minutes=%s reached after %d iterations", st.max_minutes,
                         r.iteration)
            break
    bar.close()
    r.close()
    checkpoints.close()
    r.writer.close()
    outputs.write_phases(r)
    return r.history
