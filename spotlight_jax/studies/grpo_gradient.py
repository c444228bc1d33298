"""Where the GRPO update's gradient comes from, per denoising step, and how noisy it is.

  python -m spotlight_jax.studies.grpo_gradient [--batches 6] [--prompts 8]

At the shipped base, for several independent iteration batches (``--prompts`` prompts x
``rl.group_size`` SDE rollouts, as one GRPO iteration samples them) it takes the LoRA gradient of
the GRPO loss of each trained step ``j`` on its own and prints, per step: its share of the
update's gradient energy (``|g_j|^2 / sum_j |g_j|^2``, averaged over batches) and the mean cosine
between the step's gradients from different batches (what they agree on: the signal; 0 = noise
only). Rows for per-pixel SDE noise (``sampler.noise_patch=1``) and block noise
(``noise_patch=2``, the default, and ``4``), with the batches' within-group reward std (what GRPO
learns from).

The log-prob gradient of a step is ``eps / std`` projected through the model, so the last steps
(small ``std``) dominate the update while their noise only moves fine detail.
"""
from __future__ import annotations

import itertools
import tempfile

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.config import RunSpec

FLAGS = flags.FLAGS


def step_gradients(run, batches: int):
    """``({step: [flat LoRA gradient per batch]}, [within-group reward std per batch])``."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from spotlight_jax.rl import grpo
    from spotlight_jax.rl.policy import policy_model
    from spotlight_jax.runner.backends.rollouts import group_seeds

    tr = run.trainer
    cfg, smp, graphdef, base = tr.cfg, tr.sampler, tr.graphdef, tr.base

    @jax.jit
    def grad(trainable, batch, idx):
        def loss(t):
            return grpo.grpo_loss(policy_model(graphdef, cfg, t, base), batch, idx, smp, cfg,
                                  None, True)[0]
        return jax.grad(loss)(trainable)

    steps = np.flatnonzero(smp.stochastic_steps())
    grads, spread = {int(j): [] for j in steps}, []
    for b in range(batches):
        prompts = run.prompts(b)
        seeds = group_seeds(run.settings.seed, b, len(prompts), run.settings.group_size,
                            smp.shared_init_bits)
        out = run.rollout(prompts, seeds)
        spread.append(grpo.group_stats(out["rewards"], out["prompt_ids"])["group_std"])
        adv = grpo.advantages(out["rewards"], out["prompt_ids"])
        batch = {"latents": jnp.asarray(out["latents"]), "log_probs": jnp.asarray(out["log_probs"]),
                 "advantages": jnp.asarray(adv), "tokens": jnp.asarray(out["tokens"]),
                 "mask": jnp.asarray(out["mask"])}
        n = out["latents"].shape[0]
        for j in steps:
            g = grad(tr.trainable, batch, jnp.full((n, 1), j, jnp.int32))
            grads[int(j)].append(np.concatenate([np.asarray(x).ravel()
                                                 for x in jax.tree.leaves(g)]))
    return grads, spread


def summarize(grads: dict) -> list[tuple[int, float, float]]:
    """Per step: ``(step, energy share, mean cross-batch cosine)``."""
    import numpy as np
    energy = {j: np.mean([float(g @ g) for g in gs]) for j, gs in grads.items()}
    total = sum(energy.values())
    rows = []
    for j, gs in grads.items():
        cos = [float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))
               for a, b in itertools.combinations(gs, 2)]
        rows.append((j, energy[j] / total, float(np.mean(cos))))
    return rows


def update_cosine(grads: dict, weights) -> float:
    """Mean cross-batch cosine of the whole update's gradient, ``sum_j weights[j] g_j``: how much
    of one iteration's update direction another iteration's agrees with."""
    import numpy as np
    n = len(next(iter(grads.values())))
    upd = [sum(weights[j] * gs[b] for j, gs in grads.items()) for b in range(n)]
    return float(np.mean([a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)
                          for a, b in itertools.combinations(upd, 2)]))


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This study's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_integer("batches", 6, "Independent iteration batches at the base.", **fv)
    flags.DEFINE_integer("prompts", 8, "Prompts per batch (x rl.group_size rollouts).", **fv)
    flags.DEFINE_string("patches", "1,2,4", "noise_patch values to compare.", **fv)
    flags.DEFINE_enum("window", "all", ["all", "config"], "SDE steps: all 10, or the config's "
                      "sampler.sde_window (0, -2).", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    programs.emulate_devices(12, cpu=False)
    from spotlight_jax.config import load_config
    from spotlight_jax.rl import grpo
    from spotlight_jax.runner import base_model, build_run

    for p in (int(x) for x in FLAGS.patches.split(",")):
        over = {"mode": "baseline", "rl.objective": "flow_grpo",
                "rl.prompts_per_iter": FLAGS.prompts, "sampler.noise_patch": p}
        if FLAGS.window == "all":
            over["sampler.sde_window"] = None
        config = load_config("tiny", over)
        with tempfile.TemporaryDirectory() as wd:
            spec = RunSpec.from_config(config)
            graphdef, base, _ = base_model.load_or_pretrain_base(spec, wd, progress=False)
            run = build_run(spec, wd, graphdef, base)
            grads, spread = step_gradients(run, FLAGS.batches)
            sampler = run.trainer.sampler
            run.close()
        print(f"\nnoise_patch={p}: {FLAGS.batches} batches of {FLAGS.prompts} prompts x "
              f"{config.rl.group_size} rollouts, within-group reward std "
              f"{sum(spread) / len(spread):.3f}")
        print("step  energy share  cross-batch cos")
        for j, share, cos in summarize(grads):
            print(f"{j:4d}  {share:12.3f}  {cos:+15.4f}")
        for kind in grpo.STEP_WEIGHTS:
            print(f"whole update, rl.step_weight={kind!r}: cross-batch cos "
                  f"{update_cosine(grads, grpo.step_weights(sampler, kind)):+.4f}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
