"""The controller: runs post-training iterations for every mode on top of the library layers.

Modes (contract, ``config.mode``): ``flow_grpo`` (random seeds, on-demand devices only),
``explore_sync``, ``spot_rollout``, ``spotlight``. One iteration of ``flow_grpo``:

  prompts P_k and seeds (pure functions of (run seed, k))
  -> rollouts with the current policy (chunked; rewards of chunk i run in a thread pool while
     chunk i+1 samples) -> GRPO advantages -> GRPO update -> periodic held-out evaluation
     (ODE sampler, fixed seeds) -> periodic checkpoint of the full state.

Everything random is a function of (config.seed, iteration), and the full state (policy,
optimizer, EMA, iteration, history) is checkpointed, so a resumed run repeats the same numbers.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np
from absl import logging
from tqdm.auto import tqdm

from spotlight_jax import world
from spotlight_jax.builders import build_mesh, model_config, sampler_config
from spotlight_jax.checkpoint import RunCheckpointer
from spotlight_jax.diffusion import Sampler
from spotlight_jax.evaluate import evaluate
from spotlight_jax.explore.explorer import RolloutEngine
from spotlight_jax.metrics import MetricWriter
from spotlight_jax.plots import plot_curves, save_grid
from spotlight_jax.rl import GRPOConfig, GRPOTrainer, advantages

MODES = ("flow_grpo", "explore_sync", "spot_rollout", "spotlight")


def grpo_config(config) -> GRPOConfig:
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    return GRPOConfig(**{k: v for k, v in dict(config.rl).items() if k in names})


def iteration_prompts(prompts, k: int, n: int, seed: int):
    """The ``n`` training prompts of iteration ``k`` (a pure function of (seed, k))."""
    rng = np.random.default_rng([seed, k, 17])
    return [prompts[i] for i in rng.choice(len(prompts), n, replace=False)]


def random_seeds(k: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, k, 23])
    return rng.integers(0, 2**31 - 1, size=n, dtype=np.int64).astype(np.uint32)


class Run:
    """State and helpers of one post-training run in ``workdir``."""

    def __init__(self, config, workdir, graphdef, base, devices=None):
        if config.mode not in MODES:
            raise ValueError(f"unknown mode {config.mode!r}; choose one of {MODES}")
        self.config, self.workdir = config, workdir
        # The trainer's mesh: parameters placed by the rule table, batches split over data/fsdp.
        self.mesh = build_mesh(config, devices)
        base = shard_state(base, self.mesh)
        self.mcfg = model_config(config)
        self.rl = grpo_config(config)
        self.train_sampler_cfg = sampler_config(config)
        image_shape = (self.mcfg.image_size,) * 2 + (self.mcfg.channels,)
        self.graphdef = graphdef
        self.trainer = GRPOTrainer(graphdef, base, self.rl, self.train_sampler_cfg,
                                   mesh=self.mesh)
        self.sampler = Sampler(graphdef, image_shape, self.train_sampler_cfg, mesh=self.mesh)
        self.eval_sampler = Sampler(graphdef, image_shape, sampler_config(config, evaluation=True),
                                    mesh=self.mesh)
        wcfg = world.WorldConfig(image_size=self.mcfg.image_size)
        self.train_prompts = world.train_prompts(wcfg)
        val = world.val_prompts(wcfg)
        rng = np.random.default_rng(1234)
        n_eval = min(config.rl.eval_prompts, len(val))
        self.val_prompts = [val[i] for i in sorted(rng.choice(len(val), n_eval, replace=False))]
        self.engine = RolloutEngine(self.sampler, self.mcfg.text_len, config.rl.reward,
                                    chunk=max(config.rl.group_size, 32))
        self.writer = MetricWriter(workdir, "rl")
        self.ckpt = RunCheckpointer(os.path.join(workdir, "checkpoints"),
                                    config.checkpoint.max_to_keep)
        self.key = jax.random.key(config.seed)
        self.iteration = 0
        self.history: list[dict] = []

    # -- checkpointing -------------------------------------------------------------------------
    def _tree(self):
        return {"trainable": self.trainer.trainable, "opt_state": self.trainer.opt_state,
                "ema": self.trainer.ema if self.trainer.ema is not None else {}}

    def save(self):
        self.ckpt.save(self.iteration, self._tree(),
                       {"iteration": self.iteration, "history": self.history,
                        "mode": self.config.mode})

    def maybe_restore(self) -> bool:
        got = self.ckpt.restore(self._tree())
        if got is None:
            return False
        step, tree, meta = got
        self.trainer.trainable, self.trainer.opt_state = tree["trainable"], tree["opt_state"]
        if self.trainer.ema is not None:
            self.trainer.ema = tree["ema"]
        self.iteration, self.history = int(meta["iteration"]), list(meta["history"])
        logging.info("resumed from iteration %d in %s", step, self.ckpt.directory)
        return True

    # -- one iteration -------------------------------------------------------------------------
    def rollout_batch(self, k: int):
        c = self.config
        prompts = iteration_prompts(self.train_prompts, k, c.rl.prompts_per_iter, c.seed)
        flat = [p for p in prompts for _ in range(c.rl.group_size)]
        seeds = random_seeds(k, len(flat), c.seed)
        batch = self.engine.run(self.trainer.policy_state(), flat, seeds)
        batch["prompt_ids"] = np.repeat(np.arange(len(prompts)), c.rl.group_size)
        batch["seeds"] = seeds
        return batch, flat

    def train_on(self, batch, k: int) -> dict:
        adv = advantages(batch["rewards"], batch["prompt_ids"], global_std=self.rl.global_std,
                         clip=self.rl.adv_clip)
        train = {"latents": batch["latents"], "log_probs": batch["log_probs"],
                 "advantages": adv, "tokens": batch["tokens"], "mask": batch["mask"]}
        return self.trainer.update(train, self.key, k)

    def evaluate(self, k: int) -> dict:
        c = self.config
        res, images, _ = evaluate(self.eval_sampler, self.trainer.eval_state(), self.val_prompts,
                                  num_seeds=c.rl.eval_seeds, text_len=self.mcfg.text_len,
                                  reward=c.rl.reward)
        os.makedirs(os.path.join(self.workdir, "samples"), exist_ok=True)
        # one image per validation prompt (first seed), same prompts every time
        save_grid(os.path.join(self.workdir, "samples", f"val_{k:05d}.png"),
                  images[::c.rl.eval_seeds][:32], cols=8)
        return res

    def plot(self):
        evals = [h for h in self.history if "val_reward" in h]
        if not evals:
            return
        x = [h["iteration"] for h in evals]
        series = {"held-out (ODE)": (x, [h["val_reward"] for h in evals])}
        trains = [h for h in self.history if "reward_mean" in h]
        if trains:
            series["train rollouts (SDE)"] = ([h["iteration"] for h in trains],
                                              [h["reward_mean"] for h in trains])
        plot_curves(os.path.join(self.workdir, "reward_curve.png"), series,
                    title=f"{self.config.mode}: {self.config.rl.reward}")


def shard_state(state, mesh):
    """Places an NNX state on ``mesh`` following the logical-axis rule table."""
    from flax import nnx  # noqa: PLC0415
    from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415

    from spotlight_jax.parallel.sharding import param_specs  # noqa: PLC0415

    specs = param_specs(state, mesh)
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    leaves, treedef = jax.tree.flatten(nnx.to_pure_dict(state))
    placed = [jax.device_put(a, NamedSharding(mesh, sp)) for a, sp in zip(leaves, flat_specs)]
    out = jax.tree.map(lambda x: x, state)
    nnx.replace_by_pure_dict(out, jax.tree.unflatten(treedef, placed))
    return out


def run(config, workdir: str, graphdef, base, *, base_source: str = "", progress: bool = True,
        devices=None):
    """Runs ``config.rl.iterations`` post-training iterations; returns the history list.

    ``devices``: the trainer's devices (default: all); the mesh comes from ``config.mesh``.
    """
    if config.mode != "flow_grpo":
        raise NotImplementedError(
            f"mode {config.mode!r} is not available yet in this version; use "
            "--config.mode=flow_grpo")
    r = Run(config, workdir, graphdef, base, devices)
    r.maybe_restore()
    c = config
    if r.iteration == 0 and not r.history:
        res = r.evaluate(0)
        r.history.append({"iteration": 0, **{f"val_{k}": v for k, v in res.items()}})
        r.writer.write(0, **{f"val/{k}": v for k, v in res.items()})
    bar = tqdm(range(r.iteration, c.rl.iterations), initial=r.iteration, total=c.rl.iterations,
               desc=c.mode, disable=not progress, dynamic_ncols=True)
    for k in bar:
        t0 = time.time()
        batch, _ = r.rollout_batch(k)
        t1 = time.time()
        m = r.train_on(batch, k)
        t2 = time.time()
        row = {"iteration": k + 1, "reward_mean": float(batch["rewards"].mean()),
               "reward_std": float(batch["rewards"].std()), **m,
               "time_rollout": t1 - t0, "time_train": t2 - t1}
        r.iteration = k + 1
        if c.rl.eval_every and (r.iteration % c.rl.eval_every == 0
                                or r.iteration == c.rl.iterations):
            res = r.evaluate(r.iteration)
            row.update({f"val_{kk}": v for kk, v in res.items()})
        r.history.append(row)
        r.writer.write(r.iteration, **{k2: v for k2, v in row.items() if k2 != "iteration"})
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", kl=f"{m['kl']:.2e}")
        if r.iteration % c.checkpoint.every == 0 or r.iteration == c.rl.iterations:
            r.save()
            r.plot()
    r.ckpt.close()
    r.writer.close()
    return r.history
