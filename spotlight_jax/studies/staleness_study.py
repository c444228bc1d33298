"""Staleness study: do seed rankings under stale weights agree with the current weights'?

  python -m spotlight_jax.studies.staleness_study [--iterations 12] [--at 4,8,12] [--prompts 8]
      [--seeds 32] [--lr LR] [--objective flow_grpo|nft] [--out DIR]

Runs a short post-training run (``mode=baseline``, the objective of ``--objective``) of the
config from its base checkpoint, keeping the sampling policy after every iteration (Flow-GRPO:
θ; nft: the lagging θ_old that samples the batch). At each iteration k of ``--at`` it scores
the same ``--prompts x --seeds`` (prompt, seed) candidates (prompts of that iteration, fresh
candidate seeds) with the policy of k and of k-1, k-2, k-4, using the training rollout as the
scorer (Flow-GRPO: SDE; nft: ODE, where a seed fixes the image), and reports per-prompt Kendall
tau-b, Spearman rho, the overlap of the selected max-variance G-subsets and the share of the
achievable variance gain that stale selection retains (``spotlight_jax.explore.staleness``).
At the last iteration it also measures cheaper scorers against the training rollout (Flow-GRPO:
an ODE rollout from the seed's initial noise and an SDE rollout with half the steps; nft: an
ODE rollout with half the steps). Prints a table, writes ``staleness.json`` and ``staleness.png``
to ``--out``. ``run_study`` is the same study as a function.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.config import RunSpec

FLAGS = flags.FLAGS
STALENESS = (1, 2, 4)


def _fmt(ci) -> str:
    return "n/a" if ci is None else f"{ci.mean:+.2f} [{ci.lo:+.2f}, {ci.hi:+.2f}]"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("config", programs.TINY_CONFIG, "Path to a config file (configs/*.py).",
                        **fv)
    flags.DEFINE_integer("iterations", 12, "baseline-mode iterations to train.", **fv)
    flags.DEFINE_string("at", "4,8,12", f"Iterations k to study (k >= {max(STALENESS)}).", **fv)
    flags.DEFINE_integer("prompts", 8, "Prompts scored at each k.", **fv)
    flags.DEFINE_integer("seeds", 32, "Candidate seeds per prompt.", **fv)
    flags.DEFINE_integer("seed", 0, "The run's seed (config.seed).", **fv)
    flags.DEFINE_float("lr", None, "Override rl.lr (a faster-moving policy makes rankings go "
                       "stale faster).", **fv)
    flags.DEFINE_enum("objective", "flow_grpo", ["flow_grpo", "nft"],
                      "rl.objective of the run whose sampling policies are compared.", **fv)
    flags.DEFINE_string("out", "staleness_out", "Directory for staleness.json and .png.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    at = sorted({int(a) for a in FLAGS.at.split(",")})
    if at[0] < max(STALENESS) or at[-1] > FLAGS.iterations:
        raise app.UsageError(f"--at={FLAGS.at}: every k must satisfy {max(STALENESS)} <= k <= "
                             f"--iterations ({FLAGS.iterations})")
    run_study(FLAGS.config, iterations=FLAGS.iterations, at=at, num_prompts=FLAGS.prompts,
              num_seeds=FLAGS.seeds, seed=FLAGS.seed, lr=FLAGS.lr, objective=FLAGS.objective,
              out=FLAGS.out)


def run_study(config_path: str, *, iterations: int, at, num_prompts: int, num_seeds: int,
              seed: int = 0, lr: float | None = None, objective: str = "flow_grpo",
              out: str) -> dict:
    """The study (see the module docstring; ``num_prompts``, ``num_seeds``: ``--prompts``,
    ``--seeds``); prints its table, writes ``out/staleness.json`` and ``out/staleness.png`` and
    returns what the json holds."""
    import jax
    from tqdm.auto import tqdm

    from spotlight_jax.config import load_config, rl_config, sampler_config
    from spotlight_jax.diffusion import Sampler
    from spotlight_jax.diffusion.engine import RolloutEngine, candidate_seeds
    from spotlight_jax.explore import LocalExplorer
    from spotlight_jax.explore.staleness import ranking_agreement, summarize_agreement
    from spotlight_jax.reporting.plots import plot_curves
    from spotlight_jax.runner import base_model, build_run

    config = load_config(config_path)
    config.mode, config.seed, config.rl.objective = "baseline", seed, objective
    config.rl.eval_every = 0
    if lr is not None:
        config.rl.lr = lr
    os.makedirs(out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="staleness_")
    spec = RunSpec.from_config(config)
    graphdef, base, source = base_model.load_or_pretrain_base(spec, workdir)
    run = build_run(spec, workdir, graphdef, base)
    G = config.rl.group_size
    snap = {0: run.trainer.sampling_state()}
    t0 = time.time()
    kls = []
    for k in tqdm(range(iterations), desc="train"):
        row = run.step(k)
        kls.append(row["kl"])
        snap[k + 1] = jax.tree.map(lambda x: x.copy(), run.trainer.sampling_state())
    train_s = time.time() - t0

    def cands(k):
        return [candidate_seeds(seed, 10_000 + k, i, num_seeds) for i in range(num_prompts)]

    results = {"config": config_path, "base": source, "objective": objective,
               "lr": rl_config(config).lr, "group_size": G,
               "seeds": num_seeds, "prompts": num_prompts, "iterations": iterations,
               "kl": kls,
               "train_s": train_s, "staleness": {}, "scorers": {}}
    rows = []
    for k in tqdm(at, desc="score"):
        prompts = run.prompts(k)[:num_prompts]
        seeds = cands(k)
        fresh = run.explorer.score(snap[k], prompts, seeds)
        for d in STALENESS:
            stale = run.explorer.score(snap[k - d], prompts, seeds)
            s = summarize_agreement(ranking_agreement(fresh, stale, G))
            results["staleness"][f"{k},{d}"] = {
                kk: (v._asdict() if hasattr(v, "_asdict") else v) for kk, v in s.items()}
            rows.append((f"θ_{k} vs θ_{k - d}", s))
    # cheaper scorers against the training rollout under the last studied policy
    k = at[-1]
    prompts, seeds = run.prompts(k)[:num_prompts], cands(k)
    fresh = run.explorer.score(snap[k], prompts, seeds)
    train_cfg = sampler_config(config)
    shape = run.mcfg.latent_shape
    half = max(train_cfg.num_steps // 2, 1)
    variants = {
        f"ODE, {half} steps": dataclasses.replace(train_cfg, num_steps=half, sde_window=None),
    } if objective == "nft" else {
        "ODE from the seed's initial noise": dataclasses.replace(
            train_cfg, noise_level=0.0, sde_type="ode", sde_window=None),
        f"SDE, {half} steps": dataclasses.replace(train_cfg, num_steps=half, sde_window=None),
    }
    for name, scfg in variants.items():
        engine = RolloutEngine(Sampler(graphdef, shape, scfg.validate(), mesh=run.mesh),
                               run.mcfg.text_len, run.engine.reward_fn,
                               chunk=run.engine.chunk, tokenize=run.prompt_source.tokenize)
        other = LocalExplorer(engine).score(snap[k], prompts, seeds)
        s = summarize_agreement(ranking_agreement(fresh, other, G))
        results["scorers"][name] = {kk: (v._asdict() if hasattr(v, "_asdict") else v)
                                    for kk, v in s.items()}
        rows.append((f"θ_{k}: {name}", s))

    print(f"\nStaleness of seed rankings ({num_prompts} prompts x {num_seeds} seeds, G={G}; "
          f"means over prompts with 95% bootstrap CIs; random-subset overlap = "
          f"{G / num_seeds:.2f}; base: {source})")
    kl = f"; policy KL to the base after {iterations} iterations: {kls[-1]:.2e}" \
        if objective == "flow_grpo" else ""
    print(f"rl.objective {objective}; rl.lr {rl_config(config).lr}{kl}")
    print("| compared | Kendall tau-b | Spearman rho | subset overlap | variance gain kept |"
          " prompts skipped |")
    print("|---|---|---|---|---|---|")
    for name, s in rows:
        print(f"| {name} | {_fmt(s['tau'])} | {_fmt(s['rho'])} | {_fmt(s['overlap'])} | "
              f"{_fmt(s['retained'])} | {s['skipped']} |")
    with open(os.path.join(out, "staleness.json"), "w") as f:
        json.dump(results, f, indent=1)
    series = {}
    for k in at:
        t = [results["staleness"][f"{k},{d}"]["tau"] for d in STALENESS]
        if all(x is not None for x in t):
            series[f"k={k}"] = (list(STALENESS), [x["mean"] for x in t],
                                [x["lo"] for x in t], [x["hi"] for x in t])
    plot_curves(os.path.join(out, "staleness.png"), series, xlabel="staleness d (updates)",
                ylabel="Kendall tau-b (θ_k vs θ_{k-d})",
                title=f"Seed-ranking agreement under stale weights ({objective})")
    print(f"wrote {out}/staleness.json and staleness.png")
    return results


if __name__ == "__main__":
    define_flags()
    app.run(main)
