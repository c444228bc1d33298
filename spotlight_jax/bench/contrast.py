"""How much contrast does seed exploration add to the training groups?

  python -m spotlight_jax.bench.contrast [--prompts 64] [--pool 16] [--seed 0] [--config PATH]

Scores ``--prompts`` training prompts x ``--pool`` candidate seeds with the config's base policy
and its training SDE rollout (the explorer's scorer), then compares the groups GRPO would train
on: the first G seeds of each prompt (``flow_grpo``) against each prompt's max-variance G-subset
of the pool (``explore_sync`` with the same pool). Reports the mean within-group reward std, the
share of zero-variance groups (advantage 0, no signal), the mean |advantage| as GRPO computes it
(per-prompt std unless ``rl.global_std``) and the groups' mean reward — the numbers that say
whether exploration can speed learning up.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[2] / "configs"
                                            / "tiny.py"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--pool", type=int, default=16, help="candidate seeds per prompt")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import numpy as np

    from spotlight_jax import controller, train
    from spotlight_jax.builders import load_config, rl_config
    from spotlight_jax.explore import candidate_seeds

    config = load_config(args.config)
    config.mode, config.seed = "flow_grpo", args.seed
    G = config.rl.group_size
    if args.pool < G:
        raise SystemExit(f"--pool {args.pool} is smaller than the group size {G}")
    workdir = tempfile.mkdtemp(prefix="contrast_")
    graphdef, base, source = train.load_or_pretrain_base(config, workdir)
    run = controller.Run(config, workdir, graphdef, base)
    pool = run.train_prompts
    rng = np.random.default_rng(args.seed)
    prompts = [pool[i] for i in rng.choice(len(pool), min(args.prompts, len(pool)), replace=False)]
    seeds = [candidate_seeds(args.seed, 0, i, args.pool) for i in range(len(prompts))]
    rewards = np.stack(run.explorer.score(run.trainer.sampling_state(), prompts, seeds))
    t = contrast_table(rewards, G, global_std=rl_config(config).global_std)
    print(f"\n{len(prompts)} training prompts x {args.pool} candidate seeds, G = {G}, training SDE "
          f"rollout, base: {source}")
    print("| groups | within-group std | zero-variance groups | mean abs advantage | reward |")
    print("|---|---|---|---|---|")
    names = {"first": f"first {G} seeds (flow_grpo)",
             "selected": f"max-variance {G} of {args.pool} (explore_sync)"}
    for k, name in names.items():
        s = t[k]
        print(f"| {name} | {s['group_std']:.3f} | {s['zero_var_groups']:.3f} | "
              f"{s['mean_abs_advantage']:.3f} | {s['reward_mean']:.3f} |")


if __name__ == "__main__":
    main()
