"""The runner's settings (:class:`RunSettings`) and the whole config's validation.

:func:`validate` builds every section of a config and checks what needs the devices present
(:func:`check_devices`); the command line calls it before any work.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import re

from spotlight_jax import rewards
from spotlight_jax.config.builders import prompt_source
from spotlight_jax.config.loading import ConfigError, build_section, pick_fields, section_paths
from spotlight_jax.config.sections import (
    REMOTE_REWARD,
    _grpo_config,
    _nft_config,
    _sde_sampler_config,
    check_reward_sources,
    cost_config,
    cpu_device_count,
    deployment_config,
    eval_reward,
    learned_rewards_config,
    mesh_config,
    mode_spec,
    model_config,
    objective,
    pretrain_config,
    process_config,
    remote_reward_config,
    sampler_config,
    spot_slice,
    trace_config,
    train_reward,
    workload,
)
from spotlight_jax.emulation import TraceConfig
from spotlight_jax.explore.planner import PlannerConfig
from spotlight_jax.io.metrics import WANDB_MODES
from spotlight_jax.models import MMDiTConfig
from spotlight_jax.models.mmdit import as_dtype
from spotlight_jax.parallel import resolve_kernel
from spotlight_jax.rewards.learned import NEEDS as LEARNED_NEEDS


def _check_run_settings(s) -> None:
    """One-line ConfigErrors for the runner's settings (:func:`run_settings`)."""
    def bad(path, value, why):
        raise ConfigError(f"{path}={value!r}: {why}")

    mode_spec(s.mode)
    if s.seed < 0:
        bad("seed", s.seed, "must be >= 0")
    for path, v in (("rl.iterations", s.iterations), ("rl.eval_every", s.eval_every),
                    ("trainer_devices", s.trainer_devices)):
        if v < 0:
            bad(path, v, "must be >= 0")
    if not (math.isfinite(s.max_minutes) and s.max_minutes >= 0):
        bad("rl.max_minutes", s.max_minutes, "must be >= 0 (0 = no time budget)")
    for path, v in (("rl.prompts_per_iter", s.prompts_per_iter),
                    ("rl.eval_prompts", s.eval_prompts), ("rl.eval_seeds", s.eval_seeds),
                    ("checkpoint.every", s.checkpoint_every),
                    ("checkpoint.max_to_keep", s.max_to_keep)):
        if v < 1:
            bad(path, v, "must be >= 1")
    if s.group_size < 2:
        bad("rl.group_size", s.group_size, "must be >= 2 (advantages compare a group's rollouts)")
    known = rewards.names() + ([] if REMOTE_REWARD in rewards.names() else
                               [f"{REMOTE_REWARD} (a reward server: remote_reward.url)"])
    known += [f"{n} (learned: learned_rewards)" for n in LEARNED_NEEDS
              if n not in rewards.names()]
    # what a run builds before resolving it (config.builders.register_rewards)
    buildable = set(rewards.names()) | {REMOTE_REWARD, *LEARNED_NEEDS}
    for path, spec in (("rl.reward", s.reward), ("rl.eval_reward", s.eval_reward)):
        try:
            names = rewards.mix.names(spec)     # a plain name, or a weighted mix of rewards
        except ValueError as e:
            bad(path, spec, str(e))
        for name in names:
            if name not in buildable:
                bad(path, spec, f"unknown reward {name!r}; registered rewards: "
                    f"{', '.join(known)}" + (" ('' = rl.reward)" if path == "rl.eval_reward"
                                             else ""))
    if s.wandb not in WANDB_MODES:
        bad("logging.wandb", s.wandb, f"choose one of {', '.join(WANDB_MODES)}")
    if not s.wandb_project or any(c in s.wandb_project for c in "/\\#?%:"):
        bad("logging.wandb_project", s.wandb_project,
            "a W&B project name: non-empty, without / \\ # ? % :")
    if s.wandb != "off" and importlib.util.find_spec("wandb") is None:
        bad("logging.wandb", s.wandb, "needs the optional wandb package: pip install -e "
            "'.[wandb]' (or --config.logging.wandb=off)")
    e = s.explore
    build_section(section_paths("explore", PlannerConfig),
           lambda: PlannerConfig(group_size=s.group_size, algorithm=e.algorithm,
                                 max_extra_per_prompt=e.max_extra_per_prompt, seed=s.seed))
    if e.sync_extra_per_prompt < 0:
        bad("explore.sync_extra_per_prompt", e.sync_extra_per_prompt, "must be >= 0")
    if not 0.0 <= e.budget_frac <= 1.0:
        bad("explore.budget_frac", e.budget_frac, "must be in [0, 1] (a share of the spot time)")
    if s.transport not in ("emulated", "ray"):
        bad("deployment.transport", s.transport, "choose 'emulated' or 'ray'")
    if s.transport == "ray" and importlib.util.find_spec("ray") is None:
        bad("deployment.transport", s.transport, "needs Ray: pip install -e '.[cluster]' (or "
            "--config.deployment.transport=emulated)")
    if s.ray_address and s.ray_address != "auto" and not re.fullmatch(
            r"(ray://)?[\w.\-]+:\d+", s.ray_address):
        bad("deployment.ray_address", s.ray_address, "give HOST:PORT of the Ray head (or "
            "ray://HOST:PORT, 'auto'; '' = RAY_ADDRESS, else a local instance)")
    if not (math.isfinite(s.ray_host_wait_s) and s.ray_host_wait_s >= 0):
        bad("deployment.ray_host_wait_s", s.ray_host_wait_s, "must be >= 0 seconds (0 = a "
            "phase never waits for hosts still starting)")
    if s.rollout_on_groups not in ("auto", "true", "false", True, False):
        bad("deployment.rollout_on_groups", s.rollout_on_groups, "choose 'auto', 'true' or "
            "'false'")
    if not 0.0 < s.target_frac <= 1.0:
        bad("compare.target_frac", s.target_frac, "must be in (0, 1] (e.g. "
            "--config.compare.target_frac=0.8)")
    if not (math.isfinite(s.target_gain) and s.target_gain >= 0):
        bad("compare.target_gain", s.target_gain, "must be >= 0 (0 = use compare.target_frac; "
            "e.g. --config.compare.target_gain=0.08)")
    seeds = s.compare_seeds
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds) \
            or len(set(seeds)) != len(seeds):
        bad("compare.seeds", seeds, "must be distinct integers >= 0 (e.g. "
            "--config.compare.seeds='(0,1,2)'; () = config.seed alone)")


def validate(config, devices=None) -> None:
    """Builds every section's frozen dataclass of ``config`` and, given ``devices`` (the
    devices this process will run on), checks what needs them (:func:`check_devices`). Raises
    :class:`ConfigError` naming the first bad field, its value and the fix; returns None for a
    config that can run."""
    process_config(config)
    deploy = deployment_config(config)
    _check_run_settings(build_section({}, lambda: run_settings(config)))
    model_config(config)
    mesh_config(config)
    _sde_sampler_config(config)       # the SDE fields, whichever objective trains
    sampler_config(config)
    sampler_config(config, evaluation=True)
    _grpo_config(config)              # both objectives' fields: a typo in either is caught
    _nft_config(config)
    _check_minibatches(config)
    pretrain_config(config)
    remote_reward_config(config)
    learned_rewards_config(config)
    check_reward_sources(config)      # a remote or learned reward with nowhere to come from
    if (config.prompts.embeddings_file or config.prompts.train_kinds
            or model_config(config).text_width):
        prompt_source(config)         # a missing or mismatched file (a real config without
        #                               one still validates: its dry run needs no prompts)
    trace = trace_config(config)
    if trace.paths:                   # missing files and a start past the trace's end
        build_section(section_paths("trace", TraceConfig),
                      lambda: trace.load(deploy.spot_nodes, 3600.0))
    cost_config(config)
    spot_slice(config)                # a TPU's spot slices against its device and cloud
    workload(config)
    if devices is not None:
        check_devices(config, devices)


def _check_minibatches(config) -> None:
    """A ConfigError when an iteration's batch (``rl.prompts_per_iter x rl.group_size``) does
    not split into the training objective's minibatches (its update would fail at the first
    step)."""
    nft = objective(config) == "nft"
    path = "rl.nft.minibatches" if nft else "rl.minibatches"
    mb = int(config.rl.nft.minibatches if nft else config.rl.minibatches)
    n = int(config.rl.prompts_per_iter) * int(config.rl.group_size)
    if mb < 1 or n % mb:
        fits = max(d for d in range(1, n + 1) if n % d == 0 and d <= max(mb, 1))
        raise ConfigError(f"{path}={mb}: the batch of {n} samples (rl.prompts_per_iter x "
                          f"rl.group_size) does not split into it; choose a divisor of {n} "
                          f"(e.g. {fits})")


def check_devices(config, devices) -> None:
    """ConfigErrors for what ``devices`` (this process's) cannot hold: more trainer devices
    than are present, or a mesh the trainer's devices cannot form."""
    devices_fit(int(config.trainer_devices), cpu_device_count(config), mesh_config(config),
                devices)
    kernel_fits(config.get("attention_impl", "auto"), model_config(config), devices)


def kernel_fits(impl: str, model: MMDiTConfig, devices) -> None:
    """A ConfigError when the forced attention kernel ``impl`` cannot run ``model`` on
    ``devices`` (``parallel.kernels``: cuDNN needs NVIDIA GPUs, bf16/fp16, its head dims;
    splash needs TPUs)."""
    try:
        resolve_kernel(impl, as_dtype(model.dtype), model.head_dim, list(devices))
    except ValueError as e:
        raise ConfigError(str(e).replace("attention_impl=", "--config.attention_impl=")) \
            from None


def devices_fit(want: int, emulated: int, mesh, devices) -> None:
    """:func:`check_devices` of ``trainer_devices``, the emulated CPU device count and the
    mesh section."""
    devices = list(devices)
    if want > len(devices):
        where = f" (num_cpu_devices={emulated} emulated CPU devices)" if emulated else ""
        raise ConfigError(f"trainer_devices={want}: only {len(devices)} devices are "
                          f"present{where}; set --config.trainer_devices to at most "
                          f"{len(devices)} (0 = all)")
    n = want or len(devices)
    try:
        mesh.resolve(n)
    except ValueError as e:
        raise ConfigError(f"mesh.data={mesh.data}, mesh.fsdp={mesh.fsdp}, mesh.sp={mesh.sp}: "
                          f"cannot be formed from the trainer's {n} device(s) ({e}); change "
                          "--config.mesh.* (one axis -1 takes the devices left) or "
                          "--config.trainer_devices") from e


# -- the runner's settings ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ExploreSettings:
    """How the runner explores seeds (``explore.*``)."""
    algorithm: str = "ucb"
    max_extra_per_prompt: int = 24
    sync_extra_per_prompt: int = 8
    cluster_by_kind: bool = True
    budget_frac: float = 1.0


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything the runner reads from a config besides what the spec builds (models,
    samplers, trainer, deployment): the mode, the loop's cadence and budget, evaluation,
    checkpointing, exploration and where rollouts run."""
    mode: str
    objective: str
    seed: int
    iterations: int
    max_minutes: float
    prompts_per_iter: int
    group_size: int
    reward: str
    eval_reward: str
    eval_every: int
    eval_prompts: int
    eval_seeds: int
    checkpoint_every: int
    max_to_keep: int
    trainer_devices: int
    explore: ExploreSettings
    transport: str              # 'emulated' | 'ray'
    shared_update: str          # deployment.shared_update: 'off' | 'fixed' | 'auto' | 'payoff'
    fleet: bool
    scheduler: bool
    rollout_on_groups: str | bool
    ray_spot_resource: str
    ray_explore_deadline: bool
    ray_address: str
    ray_host_wait_s: float
    spot_regroup_precompile: bool   # a Ray host compiles its fallback groups in the background
    target_frac: float          # compare mode's target share of the baseline's gain
    target_gain: float = 0.0    # > 0: compare mode's target is the baseline's start + this
    compare_seeds: tuple = ()   # compare mode: one comparison per config seed (() = seed)
    wandb: str = "off"          # 'off' | 'offline' | 'online' (logging.wandb)
    wandb_project: str = "spotlight_jax"


def run_settings(config) -> RunSettings:
    """The runner's settings (parsed; the rewards they name are resolved when the run is
    built, ``config.builders.register_rewards``)."""
    r, d = config.rl, config.deployment
    return RunSettings(
        mode=config.mode, objective=objective(config), seed=int(config.seed),
        iterations=int(r.iterations), max_minutes=float(r.max_minutes),
        prompts_per_iter=int(r.prompts_per_iter), group_size=int(r.group_size),
        reward=train_reward(config), eval_reward=eval_reward(config), eval_every=int(r.eval_every),
        eval_prompts=int(r.eval_prompts), eval_seeds=int(r.eval_seeds),
        checkpoint_every=int(config.checkpoint.every),
        max_to_keep=int(config.checkpoint.max_to_keep),
        trainer_devices=int(config.trainer_devices),
        explore=pick_fields(ExploreSettings, config.explore),
        transport=d.transport, shared_update=str(d.get("shared_update", "off")),
        fleet=bool(d.fleet), scheduler=bool(d.scheduler),
        rollout_on_groups=d.rollout_on_groups, ray_spot_resource=d.ray_spot_resource,
        ray_explore_deadline=bool(d.ray_explore_deadline), ray_address=str(d.ray_address),
        ray_host_wait_s=float(d.ray_host_wait_s),
        spot_regroup_precompile=bool(d.spot_regroup_precompile),
        target_frac=float(config.compare.target_frac),
        target_gain=float(config.compare.target_gain),
        compare_seeds=tuple(config.compare.seeds or ()),
        wandb=str(config.logging.wandb), wandb_project=str(config.logging.wandb_project))
