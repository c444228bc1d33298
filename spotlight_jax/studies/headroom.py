"""What a policy draws right, per constraint: the room RL has to sharpen it.

  python -m spotlight_jax.studies.headroom [--workdir RUN] [--seeds 32] [--config PATH]

Samples every held-out prompt ``--seeds`` times with the config's training rollout (nft: the
ODE sampler) under the base policy and, with ``--workdir``, under that run's evaluated policy
(its newest checkpoint; the run's config overrides given as ``--config.x=y``), and reports per
constraint (exact successes): the per-sample success rate, the share of prompts with at least
one success among the seeds, and the share whose success rate is at least one half. A
regression onto a group's good samples can only sharpen what the sampler draws: a constraint a
policy gets right in a few percent of its samples gives few groups any contrast on it.
``constraint_headroom`` is the same as a function.
"""
from __future__ import annotations

import tempfile

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.config import RunSpec

FLAGS = flags.FLAGS


def success_table(breakdown: dict, num_prompts: int) -> dict[str, dict]:
    """``breakdown``: ``constraint_breakdown(..., exact=True)`` of ``num_prompts`` prompts x
    seeds (prompt after prompt). Per constraint that applies to some prompt: ``prompts`` (how
    many), ``rate`` (mean success per sample), ``any`` (share of those prompts with a success)
    and ``half`` (share with a success rate >= 0.5)."""
    import numpy as np

    out = {}
    for name, v in breakdown.items():
        v = np.asarray(v, np.float64).reshape(num_prompts, -1)
        applies = ~np.isnan(v).all(axis=1)
        if not applies.any():
            continue
        s = np.nan_to_num(v[applies])
        out[name] = {"prompts": int(applies.sum()), "rate": float(s.mean()),
                     "any": float((s.max(axis=1) > 0).mean()),
                     "half": float((s.mean(axis=1) >= 0.5).mean())}
    return out


def constraint_headroom(config, workdir: str | None = None, seeds: int = 32) -> dict:
    """``{"base": table, "run": table or None}`` (:func:`success_table`) over the held-out
    prompts of ``config``'s world, and ``{"base_binding": ..., "run_binding": ... or None}``
    (``rewards.shape_binding``) of the same samples."""
    import numpy as np

    from spotlight_jax import world
    from spotlight_jax.rewards.geneval import constraint_breakdown, shape_binding
    from spotlight_jax.runner import base_model
    from spotlight_jax.studies._policy_run import policy_run

    spec = RunSpec.from_config(config)
    graphdef, base, _ = base_model.load_or_pretrain_base(spec, tempfile.mkdtemp())
    prompts = world.val_prompts()
    flat = [p for p in prompts for _ in range(seeds)]
    ids = np.arange(len(flat), dtype=np.uint32) + 1000       # not the training seeds

    def tables(run, state):
        images = run.engine.run(state, flat, ids)["images"]
        return (success_table(constraint_breakdown(images, flat, exact=True), len(prompts)),
                shape_binding(images, flat))

    fresh = policy_run(spec, graphdef, base)
    out = {"run": None, "run_binding": None}
    out["base"], out["base_binding"] = tables(fresh, fresh.trainer.sampling_state())
    if workdir:
        r = policy_run(spec, graphdef, base, workdir)
        out["run"], out["run_binding"] = tables(r, r.trainer.eval_state())
    return out


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    programs.define_config_flag(flag_values)
    flags.DEFINE_string("workdir", None, "A run to compare with the base (optional).",
                        flag_values=flag_values)
    flags.DEFINE_integer("seeds", 32, "Samples per held-out prompt.", flag_values=flag_values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from spotlight_jax.rewards.geneval import BINDING_OUTCOMES

    config = FLAGS.config
    with config.unlocked():
        config.mode = "baseline"            # one trainer device, no spot fleet to build
    res = constraint_headroom(config, FLAGS.workdir, FLAGS.seeds)
    print(f"Exact successes per constraint, held-out prompts x {FLAGS.seeds} seeds "
          "(rate per sample; prompts with any success; prompts right in >= half the seeds)")
    cols = ["base"] + (["run"] if res["run"] else [])
    print("| constraint | prompts | " + " | ".join(f"{c}: rate / any / half" for c in cols)
          + " |")
    print("|---|---|" + "---|" * len(cols))
    for k, b in res["base"].items():
        cells = [f"{res[c][k]['rate']:.3f} / {res[c][k]['any']:.2f} / {res[c][k]['half']:.2f}"
                 for c in cols]
        print(f"| {k} | {b['prompts']} | " + " | ".join(cells) + " |")
    n = res["base_binding"]["prompts"]
    m = res["base_binding"]["single_prompts"]
    print(f"\nShape binding: two-object prompts asking two different elongations x seeds ({n} "
          "images); each color's largest component has its own asked elongation (both), the "
          "other's (swapped), one right, neither, or a color is missing; alone: single-object "
          f"prompts x seeds ({m} images) drawn with the asked elongation")
    print("| policy | " + " | ".join(BINDING_OUTCOMES) + " | alone |")
    print("|---|" + "---|" * (len(BINDING_OUTCOMES) + 1))
    for c in cols:
        b = res[f"{c}_binding"]
        print(f"| {c} | " + " | ".join(f"{b[k]:.2f}" for k in BINDING_OUTCOMES + ("alone",))
              + " |")


if __name__ == "__main__":
    define_flags()
    app.run(main)
