"""How much contrast does seed exploration add to the training groups?

  python -m spotlight_jax.studies.contrast [--prompts 64] [--pool 16] [--seed 0] [--config PATH]

Scores ``--prompts`` training prompts x ``--pool`` candidate seeds with the config's base policy
and its training SDE rollout (the explorer's scorer), then compares the groups GRPO would train
on: the first G seeds of each prompt (``baseline``) against each prompt's max-variance G-subset
of the pool (``explore_sync`` with the same pool). Reports the mean within-group reward std, the
share of zero-variance groups (advantage 0, no signal), the mean |advantage| as GRPO computes it
(per-prompt std unless ``rl.global_std``) and the groups' mean reward — the numbers that say
whether exploration can speed learning up.
"""
from __future__ import annotations

import tempfile

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.config import RunSpec

FLAGS = flags.FLAGS


def contrast_table(rewards, group_size: int, global_std: bool = False) -> dict:
    """``rewards [P, N]`` (prompt x candidate seed) -> stats of the first-G and max-variance
    G-subset groups: ``{"first": {...}, "selected": {...}}`` with group_std, zero_var_groups,
    mean_abs_advantage and reward_mean."""
    import numpy as np

    from spotlight_jax.explore import max_variance_subset
    from spotlight_jax.rl import advantages, group_stats

    r = np.asarray(rewards, np.float64)
    if r.ndim != 2 or r.shape[1] < group_size:
        raise ValueError(f"rewards of shape {r.shape}: need [prompts, pool >= {group_size}]")
    ids = np.repeat(np.arange(r.shape[0]), group_size)
    picks = {"first": r[:, :group_size],
             "selected": np.stack([row[max_variance_subset(row, group_size)] for row in r])}
    out = {}
    for name, x in picks.items():
        flat = x.reshape(-1)
        adv = advantages(flat, ids, global_std=global_std)
        out[name] = {**group_stats(flat, ids), "mean_abs_advantage": float(np.abs(adv).mean()),
                     "reward_mean": float(flat.mean())}
    return out


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("config", programs.TINY_CONFIG, "Path to a config file (configs/*.py).",
                        **fv)
    flags.DEFINE_integer("prompts", 64, "Training prompts to score.", **fv)
    flags.DEFINE_integer("pool", 16, "Candidate seeds per prompt.", **fv)
    flags.DEFINE_integer("seed", 0, "Seed of the prompt choice and the candidate seeds.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import numpy as np

    from spotlight_jax.config import load_config, rl_config
    from spotlight_jax.diffusion.engine import candidate_seeds
    from spotlight_jax.runner import base_model, build_run

    config = load_config(FLAGS.config)
    config.mode, config.seed = "baseline", FLAGS.seed
    G = config.rl.group_size
    if FLAGS.pool < G:
        raise app.UsageError(f"--pool={FLAGS.pool} is smaller than the group size {G}")
    workdir = tempfile.mkdtemp(prefix="contrast_")
    spec = RunSpec.from_config(config)
    graphdef, base, source = base_model.load_or_pretrain_base(spec, workdir)
    run = build_run(spec, workdir, graphdef, base)
    pool = run.train_prompts
    rng = np.random.default_rng(FLAGS.seed)
    picks = rng.choice(len(pool), min(FLAGS.prompts, len(pool)), replace=False)
    prompts = [pool[i] for i in picks]
    seeds = [candidate_seeds(FLAGS.seed, 0, i, FLAGS.pool) for i in range(len(prompts))]
    rewards = np.stack(run.explorer.score(run.trainer.sampling_state(), prompts, seeds))
    t = contrast_table(rewards, G, global_std=rl_config(config).global_std)
    print(f"\n{len(prompts)} training prompts x {FLAGS.pool} candidate seeds, G = {G}, training "
          f"SDE rollout, base: {source}")
    print("| groups | within-group std | zero-variance groups | mean abs advantage | reward |")
    print("|---|---|---|---|---|")
    names = {"first": f"first {G} seeds (baseline)",
             "selected": f"max-variance {G} of {FLAGS.pool} (explore_sync)"}
    for k, name in names.items():
        s = t[k]
        print(f"| {name} | {s['group_std']:.3f} | {s['zero_var_groups']:.3f} | "
              f"{s['mean_abs_advantage']:.3f} | {s['reward_mean']:.3f} |")


if __name__ == "__main__":
    define_flags()
    app.run(main)
