"""The state of one post-training run: what every mode steps on.

A :class:`RunState` holds the trainer's mesh, the samplers, the objective's trainer, the rollout
engine and explorer, the emulated deployment, the planner, the checkpointer and metric writer,
and the mode object (``spotlight_jax.runner.modes``) that defines an iteration. Everything random
is a function of (seed, iteration), and the full state (policy, optimizer, EMA, planner, next
seeds, clock, trace cursor, history) is checkpointed, so a resumed run repeats the same numbers.
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
from absl import logging

from spotlight_jax import rewards, world
from spotlight_jax.builders import (
    attention_spec,
    build_mesh,
    host_config,
    image_decoder,
    make_deployment,
    make_trainer,
    model_config,
    prompt_source,
    run_settings,
    sampler_config,
)
from spotlight_jax.checkpoint import RunCheckpointer
from spotlight_jax.diffusion import Sampler
from spotlight_jax.diffusion.engine import RolloutEngine
from spotlight_jax.evaluate import evaluate
from spotlight_jax.explore.explorer import LocalExplorer
from spotlight_jax.explore.planner import Planner, PlannerConfig
from spotlight_jax.metrics import MetricWriter
from spotlight_jax.parallel.sharding import shard_state
from spotlight_jax.plots import plot_curves, save_grid
from spotlight_jax.rewards import get_components
from spotlight_jax.rl import lora_export
from spotlight_jax.runner.modes import MODES, make_mode
from spotlight_jax.runner.ray_fleet import RayFleet
from spotlight_jax.runner.rollouts import (
    DirectRollouts,
    RayRollouts,
    ScheduledRollouts,
    rollout_on_groups,
)


def iteration_prompts(prompts, k: int, n: int, seed: int):
    """The ``n`` training prompts of iteration ``k`` (a pure function of (seed, k))."""
    rng = np.random.default_rng([seed, k, 17])
    return [prompts[i] for i in rng.choice(len(prompts), n, replace=False)]


def eval_prompts(val: list[str], n: int) -> list[str]:
    """The held-out prompts: the same ``n`` of the validation pool ``val`` for every run and
    evaluation."""
    rng = np.random.default_rng(1234)
    return [val[i] for i in sorted(rng.choice(len(val), min(n, len(val)), replace=False))]


def prompt_kind(prompt: str) -> str:
    """The planner's prompt cluster: the synthetic world's prompt kind, or one cluster
    ('other') for prompts outside its grammar (a real model's prompt file)."""
    try:
        return world.grammar.kind_of(prompt)
    except ValueError:
        return "other"


class RunState:
    """State and helpers of one post-training run in ``workdir``.

    ``devices``: the trainer's devices (default: ``trainer_devices`` of this process's, 0 =
    all). ``trainer``: a multi-process trainer job's ``TrainerJob``, whose update runs on its own
    mesh while this one holds the sampling weights.
    """

    def __init__(self, config, workdir, graphdef, base, devices=None, trainer=None):
        self.settings = st = run_settings(config)
        self.workdir = workdir
        # This process's devices: the runner never places work on another process's devices
        # (in a multi-process trainer job only the trainer's collectives span them).
        self.devices = list(jax.local_devices())
        if devices is None and st.trainer_devices:
            devices = self.devices[:st.trainer_devices]
        self.mesh = build_mesh(config, devices if devices is not None else self.devices)
        base = shard_state(base, self.mesh)
        self.base_state = base                  # the frozen base (LoRA's reference policy)
        self.mcfg = model_config(config)
        self.train_sampler_cfg = sampler_config(config)
        self.image_shape = (self.mcfg.image_size,) * 2 + (self.mcfg.channels,)
        self.graphdef = graphdef
        self.trainer = (trainer if trainer is not None
                        else make_trainer(config, graphdef, base, mesh=self.mesh))
        self.reward_parts = self._reward_parts()
        # a latent model's VAE (None for pixels) and the attention layout on the trainer's mesh
        self.decoder = image_decoder(config)
        self.attn = attention_spec(config, self.mesh)
        self.sampler = Sampler(graphdef, self.image_shape, self.train_sampler_cfg, self.attn,
                               mesh=self.mesh, decoder=self.decoder)
        self.eval_sampler = Sampler(graphdef, self.image_shape,
                                    sampler_config(config, evaluation=True), self.attn,
                                    mesh=self.mesh, decoder=self.decoder)
        # the prompts and their model inputs: the world's tokenizer or an embedding file
        self.prompt_source = prompt_source(config)
        self.train_prompts = self.prompt_source.train_prompts
        if not self.prompt_source.val_prompts:
            raise ValueError(f"prompts.embeddings_file={config.prompts.embeddings_file!r}: has "
                             "no held-out prompts (split 'val') to evaluate on; re-run python "
                             "-m spotlight_jax.encode_prompts with --val_prompts")
        self.val_prompts = eval_prompts(self.prompt_source.val_prompts, st.eval_prompts)
        self.engine = RolloutEngine(self.sampler, self.mcfg.text_len, rewards.get(st.reward),
                                    chunk=max(st.group_size, 32),
                                    tokenize=self.prompt_source.tokenize)
        rewards.get(st.eval_reward)             # an unknown name fails here, not at eval 0
        self.explorer = LocalExplorer(self.engine)
        self.deploy = make_deployment(config)
        self.host_config = host_config(config) if st.transport == "ray" else None
        self.planner = Planner(PlannerConfig(group_size=st.group_size,
                                             algorithm=st.explore.algorithm,
                                             max_extra_per_prompt=st.explore.max_extra_per_prompt,
                                             seed=st.seed),
                               key_fn=prompt_kind if st.explore.cluster_by_kind else None)
        self.direct = DirectRollouts(self)
        self.ray_fleet = RayFleet(self) if st.transport == "ray" else None
        self.spot_rollouts = self._spot_rollouts()
        self.writer = MetricWriter(workdir, "rl")
        self.ckpt = RunCheckpointer(os.path.join(workdir, "checkpoints"), st.max_to_keep,
                                    this_process_only=jax.process_count() > 1)
        self.key = jax.random.key(st.seed)
        self.iteration = 0
        self.history: list[dict] = []
        self.next_seeds: list[list[int]] | None = None   # spotlight: S_{k+1}
        self.mode = make_mode(st.mode, self, base)

    def _reward_parts(self):
        """The reward's components, where the trainer's advantages need them (builders
        validated the choice)."""
        return get_components(self.settings.reward) if self.trainer.needs_reward_parts else None

    def _spot_rollouts(self):
        """The rollout backend with spot devices: Ray spot hosts (``transport='ray'``), the pull
        scheduler's emulated pool when the devices hold it (one per spot node plus one
        on-demand; the emulated devices carry group identities), else direct rollouts with the
        same time accounting."""
        st = self.settings
        if st.transport not in ("emulated", "ray"):
            raise ValueError(f"deployment.transport={st.transport!r}: choose 'emulated' or "
                             "'ray'")
        if st.transport == "ray":
            return RayRollouts(self)
        need = 1 + self.deploy.cfg.spot_nodes
        if st.scheduler and len(self.devices) >= need:
            return ScheduledRollouts(self, rollout_on_groups(st.rollout_on_groups))
        if st.scheduler and getattr(MODES.get(st.mode), "uses_spot", False):
            logging.warning("deployment.scheduler: %d device(s) cannot hold the scheduler's pool "
                            "(%d needed: one on-demand and one per spot node); rollouts run "
                            "directly with the same emulated-time accounting",
                            len(self.devices), need)
        return DirectRollouts(self, use_spot=True)

    @property
    def scheduler_on(self) -> bool:
        """Whether spot rollouts go through the pull scheduler's emulated pool."""
        return isinstance(self.spot_rollouts, ScheduledRollouts)

    # -- checkpointing -------------------------------------------------------------------------
    def _tree(self):
        parts = {p: getattr(self.trainer, p) for p in self.trainer.state_parts}
        return {p: {} if v is None else v for p, v in parts.items()}

    def _extra_path(self, step: int) -> str:
        return os.path.join(self.ckpt.directory, f"mode_{step}.npz")

    LORA_EXPORT = "lora_diffusers.safetensors"

    def export_lora(self, base_source: str = "") -> str | None:
        """Writes the evaluated policy's LoRA (the EMA's when kept) in the PEFT/diffusers format
        to ``workdir/lora_diffusers.safetensors`` (for ``pipeline.load_lora_weights``); None
        when the run fine-tunes every weight or its trainer lives in another process."""
        cfg = self.trainer.cfg
        lora = getattr(self.trainer, "ema", None) or getattr(self.trainer, "trainable", None)
        if not cfg.lora_rank or not isinstance(lora, dict) or jax.process_index() != 0:
            return None
        path = os.path.join(self.workdir, self.LORA_EXPORT)
        lora_export.export(jax.device_get(lora), cfg.lora_alpha / cfg.lora_rank, path,
                           rank=cfg.lora_rank, base=str(base_source))
        return path

    def save(self):
        # the mode's extra arrays go first: a checkpoint never exists without them
        extra = self.mode.extra_state()
        if extra is not None and jax.process_index() == 0:
            os.makedirs(self.ckpt.directory, exist_ok=True)
            tmp = self._extra_path(self.iteration) + ".tmp.npz"
            np.savez(tmp, **extra)
            os.replace(tmp, self._extra_path(self.iteration))
        self.ckpt.save(self.iteration, self._tree(), {
            "iteration": self.iteration, "history": self.history, "mode": self.settings.mode,
            "objective": self.settings.objective,
            "next_seeds": self.next_seeds, "planner": self.planner.state_dict(),
            "deployment": self.deploy.state_dict(), "mode_extra": extra is not None})
        keep = set(self.ckpt.steps(reload=False)) | {self.iteration}
        for name in os.listdir(self.ckpt.directory):
            if name.startswith("mode_") and name.endswith(".npz") \
                    and name[5:-4].isdigit() and int(name[5:-4]) not in keep:
                os.remove(os.path.join(self.ckpt.directory, name))

    def maybe_restore(self) -> bool:
        meta = self.ckpt.latest_meta()
        if meta is not None:
            # checkpoints from before rl.objective existed are Flow-GRPO runs
            saved, want = meta.get("objective", "flow_grpo"), self.settings.objective
            if saved != want:
                raise ValueError(
                    f"{self.ckpt.directory} holds a rl.objective={saved!r} run, this config "
                    f"trains rl.objective={want!r}; use another --workdir or "
                    f"--config.rl.objective={saved}")
        got = self.ckpt.restore(self._tree())
        if got is None:
            return False
        step, tree, meta = got
        for part in self.trainer.state_parts:
            if getattr(self.trainer, part) is not None:
                setattr(self.trainer, part, tree[part])
        self.iteration, self.history = int(meta["iteration"]), list(meta["history"])
        self.next_seeds = meta.get("next_seeds")
        if "planner" in meta:
            self.planner.load_state_dict(meta["planner"])
        if "deployment" in meta:
            self.deploy.load_state_dict(meta["deployment"])
            self.mode.sync(self)
        extra = None
        if meta.get("mode_extra"):
            path = self._extra_path(step)
            if not os.path.exists(path):
                raise RuntimeError(f"checkpoint {step} in {self.ckpt.directory} needs {path}, "
                                   "which is missing; restore it or move the directory away")
            with np.load(path) as f:
                extra = {key: f[key] for key in f.files}
        self.mode.load_extra_state(self, extra)
        logging.info("resumed from iteration %d in %s", step, self.ckpt.directory)
        return True

    # -- what every mode uses ------------------------------------------------------------------
    def step(self, k: int) -> dict:
        """Iteration ``k`` of the run's mode; returns its metrics row."""
        return self.mode.step(self, k)

    def prompts(self, k: int) -> list[str]:
        st = self.settings
        return iteration_prompts(self.train_prompts, k, st.prompts_per_iter, st.seed)

    def rollout(self, prompts, seeds_per_prompt) -> dict:
        """The batch of ``prompts`` x seeds on the trainer's devices (no time charged)."""
        return self.direct.rollout(self.iteration, prompts, seeds_per_prompt)[0]

    def train_on(self, batch, k: int, prompts, generator=None) -> dict:
        """The objective's update on ``batch`` (advantages computed here); ``generator``: the
        trainer's :meth:`generator` of the policy that sampled it, when that is not the current
        sampling policy."""
        parts = None
        if self.reward_parts is not None:
            parts = self.reward_parts(batch["images"], [prompts[i] for i in batch["prompt_ids"]])
        adv = self.trainer.advantages(batch["rewards"], batch["prompt_ids"], parts)
        train = {key: batch[key] for key in self.trainer.batch_keys}
        train["advantages"] = adv
        if generator is None:       # a trainer with the plain update(batch, key, step) serves
            return self.trainer.update(train, self.key, k)
        return self.trainer.update(train, self.key, k, generator=generator)

    def evaluate(self, k: int) -> dict:
        """Held-out reward with the evaluation state (ODE sampler, fixed prompts and seeds);
        saves the captioned sample grid ``samples/val_<k>.png``."""
        st = self.settings
        res, images, _ = evaluate(self.eval_sampler, self.trainer.eval_state(), self.val_prompts,
                                  num_seeds=st.eval_seeds, text_len=self.mcfg.text_len,
                                  reward=st.eval_reward, tokenize=self.prompt_source.tokenize)
        self.save_samples(k, images[::st.eval_seeds][:32], self.val_prompts[:32])
        return res

    def save_samples(self, k: int, images, prompts) -> None:
        """``samples/val_<k>.png``: one image per validation prompt (its first seed, the same
        prompts and seeds every time) captioned with its prompt and reward; from the second
        evaluation on also ``samples/before_after_<k>.png``: the first evaluation's image (the
        base) next to this one for each prompt."""
        folder = os.path.join(self.workdir, "samples")
        os.makedirs(folder, exist_ok=True)
        scores = np.asarray(rewards.get(self.settings.eval_reward)(images, prompts), np.float64)
        save_grid(os.path.join(folder, f"val_{k:05d}.png"), images, cols=8,
                  captions=[f"{p} [{r:.2f}]" for p, r in zip(prompts, scores)])
        first = os.path.join(folder, "val_first.npz")
        if not os.path.exists(first):
            np.savez(first, images=images, scores=scores, iteration=k)
            return
        with np.load(first) as f:
            before, was, k0 = f["images"], f["scores"], int(f["iteration"])
        n = min(16, len(before), len(images))
        pairs = np.stack([before[:n], images[:n]], 1).reshape(2 * n, *images.shape[1:])
        captions = [c for p, r0, r1 in zip(prompts[:n], was, scores)
                    for c in (f"{p} | it {k0}: {r0:.2f}", f"it {k}: {r1:.2f}")]
        save_grid(os.path.join(folder, f"before_after_{k:05d}.png"), pairs, cols=8,
                  captions=captions)

    def close(self):
        self.mode.close()
        self.spot_rollouts.close()
        if self.ray_fleet is not None:
            self.ray_fleet.close()

    def write_phases(self):
        """``phases.json``: the emulated clock's per-phase breakdown and the cost model's
        assumptions (read by the comparison report)."""
        info = {"phases": self.deploy.clock.breakdown(),
                "assumptions": [dataclasses.asdict(a) for a in self.deploy.assumptions()]}
        with open(os.path.join(self.workdir, "phases.json"), "w") as f:
            json.dump(info, f, indent=1, default=str)

    def plot(self):
        evals = [h for h in self.history if "val_reward" in h]
        if not evals:
            return
        x = [h["iteration"] for h in evals]
        series = {"held-out (ODE)": (x, [h["val_reward"] for h in evals])}
        trains = [h for h in self.history if "reward_mean" in h]
        if trains:
            label = f"train rollouts ({self.train_sampler_cfg.sde_type.upper()})"
            series[label] = ([h["iteration"] for h in trains], [h["reward_mean"] for h in trains])
        st = self.settings
        plot_curves(os.path.join(self.workdir, "reward_curve.png"), series,
                    title=f"{st.mode}: {st.reward} (held-out: {st.eval_reward})")
