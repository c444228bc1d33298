"""A run built in one place: :func:`build_run` turns a ``RunSpec`` and a base model into the
:class:`~spotlight_jax.runner.state.RunState` the loop steps on.

Everything a run needs is made here, once, in dependency order: the trainer's mesh and the base
placed on it, the objective's trainer, the rewards resolved by name (``rewards.resolve``: the
training and held-out rewards every caller then receives as objects), the samplers and the
prompt source, the rollout engine, the emulated deployment and the planner, the transports the
mode's phases use (which rollout backend the spot devices get is decided here), and the mode.
The loop (``runner.loop.run``) and everything it calls take the built state and never go back
to the config or the reward registry.
"""
from __future__ import annotations

import jax
import numpy as np
from absl import logging

from spotlight_jax import registry, rewards, world
from spotlight_jax.config import RunSpec
from spotlight_jax.diffusion import Sampler
from spotlight_jax.diffusion.engine import RolloutEngine
from spotlight_jax.emulation import utilization
from spotlight_jax.explore.explorer import LocalExplorer
from spotlight_jax.explore.planner import Planner, PlannerConfig
from spotlight_jax.io.metrics import MetricWriter
from spotlight_jax.parallel.sharding import shard_state
from spotlight_jax.runner.backends.ray_fleet import RayFleet
from spotlight_jax.runner.backends.ray_rollouts import RayRollouts
from spotlight_jax.runner.backends.ray_shards import RayShards
from spotlight_jax.runner.backends.rollouts import DirectRollouts, rollout_on_groups
from spotlight_jax.runner.backends.scheduled import ScheduledRollouts
from spotlight_jax.runner.hooks import Hooks
from spotlight_jax.runner.loop import run
from spotlight_jax.runner.modes import make_mode
from spotlight_jax.runner.outputs import attention_kernel
from spotlight_jax.runner.shared_update import SharedUpdate
from spotlight_jax.runner.state import RunState


def eval_prompts(val: list[str], n: int) -> list[str]:
    """The held-out prompts: the same ``n`` of the validation pool ``val`` for every run and
    evaluation."""
    rng = np.random.default_rng(1234)
    return [val[i] for i in sorted(rng.choice(len(val), min(n, len(val)), replace=False))]


def prompt_kind(prompt: str) -> str:
    """The planner's prompt cluster: the synthetic world's prompt kind, a video prompt's motion
    (``video_left``, ...), or one cluster ('other') for prompts outside both grammars (a real
    model's prompt file)."""
    try:
        return world.grammar.kind_of(prompt)
    except ValueError:
        pass
    try:
        return f"video_{world.video.parse_video(prompt).direction}"
    except ValueError:
        return "other"


def resolve_rewards(spec: RunSpec, trainer):
    """The run's training and held-out rewards, resolved once (an unknown name fails here, not
    at evaluation 0) after those that need building are registered (a reward server's client,
    learned rewards); a training reward without the parts the advantages need fails too."""
    spec.register_rewards()
    reward = rewards.resolve(spec.settings.reward)
    eval_reward = rewards.resolve(spec.settings.eval_reward)
    if trainer.work.needs_reward_parts and not reward.is_mix:
        reward.components()
    return reward, eval_reward


def build_run(spec: RunSpec, workdir: str, graphdef, base, devices=None,
              trainer=None) -> RunState:
    """The state of the run ``spec`` in ``workdir`` over the base ``(graphdef, base)``.

    ``devices``: the trainer's devices (default: ``trainer_devices`` of this process's, 0 =
    all); the mesh comes from ``spec.mesh``. ``trainer``: a multi-process trainer job's
    ``TrainerJob``, whose update runs on its own mesh while this one holds the sampling weights.
    """
    if not isinstance(spec, RunSpec):
        raise TypeError(f"build_run takes a RunSpec (RunSpec.from_config(config)), not "
                        f"{type(spec).__name__}")
    st = spec.settings
    mesh = spec.build_mesh(devices if devices is not None else spec.trainer_devices())
    base = shard_state(base, mesh)
    # MFU's denominator: one device's peak (datasheet, or a measured matmul on a CPU) x the
    # devices the update runs on (a trainer job's: its own mesh)
    update_devices = int((mesh if trainer is None else trainer.mesh).devices.size)
    trainer = trainer if trainer is not None else spec.make_trainer(graphdef, base, mesh=mesh)
    peak_flops, peak_source = utilization.device_peak(mesh.devices.flat[0])
    logging.info("MFU against %.4g TFLOP/s per device (%s) x %d update device(s)",
                 peak_flops / 1e12, peak_source, update_devices)
    reward, eval_reward = resolve_rewards(spec, trainer)
    mcfg = spec.model
    image_shape = mcfg.latent_shape
    # a latent model's VAE (None for pixels) and the attention layout on the trainer's mesh
    decoder, attn = spec.image_decoder(), spec.attention_spec(mesh)
    kernel = attention_kernel(attn, mcfg)
    logging.info("attention: %s kernel, %s (attention_impl=%r)%s", kernel["kernel"],
                 kernel["strategy"], kernel["requested"],
                 f"; not cuDNN: {kernel['not_cudnn']}" if kernel.get("not_cudnn") else "")
    sampler = Sampler(graphdef, image_shape, spec.sampler, attn, mesh=mesh, decoder=decoder)
    eval_sampler = Sampler(graphdef, image_shape, spec.eval_sampler, attn, mesh=mesh,
                           decoder=decoder)
    # the prompts and their model inputs: the world's tokenizer or an embedding file
    source = spec.prompt_source()
    if not source.val_prompts:
        raise ValueError(f"prompts.embeddings_file={spec.embeddings_file!r}: has no held-out "
                         "prompts (split 'val') to evaluate on; re-run python -m "
                         "spotlight_jax.tools.encode_prompts with --val_prompts")
    engine = RolloutEngine(sampler, mcfg.text_len, reward, chunk=max(st.group_size, 32),
                           tokenize=source.tokenize)
    deploy = spec.make_deployment()
    state = RunState(
        spec=spec, settings=st, workdir=workdir, devices=list(jax.local_devices()), mesh=mesh,
        base_state=base, graphdef=graphdef, mcfg=mcfg, train_sampler_cfg=spec.sampler,
        image_shape=image_shape, trainer=trainer, peak_flops=peak_flops,
        update_devices=update_devices, reward=reward, eval_reward=eval_reward, decoder=decoder,
        attn=attn, sampler=sampler, eval_sampler=eval_sampler, prompt_source=source,
        train_prompts=source.train_prompts,
        val_prompts=eval_prompts(source.val_prompts, st.eval_prompts), engine=engine,
        explorer=LocalExplorer(engine), deploy=deploy,
        shared_update=SharedUpdate(deploy, trainer.work.shard_units),
        planner=Planner(PlannerConfig(group_size=st.group_size, algorithm=st.explore.algorithm,
                                      max_extra_per_prompt=st.explore.max_extra_per_prompt,
                                      seed=st.seed),
                        key_fn=prompt_kind if st.explore.cluster_by_kind else None),
        writer=MetricWriter(workdir, "rl", wandb=st.wandb, wandb_project=st.wandb_project,
                            run_config=spec.plain()),
        key=jax.random.key(st.seed))
    attach_transports(state)
    state.mode = make_mode(st.mode, state, base)
    return state


def attach_transports(state: RunState) -> None:
    """The transports of ``state``'s phases: direct rollouts on the trainer's devices, the Ray
    fleet (``transport='ray'``) and its gradient shards (a shared update over Ray), and the
    rollout backend with spot devices: Ray spot hosts, the pull scheduler's emulated pool when
    the devices hold it (one per spot node plus one on-demand; the emulated devices carry group
    identities), else direct rollouts with the same time accounting."""
    st = state.settings
    state.direct = DirectRollouts(state)
    if st.transport == "ray":
        state.ray_fleet = RayFleet(state)
        if state.shared_update.enabled:      # the hosts compute their share of the shards
            state.ray_shards = RayShards(state.ray_fleet)
        state.spot_rollouts = RayRollouts(state)
        return
    need = 1 + state.deploy.cfg.spot_nodes
    if st.scheduler and len(state.devices) >= need:
        state.spot_rollouts = ScheduledRollouts(state, rollout_on_groups(st.rollout_on_groups))
        return
    if st.scheduler and registry.mode_spec(st.mode).uses_spot:
        logging.warning("deployment.scheduler: %d device(s) cannot hold the scheduler's pool "
                        "(%d needed: one on-demand and one per spot node); rollouts run "
                        "directly with the same emulated-time accounting",
                        len(state.devices), need)
    state.spot_rollouts = DirectRollouts(state, use_spot=True)


def build_and_run(spec: RunSpec, workdir: str, graphdef, base, *, devices=None, trainer=None,
                  base_source: str = "", progress: bool = True,
                  hooks: Hooks | None = None) -> list[dict]:
    """:func:`build_run`, then the loop (``runner.loop.run``) over it; returns the history."""
    return run(build_run(spec, workdir, graphdef, base, devices, trainer),
               base_source=base_source, progress=progress, hooks=hooks)
