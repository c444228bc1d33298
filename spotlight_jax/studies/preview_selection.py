"""Would cheaper candidates explore better? Seed selection by a preview of each rollout.

  python -m spotlight_jax.studies.preview_selection --config=configs/tiny.py
      [--workdir RUN] [--prompts 32] [--seeds 32] [--out F.json]

The spot devices' exploration is bounded by what one update's window lets them sample: a
candidate costs a whole rollout. A candidate could instead be scored on a *preview* — the clean
image the model predicts after ``m`` of the sampler's ``T`` steps (``x_m - sigma_m v``, one
extra forward) — and only the chosen G completed (the rollout continues from ``x_m``, so the
training batch is the same trajectories). At a budget of ``B`` full rollouts per prompt a
preview at step ``m`` costs ``f = (m + 1) / T`` of one, so the pool grows to
``(B - G (1 - f)) / f`` candidates (the chosen G still finish); the question is whether
selecting by the noisier preview on the bigger pool beats selecting by the final reward on the
smaller one. A reward charged per image shrinks the gain: a preview pays the reward too, and
each chosen candidate is scored again once finished (``reward_share``: the reward's share of
a candidate's cost; the config's cost model by default, 17% for configs/tiny.py). This study
samples ``--prompts`` training prompts x ``--seeds`` seeds under the
base policy (or a run's newest checkpoint, ``--workdir``), scores every preview and the final
image with the run's reward, and reports each step's preview-final correlation and the selected
G-subset's variance of *final* rewards (what the update trains on) against full scoring, at
budgets of 2, 3 and 4 G rollouts per prompt (the pipelined mode explores about 2 G per prompt
in one update's window), with the reward free and at its cost model's share.
"""
from __future__ import annotations

import tempfile

from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS
BUDGETS = (2, 3, 4)        # rollouts per prompt, in multiples of G


def preview_pool(budget: float, group: int, cost: float, most: int,
                 reward_share: float = 0.0) -> int:
    """Candidates per prompt a budget of ``budget`` full candidates (rollout and reward) buys
    when each is scored on a preview whose sampling costs ``cost`` of a rollout's and the chosen
    ``group`` are then finished and scored again; ``reward_share``: the reward's share of a full
    candidate's cost. At most ``most`` (the candidates sampled), at least ``group``."""
    preview = cost * (1.0 - reward_share) + reward_share
    finish = (1.0 - cost) * (1.0 - reward_share) + reward_share
    return int(max(group, min(most, (budget - group * finish) / preview)))


def selected_variance(final, scores, group: int, pool: int) -> float:
    """Mean over prompts of the variance of the *final* rewards of the max-variance
    ``group``-subset chosen by ``scores`` among each prompt's first ``pool`` candidates.
    ``final``, ``scores``: ``[prompts, candidates]``."""
    import numpy as np

    from spotlight_jax.explore.selection import max_variance_subset, subset_variance

    return float(np.mean([subset_variance(f[:pool], max_variance_subset(s[:pool], group))
                          for f, s in zip(np.asarray(final), np.asarray(scores))]))


def preview_rewards(run, state, prompts: list[str], seeds, steps) -> tuple:
    """``(final [P, N], {m: preview [P, N]})``: the run's training rollout of every prompt x
    seed (``seeds [P, N]``) under ``state``, rewarded at the end and on the clean image
    predicted from the latent after each step ``m`` of ``steps``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from spotlight_jax.diffusion import rollout as R

    sampler = run.sampler
    cfg, sigmas = sampler.cfg, np.asarray(sampler.cfg.sigmas)
    graphdef = sampler.graphdef
    n = seeds.shape[1]
    flat = [p for p in prompts for _ in range(n)]
    tokens, mask = run.prompt_source.tokenize(flat, run.mcfg.text_len)

    @jax.jit
    def predicted(state, x, sigma, tokens, mask):
        v = R.velocity(nnx.merge(graphdef, state), x, sigma, tokens, mask,
                       guidance=cfg.guidance, attn=sampler.attn)
        return R.to_image(x - sigma * v)

    final, previews = [], {m: [] for m in steps}
    chunk, flat_seeds = 64, np.asarray(seeds, np.uint32).reshape(-1)
    for s in range(0, len(flat), chunk):
        tok, msk, ps = tokens[s:s + chunk], mask[s:s + chunk], flat[s:s + chunk]
        out = sampler.rollout(state, tok, msk, flat_seeds[s:s + chunk])
        final.append(np.asarray(run.reward(np.asarray(out["images"]), ps)))
        for m in steps:
            img = predicted(state, out["latents"][:, m], jnp.float32(sigmas[m]), tok, msk)
            previews[m].append(np.asarray(run.reward(np.asarray(img), ps)))
    shape = (len(prompts), n)
    return (np.concatenate(final).reshape(shape),
            {m: np.concatenate(v).reshape(shape) for m, v in previews.items()})


def compare(final, previews: dict, group: int, num_steps: int, budgets=BUDGETS,
            reward_share: float = 0.0) -> dict:
    """Per preview step: the mean per-prompt correlation with the final reward, and at each
    budget (in G full candidates per prompt) the selected variance by full scoring and by
    preview (the pool :func:`preview_pool` buys)."""
    import numpy as np

    n = final.shape[1]
    out = {"reward_share": reward_share, "random": float(np.mean(final[:, :group].var(axis=1))),
           "full": {b: selected_variance(final, final, group, min(n, int(b * group)))
                    for b in budgets}, "preview": {}}
    for m, scores in previews.items():
        cost = (m + 1) / num_steps
        ok = [i for i in range(len(final)) if final[i].std() > 0 and scores[i].std() > 0]
        row = {"cost": cost, "corr": float(np.mean([np.corrcoef(scores[i], final[i])[0, 1]
                                                    for i in ok])) if ok else float("nan")}
        for b in budgets:
            pool = preview_pool(b * group, group, cost, n, reward_share)
            row[b] = {"pool": pool, "variance": selected_variance(final, scores, group, pool)}
        out["preview"][m] = row
    return out


def report(res: dict, group: int, source: str) -> str:
    budgets = list(res["full"])
    lines = [f"Policy: {source}. Variance of the final rewards of the selected G={group} "
             f"(random G: {res['random']:.4f}); budget in full candidates per prompt; the "
             f"reward {res['reward_share']:.0%} of a candidate's cost.", "",
             "| scored on | sampling cost of a candidate | corr. with final | "
             + " | ".join(f"B = {b}G: pool / variance" for b in budgets) + " |",
             "|---|---|---|" + "---|" * len(budgets),
             "| final image | 1.00 | 1.000 | " + " | ".join(
                 f"{b * group} / **{res['full'][b]:.4f}**" for b in budgets) + " |"]
    for m, row in res["preview"].items():
        lines.append(f"| preview after step {m} | {row['cost']:.2f} | {row['corr']:.3f} | "
                     + " | ".join(f"{row[b]['pool']} / {row[b]['variance']:.4f}"
                                  for b in budgets) + " |")
    return "\n".join(lines)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    programs.define_config_flag(flag_values)
    flags.DEFINE_string("workdir", None, "A run whose newest checkpoint is the policy (default: "
                        "the base).", **fv)
    flags.DEFINE_integer("prompts", 32, "Training prompts.", **fv)
    flags.DEFINE_integer("seeds", 32, "Candidate seeds per prompt (the largest pool).", **fv)
    flags.DEFINE_float("reward_share", None, "The reward's share of a candidate's cost (default: "
                       "the config's cost model's, on a spot group).", **fv)
    flags.DEFINE_string("out", None, "Write the result as JSON here.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import numpy as np

    from spotlight_jax.config import RunSpec
    from spotlight_jax.diffusion.engine import candidate_seeds
    from spotlight_jax.runner import base_model
    from spotlight_jax.studies._policy_run import policy_run

    config = FLAGS.config
    with config.unlocked():
        config.mode = "baseline"            # one trainer device, no spot fleet to build
    spec = RunSpec.from_config(config)
    graphdef, base, _ = base_model.load_or_pretrain_base(spec, tempfile.mkdtemp())
    try:
        run = policy_run(spec, graphdef, base, FLAGS.workdir)
    except FileNotFoundError as e:
        raise app.UsageError(str(e)) from None
    source = f"{FLAGS.workdir} at iteration {run.iteration}" if FLAGS.workdir else "the base"
    group, steps = spec.settings.group_size, run.sampler.cfg.num_steps
    prompts = []
    k = 10_000                              # iterations no run of the grid reaches
    while len(prompts) < FLAGS.prompts:
        prompts += run.prompts(k)
        k += 1
    prompts = prompts[:FLAGS.prompts]
    seeds = np.stack([candidate_seeds(spec.settings.seed, k, i, FLAGS.seeds)
                      for i in range(len(prompts))])
    final, previews = preview_rewards(run, run.trainer.sampling_state(), prompts, seeds,
                                      range(1, steps - 1))
    budgets = [b for b in BUDGETS if b * group <= FLAGS.seeds]
    d = run.deploy
    share = FLAGS.reward_share
    if share is None:
        rollout_s = d.cost.rollout(8, sp=d.cfg.spot_sp) / 8
        share = d.cost.reward(1) / (rollout_s + d.cost.reward(1))
    results = [compare(final, previews, group, steps, budgets, s) for s in dict.fromkeys(
        (0.0, share))]
    programs.emit({"policy": source, "group": group, "results": results},
                  "\n\n".join(report(r, group, source) for r in results), FLAGS.out)


if __name__ == "__main__":
    define_flags()
    app.run(main)
