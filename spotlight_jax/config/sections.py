"""Config sections -> the frozen dataclasses the library takes, each validated.

Every library module below takes its own small frozen dataclass, built here from its section
(``model_config``, ``mesh_config``, ``sampler_config``, ``rl_config``, ``deployment_config``,
``trace_config``, ``cost_config``, ``workload``, ...), and each of those dataclasses checks its
own values; a bad one becomes a one-line :class:`~spotlight_jax.config.loading.ConfigError`
naming the dotted field. :class:`~spotlight_jax.config.spec.RunSpec` calls these once per run.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pathlib

from flax import nnx
from jax.sharding import Mesh

from spotlight_jax import registry, rewards, world
from spotlight_jax.config.loading import (
    ConfigError,
    build_section,
    load_config,
    pick_fields,
    qualify,
    section_paths,
)
from spotlight_jax.diffusion import SamplerConfig
from spotlight_jax.diffusion.rollout import resolve_window
from spotlight_jax.emulation import (
    CostConfig,
    Deployment,
    DeploymentConfig,
    TraceConfig,
    TraceError,
    Workload,
)
from spotlight_jax.models import AttentionSpec, MMDiTConfig, as_dtype, convert
from spotlight_jax.models.build import abstract_model
from spotlight_jax.parallel import STRATEGIES, MeshConfig, make_mesh
from spotlight_jax.parallel.sharding import param_shardings
from spotlight_jax.pretrain import PretrainConfig
from spotlight_jax.prompt_embeddings import (
    EmbeddingPrompts,
    PromptEmbeddingError,
    PromptSource,
    WorldPrompts,
)
from spotlight_jax.prompt_embeddings import read as read_prompt_embeddings
from spotlight_jax.rewards.remote import RemoteReward, RemoteRewardConfig
from spotlight_jax.rl import GRPOConfig, NFTConfig, trainer_class

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
RUN_MODEL_FIELDS = ("image_size", "text_len", "dtype", "param_dtype", "remat", "scan_blocks")


def model_config(config) -> MMDiTConfig:
    """The model's config: ``config.model``, or for a diffusers base (:func:`diffusers_base`)
    the checkpoint's architecture with ``config.model``'s :data:`RUN_MODEL_FIELDS` (latent
    cells per side, prompt length, dtypes, remat, block scan)."""
    base = diffusers_base(config)
    if base is not None:
        folder = os.path.join(base, "transformer")
        stamp = os.path.getmtime(os.path.join(folder, "config.json"))
        overrides = tuple((f, config.model[f]) for f in RUN_MODEL_FIELDS)
        return build_section(section_paths("model", MMDiTConfig),
                      lambda: _diffusers_architecture(folder, stamp, overrides))
    return build_section(section_paths("model", MMDiTConfig),
                  lambda: pick_fields(MMDiTConfig, config.model).validate())


@functools.lru_cache(maxsize=16)
def _diffusers_architecture(folder: str, stamp: float, overrides: tuple) -> MMDiTConfig:
    """A diffusers transformer's config, read once per folder, file version (``stamp``: its
    config.json's mtime) and run fields."""
    return convert.config_from_diffusers(folder, **dict(overrides))


def load_diffusers_base(config):
    """``(graphdef, state)`` of a diffusers base's transformer, converted into the MMDiT with
    :func:`model_config`'s run fields, parameters in ``model.param_dtype``."""
    return transformer_of(diffusers_base(config), model_config(config))


def transformer_of(base: str, cfg: MMDiTConfig, mesh: Mesh | None = None):
    """``(graphdef, state)`` of the transformer in the diffusers folder ``base`` as the model
    ``cfg`` (its architecture read from there, with the run's fields), each parameter streamed
    straight onto its sharding on ``mesh`` (:func:`base_shardings`; None: the default
    device)."""
    overrides = {f: getattr(cfg, f) for f in RUN_MODEL_FIELDS if f not in ("dtype",
                                                                            "param_dtype")}
    shardings = None if mesh is None else base_shardings(cfg, mesh)
    model, _ = build_section({}, lambda: convert.from_diffusers(
        os.path.join(base, "transformer"), dtype=as_dtype(cfg.param_dtype),
        shardings=shardings, **overrides))
    # the graph of model_config (compute dtype included), as every other process builds it
    graphdef, _ = abstract_model(cfg)
    return graphdef, nnx.split(model)[1]


def base_shardings(cfg: MMDiTConfig, mesh: Mesh):
    """``(path, shape) -> NamedSharding`` of the model ``cfg``'s parameters on ``mesh`` (the
    rule table's, as ``shard_state`` places them): where a converted base streams to."""
    _, abstract = abstract_model(cfg)
    table = {tuple(path): sharding for path, sharding in
             nnx.to_flat_state(param_shardings(abstract, mesh))}
    return lambda path, shape: table[tuple(path)]


def image_decoder(config):
    """The frozen VAE that turns a latent model's samples into the reward's images (a diffusers
    base's ``vae/`` folder), or None for a model that draws pixels."""
    return decoder_of(diffusers_base(config), model_config(config))


def decoder_of(base: str | None, cfg: MMDiTConfig):
    """:func:`image_decoder` of the diffusers folder ``base`` (None: pixels) for model ``cfg``."""
    if base is None:
        return None
    vae_dir = os.path.join(base, "vae")
    if not os.path.isfile(os.path.join(vae_dir, "config.json")):
        raise ConfigError(f"base_checkpoint={base!r}: no vae/config.json next to transformer/ "
                          "(a latent model needs its VAE to turn samples into images)")
    vae = build_section({}, lambda: convert.vae_from_diffusers(vae_dir))
    if vae.latent_channels != cfg.channels:
        raise ConfigError(f"base_checkpoint={base!r}: the VAE has {vae.latent_channels} latent "
                          f"channels, the transformer {cfg.channels}")
    return vae


def attention_spec(config, mesh: Mesh | None) -> AttentionSpec:
    """How the trainer's forwards (and the samplers on its mesh) lay out attention: the
    ``attention`` strategy over the mesh's ``sp`` axis when it has one, else dense."""
    return attention_for(config.attention, mesh)


def attention_for(strategy: str, mesh: Mesh | None) -> AttentionSpec:
    """:func:`attention_spec` of the strategy name ``strategy``."""
    if mesh is None or mesh.shape.get("sp", 1) == 1 or strategy == "dense":
        return AttentionSpec()
    return AttentionSpec(mesh=mesh, strategy=strategy, axis="sp")


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


def make_trainer(config, graphdef, base, mesh=None):
    """The objective's trainer over ``base`` (placed on ``mesh``), sampling with
    :func:`sampler_config`, attention laid out by :func:`attention_spec`."""
    return trainer_of(rl_config(config), sampler_config(config), config.attention, graphdef,
                      base, mesh, int(config.seed))


def trainer_of(rl, sampler: SamplerConfig, attention: str, graphdef, base, mesh, seed: int):
    """:func:`make_trainer` of built sections: the objective's trainer of ``rl``."""
    return trainer_class(rl)(graphdef, base, rl, sampler, mesh=mesh,
                             attn=attention_for(attention, mesh), seed=seed)


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


def register_remote_reward(config) -> None:
    """Validates ``config.remote_reward`` and, where ``rl.reward`` or ``rl.eval_reward`` is
    or mixes in 'remote', registers its client under that name (replacing an earlier run's),
    with the server's reward components for ``rl.advantage='decoupled'``: the runner, the
    explorer and the evaluation then find it by name like any shipped reward."""
    cfg = remote_reward_config(config)
    if not any(rewards.mix.mentions(spec, REMOTE_REWARD)        # alone or in a mix
               for spec in (train_reward(config), eval_reward(config))):
        return
    if not cfg.url:
        raise ConfigError("remote_reward.url='': rl.reward or rl.eval_reward is 'remote', which "
                          "needs a reward server (e.g. --config.remote_reward.url=http://"
                          "127.0.0.1:18085 after python -m spotlight_jax.rewards.serve "
                          "--reward=geneval_lite --port=18085)")
    if _registered_remote.get(REMOTE_REWARD) == cfg and REMOTE_REWARD in rewards.names():
        return                          # this server's client is registered already
    client = RemoteReward(cfg)
    rewards.register(REMOTE_REWARD, client, overwrite=True, components=client.components)
    _registered_remote[REMOTE_REWARD] = cfg


# the config of the client registered as 'remote' (only this module registers that name)
_registered_remote: dict[str, RemoteRewardConfig] = {}


def learned_rewards_config(config):
    """The ``learned_rewards`` section (``rewards.learned.LearnedRewardsConfig``), validated."""
    from spotlight_jax.rewards.learned import LearnedRewardsConfig  # noqa: PLC0415
    if config.get("learned_rewards") is None:
        return LearnedRewardsConfig()
    return build_section(section_paths("learned_rewards", LearnedRewardsConfig),
                         lambda: pick_fields(LearnedRewardsConfig,
                                             config.learned_rewards).validate())


def register_learned_rewards(config) -> None:
    """Where ``rl.reward`` or ``rl.eval_reward`` names or mixes in a learned reward
    (``rewards.learned.NEEDS``), loads it from ``learned_rewards`` (once per folder) and
    registers it under its name; a folder not set is a one-line ConfigError naming the field."""
    from spotlight_jax.rewards.learned import NEEDS, LearnedReward  # noqa: PLC0415
    cfg = learned_rewards_config(config)
    for name, fields in NEEDS.items():
        if not any(rewards.mix.mentions(spec, name)
                   for spec in (train_reward(config), eval_reward(config))):
            continue
        values = tuple(getattr(cfg, f) for f in fields)
        for field, value in zip(fields, values):
            if not value:
                raise ConfigError(f"learned_rewards.{field}='': rl.reward or rl.eval_reward "
                                  f"uses {name!r}, which needs it (docs/rewards.md: what to "
                                  "download and convert)")
        key = (name, values, cfg.batch_size)
        if _registered_learned.get(name) == key and name in rewards.names():
            continue
        try:
            fn = LearnedReward(name, values[0], head=values[1] if len(values) > 1 else None,
                               batch_size=cfg.batch_size)
        except (OSError, ValueError) as e:
            raise ConfigError(f"learned_rewards.{fields[0]}={values[0]!r}: {e}") from None
        rewards.register(name, fn, overwrite=True)
        _registered_learned[name] = key


_registered_learned: dict[str, tuple] = {}


def pretrain_config(config) -> PretrainConfig:
    return build_section(section_paths("pretrain", PretrainConfig),
                  lambda: pick_fields(PretrainConfig, config.pretrain))


def prompt_source(config) -> PromptSource:
    """Where the run's prompts and their model inputs come from, decided once: a model with a
    prompt encoder (``model.text_width > 0``) reads the synthetic world's prompts through its
    word tokenizer; one without (``text_width == 0``) reads the prompt-embedding file
    ``prompts.embeddings_file`` (its train/val splits, embeddings of width
    ``model.text_embed_dim`` padded to ``model.text_len``)."""
    return prompts_of(model_config(config), config.prompts.embeddings_file,
                      config.prompts.train_kinds)


def prompts_of(m: MMDiTConfig, path: str, train_kinds: str) -> PromptSource:
    """:func:`prompt_source` of the model ``m``, the file ``path`` ('' = none) and the world's
    ``train_kinds``."""

    def bad(why):
        raise ConfigError(f"prompts.embeddings_file={path!r}: {why}")

    if m.text_width:
        if path:
            bad(f"the model has its own prompt encoder (model.text_width={m.text_width}), which "
                "reads token ids; set --config.model.text_width=0 and "
                "--config.model.text_embed_dim=<the file's width> to use the file, or "
                "--config.prompts.embeddings_file=''")
        try:
            kinds = world.parse_kinds(train_kinds)
        except ValueError as e:
            raise ConfigError(f"prompts.train_kinds={train_kinds!r}: {e}") from None
        return WorldPrompts(world.WorldConfig(image_size=m.image_size), kinds)
    if train_kinds:
        raise ConfigError(f"prompts.train_kinds={train_kinds!r}: task kinds are "
                          "the synthetic world's; a prompt-embedding file's training pool is its "
                          "train split (set --config.prompts.train_kinds='')")
    if not path:
        bad("model.text_width=0 feeds precomputed prompt embeddings; give a file written by "
            "python -m spotlight_jax.encode_prompts")
    try:
        source = EmbeddingPrompts(read_prompt_embeddings(path))
    except PromptEmbeddingError as e:          # its message starts with the path: named above
        bad(" ".join(str(e).removeprefix(f"{pathlib.Path(path)}: ").split()))
    f = source.file
    if f.dim != m.text_embed_dim:
        bad(f"embeddings of width {f.dim}, the model takes model.text_embed_dim="
            f"{m.text_embed_dim}; set --config.model.text_embed_dim={f.dim}")
    if f.text_len > m.text_len:
        bad(f"{f.text_len} tokens per prompt, more than model.text_len={m.text_len}; set "
            f"--config.model.text_len={f.text_len} (tokens are never truncated)")
    if f.pooled_dim is not None and m.pooled != "input":
        bad(f"holds pooled embeddings of width {f.pooled_dim} (family {f.family!r}), which "
            f"model.pooled={m.pooled!r} would drop; set --config.model.pooled=input "
            f"--config.model.pooled_dim={f.pooled_dim}")
    if m.pooled == "input" and f.pooled_dim is None:
        bad(f"has no pooled embeddings (family {f.family!r}), which model.pooled='input' needs; "
            "write it with the model's family (e.g. sd3) or set --config.model.pooled=none")
    if m.pooled == "input" and f.pooled_dim != m.pooled_dim:
        bad(f"pooled embeddings of width {f.pooled_dim}, the model takes model.pooled_dim="
            f"{m.pooled_dim}; set --config.model.pooled_dim={f.pooled_dim}")
    if not source.train_prompts:
        bad("has no training prompts (split 'train'); re-run python -m "
            "spotlight_jax.encode_prompts with them")
    return source


@dataclasses.dataclass(frozen=True)
class ProcessConfig:
    """What the command line sets up before any work (top-level fields): the emulated CPU
    devices, the attention strategy, the compilation cache and where the base model comes from
    (``base_checkpoint``: 'auto' = a shipped checkpoint matching the config, 'none' = pretrain
    into the workdir, else a directory holding ``params/``)."""

    num_cpu_devices: int = 0
    attention: str = "dense"
    compilation_cache_dir: str = ""
    base_checkpoint: str = "auto"

    def __post_init__(self):
        if self.num_cpu_devices < 0:
            raise ValueError(f"num_cpu_devices={self.num_cpu_devices!r}: must be >= 0 (0 = the "
                             "backend's default)")
        if self.attention not in STRATEGIES:
            raise ValueError(f"attention={self.attention!r}: choose one of {STRATEGIES}")
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


def build_mesh(config, devices=None) -> Mesh:
    return make_mesh(devices, mesh_config(config))


# -- the deployment -------------------------------------------------------------------------

def deployment_config(config) -> DeploymentConfig:
    return build_section(section_paths("deployment", DeploymentConfig),
                  lambda: pick_fields(DeploymentConfig, config.deployment))


def trace_config(config) -> TraceConfig:
    return build_section(section_paths("trace", TraceConfig),
                         lambda: pick_fields(TraceConfig, config.trace))


@functools.lru_cache(maxsize=8)
def _profile_model(name: str) -> MMDiTConfig:
    """The model section of the config ``name`` (``cost.profile_model``)."""
    try:
        return pick_fields(MMDiTConfig, load_config(name).model).validate()
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
    return build_section(section_paths("cost", CostConfig),
                         lambda: CostConfig(**values, profile_model=model))


def workload(config) -> Workload:
    """What the run does per rollout and per trained trajectory, for the cost model (reads
    ``config.sampler`` and ``config.rl``): Flow-GRPO trains its SDE steps with a KL reference
    forward; the forward-process objective trains K = ``rl.nft.times`` flow times per image,
    each with the old policy's forward (and the reference's with ``rl.nft.kl_beta`` > 0), one
    optimizer step, ODE rollouts without CFG in training."""
    s, r = config.sampler, config.rl
    passes = model_config(config).passes(float(s.guidance))
    if objective(config) == "nft":
        n = r.nft
        return Workload(num_steps=int(s.num_steps), train_steps=int(n.times), inner_epochs=1,
                        kl=True, rescore=False, cfg_passes=passes,
                        lora_rank=int(r.lora_rank), extra_forwards=int(float(n.kl_beta) > 0),
                        objective="nft")
    start, end = resolve_window(s.sde_window, int(s.num_steps))
    stochastic = end - start
    ts = int(r.train_steps)
    return Workload(num_steps=int(s.num_steps),
                    train_steps=ts if 0 < ts < stochastic else int(stochastic),
                    inner_epochs=int(r.inner_epochs),
                    kl=float(r.beta) > 0 or bool(r.detail_beta),
                    rescore=bool(r.rescore),
                    cfg_passes=passes, lora_rank=int(r.lora_rank))


def make_deployment(config) -> Deployment:
    """The emulated deployment (on-demand devices, spot nodes, trace, cost model) of ``config``.
    A trace file that is missing or unreadable raises :class:`TraceError` naming
    ``trace.path``, the file and the fix."""
    return deployment_of(deployment_config(config), trace_config(config), cost_config(config),
                         workload(config), int(config.sampler.num_steps))


def deployment_of(deploy: DeploymentConfig, trace: TraceConfig, cost: CostConfig,
                  work: Workload, num_steps: int) -> Deployment:
    """:func:`make_deployment` of built sections."""
    try:
        return Deployment(deploy, trace, cost, work, num_steps=num_steps)
    except TraceError as e:
        raise TraceError(qualify(str(e), section_paths("trace", TraceConfig))) from e


