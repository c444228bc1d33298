"""Config sections -> the frozen dataclasses the library takes, each validated: parsing only.

Every library module below takes its own small frozen dataclass, built here from its section
(``model_config``, ``mesh_config``, ``sampler_config``, ``rl_config``, ``deployment_config``,
``trace_config``, ``cost_config``, ``workload``, ...), and each of those dataclasses checks its
own values; a bad one becomes a one-line :class:`~spotlight_jax.config.loading.ConfigError`
naming the dotted field. :class:`~spotlight_jax.config.spec.RunSpec` calls these once per run.
Nothing here builds an object or changes global state (the reward registry included): what is
built from the parsed sections is ``config.builders``'s.
"""
from __future__ import annotations

import dataclasses
import functools
import os

from spotlight_jax import registry, rewards
from spotlight_jax.config.loading import (
    ConfigError,
    build_section,
    load_config,
    pick_fields,
    section_paths,
)
from spotlight_jax.diffusion import SamplerConfig
from spotlight_jax.emulation import (
    CostConfig,
    DeploymentConfig,
    TraceConfig,
    Workload,
)
from spotlight_jax.emulation.profile_file import load as load_profile
from spotlight_jax.emulation.slices import SliceShape
from spotlight_jax.models import Flux2Config, MMDiTConfig, WanConfig, ZImageConfig, convert
from spotlight_jax.models.factory import is_video
from spotlight_jax.parallel import IMPLEMENTATIONS, STRATEGIES, MeshConfig
from spotlight_jax.pretrain import PretrainConfig
from spotlight_jax.rewards import mix
from spotlight_jax.rewards.learned import NEEDS as LEARNED_NEEDS
from spotlight_jax.rewards.remote import RemoteRewardConfig
from spotlight_jax.rl import GRPOConfig, NFTConfig, work_of

# -- sections ---------------------------------------------------------------------------------

def diffusers_base(config) -> str | None:
    """The diffusers pipeline folder ``base_checkpoint`` names (one with
    ``transformer/config.json``), or None when the base is this project's own checkpoint."""
    path = config.base_checkpoint
    if path in ("auto", "none", "", None):
        return None
    return path if os.path.isfile(os.path.join(path, "transformer", "config.json")) else None


# What a run chooses for a diffusers base model; every other model field (the architecture)
# comes from the checkpoint's config.json.
RUN_MODEL_FIELDS = ("image_size", "text_len", "dtype", "param_dtype", "remat", "remat_policy",
                    "scan_blocks")


# model.family -> its config dataclass: images (the MMDiT: ours, Qwen-Image(-Edit), SD3, FLUX.1),
# video (Wan), Z-Image, FLUX.2
FAMILY_CONFIGS = {"mmdit": MMDiTConfig, "wan": WanConfig, "z_image": ZImageConfig,
                  "flux2": Flux2Config}
MODEL_FAMILIES = tuple(FAMILY_CONFIGS)


def family_of(cfg) -> str:
    """The ``model.family`` of a model config."""
    return next(f for f, cls in FAMILY_CONFIGS.items() if isinstance(cfg, cls))


def model_config(config) -> MMDiTConfig | WanConfig | ZImageConfig | Flux2Config:
    """The model's config: ``config.model`` (its ``family`` picks the dataclass:
    :data:`FAMILY_CONFIGS`), or for a diffusers base
    (:func:`diffusers_base`) the checkpoint's architecture with ``config.model``'s
    :data:`RUN_MODEL_FIELDS` (latent cells per side, prompt length, dtypes, remat, block
    scan)."""
    family = config.model.get("family", "mmdit")
    if family not in MODEL_FAMILIES:
        raise ConfigError(f"model.family={family!r}: unknown; choose one of {MODEL_FAMILIES} "
                          "(mmdit: images, wan: video, z_image, flux2)")
    cls = FAMILY_CONFIGS[family]
    base = diffusers_base(config)
    if base is not None:
        folder = os.path.join(base, "transformer")
        stamp = os.path.getmtime(os.path.join(folder, "config.json"))
        overrides = tuple((f, config.model.get(f, getattr(cls(), f)))
                          for f in run_model_fields(cls))
        return build_section(section_paths("model", cls),
                             lambda: _diffusers_architecture(folder, stamp, overrides, family))
    return build_section(section_paths("model", cls),
                         lambda: pick_fields(cls, config.model).validate())


def run_model_fields(cls) -> tuple[str, ...]:
    """The model fields a run chooses over a diffusers base's architecture (the
    :data:`RUN_MODEL_FIELDS` of an image model; a video model's also its latent frames and
    columns, and no block scan or remat policy, which the Wan transformer does not have)."""
    if cls is WanConfig:
        return ("frames", "image_size", "image_width", "text_len", "dtype", "param_dtype",
                "remat")
    if cls in (ZImageConfig, Flux2Config):
        return RUN_MODEL_FIELDS + ("image_width",)
    return RUN_MODEL_FIELDS


@functools.lru_cache(maxsize=16)
def _diffusers_architecture(folder: str, stamp: float, overrides: tuple,
                            family: str = "mmdit"):
    """A diffusers transformer's config, read once per folder, file version (``stamp``: its
    config.json's mtime) and run fields; a folder under its own ``model.family`` only (a Wan
    folder under 'wan', an MMDiT one under 'mmdit', ...), so a run's family is never decided by
    its checkpoint alone."""
    cfg = convert.config_from_diffusers(folder, **dict(overrides))
    if family_of(cfg) != family:
        raise ConfigError(f"base_checkpoint: {folder} holds a {type(cfg).__name__[:-6]} "
                          f"transformer, but model.family={family!r}; set model.family="
                          f"{family_of(cfg)!r}")
    return cfg


def mesh_config(config) -> MeshConfig:
    return build_section(section_paths("mesh", MeshConfig),
                  lambda: pick_fields(MeshConfig, config.mesh).validate())


def objective(config) -> str:
    """``rl.objective``: how the policy learns from a batch (``flow_grpo``: the score-function
    gradient through SDE steps; ``nft``: the forward-process regression on finished images)."""
    try:
        return registry.check_objective(config.rl.objective)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _sde_sampler_config(config) -> SamplerConfig:
    """The SDE sampler of ``config.sampler`` (``flow_grpo``'s training rollouts)."""
    s = config.sampler
    patches = s.noise_patches
    return build_section(
        section_paths("sampler", SamplerConfig, shared_init_bits="sampler.shared_initial_noise"),
        lambda: SamplerConfig(
            num_steps=s.num_steps, shift=s.shift, noise_level=s.noise_level, sde_type=s.sde_type,
            guidance=s.guidance,
            sde_window=tuple(s.sde_window) if s.sde_window is not None else None,
            shared_init_bits=SHARED_INIT_BITS if s.shared_initial_noise else 0,
            noise_patch=s.noise_patch,
            noise_patches=tuple(int(p) for p in patches) if patches else None).validate())


def sampler_config(config, *, evaluation: bool = False) -> SamplerConfig:
    """The training rollouts' sampler (the held-out ODE sampler with ``evaluation``). The
    ``nft`` objective samples its training images with the deterministic ODE at
    ``sampler.num_steps`` steps (a seed then fixes x_T, and with it the image)."""
    s = config.sampler
    if evaluation:
        return build_section(section_paths("sampler", SamplerConfig, num_steps="sampler.eval_steps",
                             guidance="sampler.eval_guidance"),
                      lambda: SamplerConfig(num_steps=s.eval_steps, shift=s.shift,
                                            noise_level=0.0, sde_type="ode",
                                            guidance=s.eval_guidance).validate())
    if objective(config) == "nft":
        if s.shared_initial_noise:
            raise ConfigError("sampler.shared_initial_noise=True gives every rollout of a "
                              "prompt the same x_T, so the ODE rollouts of rl.objective='nft' "
                              "would be identical; set sampler.shared_initial_noise=False")
        return build_section(section_paths("sampler", SamplerConfig),
                      lambda: SamplerConfig(num_steps=s.num_steps, shift=s.shift,
                                            noise_level=0.0, sde_type="ode",
                                            guidance=s.guidance).validate())
    return _sde_sampler_config(config)


# The objectives' default learning rates (LoRA r16/a32 on the tiny config; measured:
# docs/flow_grpo.md, docs/objectives.md).
GRPO_LR, NFT_LR = 5e-4, 1e-3


def _resolved(config, nft: bool) -> dict:
    """``rl.global_std=None`` and ``rl.lr=None`` resolved to the objective's defaults (the batch
    std for nft, unless ``rl.advantage='decoupled'``, which normalises within groups)."""
    r = config.rl
    batch_std = nft and r.advantage != "decoupled"
    return {"global_std": batch_std if r.global_std is None else bool(r.global_std),
            "lr": (NFT_LR if nft else GRPO_LR) if r.lr is None else float(r.lr)}


def _grpo_config(config) -> GRPOConfig:
    return build_section(section_paths("rl", GRPOConfig),
                  lambda: pick_fields(GRPOConfig, config.rl, **_resolved(config, False))
                  .validate())


def _nft_config(config) -> NFTConfig:
    r = config.rl
    paths = {f.name: f"rl.nft.{f.name}" if f.name in r.nft else f"rl.{f.name}"
             for f in dataclasses.fields(NFTConfig)}
    return build_section(paths, lambda: pick_fields(NFTConfig, {**dict(r), **dict(r.nft)},
                                             **_resolved(config, True)).validate())


def rl_config(config) -> GRPOConfig | NFTConfig:
    """The objective's frozen config from ``config.rl`` (``rl.nft.*`` for ``nft``), with
    ``rl.global_std=None`` and ``rl.lr=None`` resolved to the objective's defaults (batch std
    for ``nft``, as its anchor, per-group std for ``flow_grpo``; `NFT_LR`, `GRPO_LR`)."""
    return _nft_config(config) if objective(config) == "nft" else _grpo_config(config)


# Low seed bits that vary inside a prompt slot when its rollouts share x_T: up to 256 seeds
# (group plus exploration candidates) per slot.
SHARED_INIT_BITS = 8


# The objectives' default training rewards (measured: docs/objectives.md; Flow-GRPO with the
# aspect-graded shape credit: docs/flow_grpo.md).
GRPO_REWARD, NFT_REWARD = "geneval_lite", "geneval_lite_aspect"


def train_reward(config) -> str:
    """The training reward: ``rl.reward``, or with ``rl.reward=None`` the objective's default
    (`NFT_REWARD`, `GRPO_REWARD`)."""
    if config.rl.reward is not None:
        return config.rl.reward
    return NFT_REWARD if objective(config) == "nft" else GRPO_REWARD


def eval_reward(config) -> str:
    """The held-out measurement's reward: ``rl.eval_reward`` ('' = the training reward), so a
    shaped training reward is still measured by the reward it shapes."""
    return config.rl.eval_reward or train_reward(config)


REMOTE_REWARD = "remote"


def remote_reward_config(config) -> RemoteRewardConfig:
    """The reward server the ``remote`` reward asks (``config.remote_reward``)."""
    return build_section(section_paths("remote_reward", RemoteRewardConfig),
                  lambda: pick_fields(RemoteRewardConfig, config.remote_reward).validate())


def check_reward_sources(config) -> None:
    """One-line ConfigErrors for a reward the run names (alone or in a mix) whose source is not
    configured: 'remote' without ``remote_reward.url``, a learned reward without its
    ``learned_rewards`` folder or file."""
    named = {n for s in (train_reward(config), eval_reward(config))
             for n in _reward_names(s)}
    if REMOTE_REWARD in named and not remote_reward_config(config).url:
        raise ConfigError("remote_reward.url='': rl.reward or rl.eval_reward is 'remote', which "
                          "needs a reward server (e.g. --config.remote_reward.url=http://"
                          "127.0.0.1:18085 after python -m spotlight_jax.rewards.serve "
                          "--reward=geneval_lite --port=18085)")
    video = is_video(model_config(config))
    family = config.model.get("family", "mmdit")
    for path, spec in (("rl.reward", train_reward(config)),
                       ("rl.eval_reward", eval_reward(config))):
        for name in _reward_names(spec):
            if rewards.is_video_reward(name) and not video:
                raise ConfigError(
                    f"{path}={spec!r}: {name!r} scores video clips, and this run's model "
                    f"(model.family={family!r}) draws images; use geneval_lite (or set "
                    f"model.family='wan')")
            if video and name in rewards.IMAGE_WORLD_REWARDS:
                raise ConfigError(
                    f"{path}={spec!r}: {name!r} reads the image world's prompts, and this run's "
                    f"model (model.family={family!r}) draws video; use video_motion, or a "
                    f"learned image reward scored per frame (e.g. 'video_motion:1.0,"
                    f"aesthetic:0.1'), or set model.family='mmdit'")
    cfg = learned_rewards_config(config)
    for name in sorted(named & set(LEARNED_NEEDS)):
        for field in LEARNED_NEEDS[name]:
            if not getattr(cfg, field):
                raise ConfigError(f"learned_rewards.{field}='': rl.reward or rl.eval_reward "
                                  f"uses {name!r}, which needs it (docs/rewards.md: what to "
                                  "download and convert)")


def _reward_names(spec: str) -> list[str]:
    """The rewards a reward spec names (none for a malformed one: the settings' check names
    its error)."""
    try:
        return mix.names(spec)
    except ValueError:
        return []


def learned_rewards_config(config):
    """The ``learned_rewards`` section (``rewards.learned.LearnedRewardsConfig``), validated."""
    from spotlight_jax.rewards.learned import LearnedRewardsConfig  # noqa: PLC0415
    if config.get("learned_rewards") is None:
        return LearnedRewardsConfig()
    return build_section(section_paths("learned_rewards", LearnedRewardsConfig),
                         lambda: pick_fields(LearnedRewardsConfig,
                                             config.learned_rewards).validate())


def pretrain_config(config) -> PretrainConfig:
    return build_section(section_paths("pretrain", PretrainConfig),
                  lambda: pick_fields(PretrainConfig, config.pretrain))


@dataclasses.dataclass(frozen=True)
class ProcessConfig:
    """What the command line sets up before any work (top-level fields): the emulated CPU
    devices, the attention strategy and kernel, the compilation cache and where the base model
    comes from (``base_checkpoint``: 'auto' = a shipped checkpoint matching the config,
    'none' = pretrain into the workdir, else a directory holding ``params/``)."""

    num_cpu_devices: int = 0
    attention: str = "dense"
    attention_impl: str = "auto"
    compilation_cache_dir: str = ""
    base_checkpoint: str = "auto"

    def __post_init__(self):
        if self.num_cpu_devices < 0:
            raise ValueError(f"num_cpu_devices={self.num_cpu_devices!r}: must be >= 0 (0 = the "
                             "backend's default)")
        if self.attention not in STRATEGIES:
            raise ValueError(f"attention={self.attention!r}: choose one of {STRATEGIES}")
        if self.attention_impl not in IMPLEMENTATIONS:
            raise ValueError(f"attention_impl={self.attention_impl!r}: choose one of "
                             f"{IMPLEMENTATIONS}")
        path = self.base_checkpoint
        if path not in ("auto", "none", "") and not os.path.isdir(os.path.join(path, "params")) \
                and not os.path.isfile(os.path.join(path, "transformer", "config.json")):
            raise ValueError(f"base_checkpoint={path!r}: no checkpoint there (expected "
                             f"{os.path.join(path, 'params')}, or a diffusers pipeline folder "
                             "with transformer/config.json); give a base checkpoint "
                             "directory, a diffusers folder, 'auto' or 'none' (pretrain into "
                             "the workdir)")


def mode_spec(name: str) -> registry.ModeSpec:
    """``config.mode``'s spec, or a one-line ConfigError (a renamed mode names its new name)."""
    try:
        return registry.mode_spec(name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def process_config(config) -> ProcessConfig:
    return build_section({f.name: f.name for f in dataclasses.fields(ProcessConfig)},
                  lambda: pick_fields(ProcessConfig, config))


def cpu_device_count(config) -> int:
    """Emulated CPU devices this run needs (0 = leave the backend's default): the deployment's
    ``num_cpu_devices`` for the modes with spot devices; for ``baseline`` and ``explore_sync``,
    which run on the trainer's devices alone, exactly ``trainer_devices`` when it asks for more
    than one, else none (idle emulated devices slow every program on the shared cores: measured
    ~25% on the tiny update, docs/performance.md)."""
    return cpu_devices_for(int(config.num_cpu_devices), config.mode,
                           int(config.trainer_devices))


def cpu_devices_for(n: int, mode: str, trainer_devices: int) -> int:
    """:func:`cpu_device_count` of ``num_cpu_devices``, the mode and ``trainer_devices``."""
    if n < 0:
        raise ConfigError(f"num_cpu_devices={n}: must be >= 0 (0 = the backend's default)")
    if mode_spec(mode).uses_spot:
        return n
    return trainer_devices if trainer_devices > 1 else 0


# -- the deployment -------------------------------------------------------------------------

def deployment_config(config) -> DeploymentConfig:
    return build_section(section_paths("deployment", DeploymentConfig),
                  lambda: pick_fields(DeploymentConfig, config.deployment))


def trace_config(config) -> TraceConfig:
    return build_section(section_paths("trace", TraceConfig),
                         lambda: pick_fields(TraceConfig, config.trace))


def slice_paths() -> dict[str, str]:
    """The config fields a spot slice's check names (``DeploymentConfig.spot_slice_shape``):
    the deployment's, ``cost.device`` and ``trace.cloud``."""
    return {**section_paths("deployment", DeploymentConfig), "device": "cost.device",
            "cloud": "trace.cloud"}


def spot_slice(config) -> SliceShape | None:
    """The deployment's spot slice on ``cost.device`` with ``trace.cloud`` (None on a GPU),
    or a one-line ConfigError: an unknown topology, nodes that are not one slice, on-demand
    chips that are no slice, a slice on a GPU or a TPU without one, a cloud other than GCP."""
    deploy = deployment_config(config)
    return build_section(slice_paths(), lambda: deploy.spot_slice_shape(
        str(config.cost.device), str(config.trace.cloud)))


@functools.lru_cache(maxsize=8)
def _profile_model(name: str):
    """The model section of the config ``name`` (``cost.profile_model``; its ``family`` picks
    the dataclass, as :func:`model_config`'s)."""
    try:
        model = load_config(name).model
        cls = FAMILY_CONFIGS.get(model.get("family", "mmdit"), MMDiTConfig)
        return pick_fields(cls, model).validate()
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"cost.profile_model={name!r}: {e}") from e


def cost_config(config) -> CostConfig:
    """The ``cost`` section, its ``profile_model`` (a config name or path) loaded from that
    config's model section: the paper-scale model's shapes live in that config alone."""
    values = dict(config.cost)
    names = {f.name for f in dataclasses.fields(CostConfig)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"cost.{unknown[0]}: no such cost field; valid fields are "
                          f"{sorted(names)}")
    model = _profile_model(str(values.pop("profile_model")))
    profile = None
    if values.get("profile_file"):
        # the measured profile: its update MFU for this run's objective unless one is set
        profile = build_section(section_paths("cost", CostConfig),
                                lambda: load_profile(str(values["profile_file"])))
        pixels, factor = int(values["image_pixels"]), int(values["vae_factor"])
        build_section(section_paths("cost", CostConfig), lambda: profile.check_model(
            dataclasses.replace(model, image_size=pixels // factor)))
        if not values.get("update_mfu"):
            values["update_mfu"] = build_section(
                section_paths("cost", CostConfig),
                lambda: profile.update_mfu(str(config.rl.objective)))
    return build_section(section_paths("cost", CostConfig),
                         lambda: CostConfig(**values, profile_model=model, profile=profile))


def workload(config) -> Workload:
    """What the run does per rollout and per trained sample, for the cost model: the
    objective's own account (``rl.ObjectiveWork.workload``) at the model's forwards per
    sampling step."""
    passes = model_config(config).passes(float(config.sampler.guidance))
    return Workload(**work_of(rl_config(config), sampler_config(config)).workload(passes))

