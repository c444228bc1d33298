"""Config sections -> frozen dataclasses, their validation, and sharded model construction.

This is the boundary where the ConfigDict ends: every library module below takes its own small
frozen dataclass, built here (``model_config``, ``mesh_config``, ``sampler_config``,
``rl_config``, ``deployment_config``, ``trace_config``, ``cost_config``, ``workload``, ...), and
each of those dataclasses checks its own values. A bad value becomes a :class:`ConfigError`: one
line naming the dotted config field, the value and the fix (``rl.lr=-1.0: must be > 0 (e.g.
--config.rl.lr=1e-3)``). :func:`validate` builds every section and checks what needs the
devices present; the command line calls it before any work. Models are initialised sharded from
the start (``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``), never on one device
first.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import pathlib
import re
import runpy

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from spotlight_jax import registry, rewards, world
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
from spotlight_jax.explore.planner import PlannerConfig
from spotlight_jax.models import AttentionSpec, MMDiT, MMDiTConfig, as_dtype, convert
from spotlight_jax.parallel import STRATEGIES, MeshConfig, make_mesh
from spotlight_jax.parallel.sharding import param_specs
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

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"


class ConfigError(ValueError):
    """A config value this run cannot use. The message is one line: the dotted field, its value,
    what it must be and the fix."""


def load_config(name_or_path: str | os.PathLike, overrides: dict | None = None):
    """A config from ``configs/<name>.py`` (e.g. ``"tiny"``) or a path to a config file, with
    dotted overrides applied (``{"rl.lr": 1e-3, "mode": "baseline"}``) as ``--config.x=...``
    would. Unknown keys raise KeyError naming the key, so a typo never passes silently."""
    path = pathlib.Path(name_or_path)
    if path.suffix != ".py":
        path = CONFIG_DIR / f"{name_or_path}.py"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.py")) if CONFIG_DIR.is_dir() else []
        raise FileNotFoundError(f"no config file {str(path)!r}; known configs: {known} "
                                "(a config lives in the repository's configs/ folder)")
    return apply_overrides(runpy.run_path(str(path))["get_config"](), overrides)


def apply_overrides(config, overrides: dict | None):
    """``config`` with dotted overrides set in place (``{"rl.lr": 1e-3}``); an unknown key
    raises KeyError naming it. Returns ``config``."""
    for key, value in (overrides or {}).items():
        *parents, leaf = key.split(".")
        section = config
        for part in parents:
            if part not in section:
                raise KeyError(f"config override {key!r}: no section {part!r}")
            section = section[part]
        if leaf not in section:
            raise KeyError(f"config override {key!r}: no field {leaf!r} in "
                           f"{'.'.join(parents) or 'the top level'}")
        section[leaf] = value
    return config


def pick_fields(cls, section, **overrides):
    """The frozen dataclass ``cls`` from the config section's matching fields."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in dict(section).items() if k in names}
    values.update(overrides)
    return cls(**values)


# -- validation: a library dataclass's "name=value: ..." errors, named by their config fields --

def _paths(prefix: str, cls, **renamed) -> dict[str, str]:
    """``{field: dotted config path}`` of ``cls`` under the section ``prefix`` (``renamed``:
    fields whose config key differs, e.g. ``num_steps="sampler.eval_steps"``)."""
    return {f.name: renamed.get(f.name, f"{prefix}.{f.name}") for f in dataclasses.fields(cls)}


def _qualify(message: str, paths: dict[str, str]) -> str:
    """``message`` with each bare ``field=`` replaced by its dotted config path, and an example
    fix ``e.g. field=x`` by the flag that sets it (``e.g. --config.rl.lr=x``)."""
    names = "|".join(re.escape(n) for n in sorted(paths, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.\-])(e\.g\. )?({names})=")
    return pattern.sub(lambda m: (f"e.g. --config.{paths[m.group(2)]}=" if m.group(1)
                                  else f"{paths[m.group(2)]}="), message)


def _build(paths: dict[str, str], make):
    """``make()``, its ValueError re-raised as a :class:`ConfigError` named by ``paths``."""
    try:
        return make()
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(_qualify(str(e), paths)) from e


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
        return _build(_paths("model", MMDiTConfig),
                      lambda: _diffusers_architecture(folder, stamp, overrides))
    return _build(_paths("model", MMDiTConfig),
                  lambda: pick_fields(MMDiTConfig, config.model).validate())


@functools.lru_cache(maxsize=16)
def _diffusers_architecture(folder: str, stamp: float, overrides: tuple) -> MMDiTConfig:
    """A diffusers transformer's config, read once per folder, file version (``stamp``: its
    config.json's mtime) and run fields."""
    return convert.config_from_diffusers(folder, **dict(overrides))


def load_diffusers_base(config):
    """``(graphdef, state)`` of a diffusers base's transformer, converted into the MMDiT with
    :func:`model_config`'s run fields, parameters in ``model.param_dtype``."""
    base = diffusers_base(config)
    cfg = model_config(config)
    overrides = {f: getattr(cfg, f) for f in RUN_MODEL_FIELDS if f not in ("dtype",
                                                                            "param_dtype")}
    model, _ = _build({}, lambda: convert.from_diffusers(
        os.path.join(base, "transformer"), dtype=as_dtype(cfg.param_dtype), **overrides))
    # the graph of model_config (compute dtype included), as every other process builds it
    graphdef, _ = abstract_model(cfg)
    return graphdef, nnx.split(model)[1]


def image_decoder(config):
    """The frozen VAE that turns a latent model's samples into the reward's images (a diffusers
    base's ``vae/`` folder), or None for a model that draws pixels."""
    base = diffusers_base(config)
    if base is None:
        return None
    vae_dir = os.path.join(base, "vae")
    if not os.path.isfile(os.path.join(vae_dir, "config.json")):
        raise ConfigError(f"base_checkpoint={base!r}: no vae/config.json next to transformer/ "
                          "(a latent model needs its VAE to turn samples into images)")
    vae = _build({}, lambda: convert.vae_from_diffusers(vae_dir))
    cfg = model_config(config)
    if vae.latent_channels != cfg.channels:
        raise ConfigError(f"base_checkpoint={base!r}: the VAE has {vae.latent_channels} latent "
                          f"channels, the transformer {cfg.channels}")
    return vae


def attention_spec(config, mesh: Mesh | None) -> AttentionSpec:
    """How the trainer's forwards (and the samplers on its mesh) lay out attention: the
    ``attention`` strategy over the mesh's ``sp`` axis when it has one, else dense."""
    if mesh is None or mesh.shape.get("sp", 1) == 1 or config.attention == "dense":
        return AttentionSpec()
    return AttentionSpec(mesh=mesh, strategy=config.attention, axis="sp")


def mesh_config(config) -> MeshConfig:
    return _build(_paths("mesh", MeshConfig),
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
    return _build(
        _paths("sampler", SamplerConfig, shared_init_bits="sampler.shared_initial_noise"),
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
        return _build(_paths("sampler", SamplerConfig, num_steps="sampler.eval_steps",
                             guidance="sampler.eval_guidance"),
                      lambda: SamplerConfig(num_steps=s.eval_steps, shift=s.shift,
                                            noise_level=0.0, sde_type="ode",
                                            guidance=s.eval_guidance).validate())
    if objective(config) == "nft":
        if s.shared_initial_noise:
            raise ConfigError("sampler.shared_initial_noise=True gives every rollout of a "
                              "prompt the same x_T, so the ODE rollouts of rl.objective='nft' "
                              "would be identical; set sampler.shared_initial_noise=False")
        return _build(_paths("sampler", SamplerConfig),
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
    return _build(_paths("rl", GRPOConfig),
                  lambda: pick_fields(GRPOConfig, config.rl, **_resolved(config, False))
                  .validate())


def _nft_config(config) -> NFTConfig:
    r = config.rl
    paths = {f.name: f"rl.nft.{f.name}" if f.name in r.nft else f"rl.{f.name}"
             for f in dataclasses.fields(NFTConfig)}
    return _build(paths, lambda: pick_fields(NFTConfig, {**dict(r), **dict(r.nft)},
                                             **_resolved(config, True)).validate())


def rl_config(config) -> GRPOConfig | NFTConfig:
    """The objective's frozen config from ``config.rl`` (``rl.nft.*`` for ``nft``), with
    ``rl.global_std=None`` and ``rl.lr=None`` resolved to the objective's defaults (batch std
    for ``nft``, as its anchor, per-group std for ``flow_grpo``; `NFT_LR`, `GRPO_LR`)."""
    return _nft_config(config) if objective(config) == "nft" else _grpo_config(config)


def make_trainer(config, graphdef, base, mesh=None):
    """The objective's trainer over ``base`` (placed on ``mesh``), sampling with
    :func:`sampler_config`, attention laid out by :func:`attention_spec`."""
    cfg = rl_config(config)
    return trainer_class(cfg)(graphdef, base, cfg, sampler_config(config), mesh=mesh,
                              attn=attention_spec(config, mesh), seed=int(config.seed))


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
    return _build(_paths("remote_reward", RemoteRewardConfig),
                  lambda: pick_fields(RemoteRewardConfig, config.remote_reward).validate())


def register_remote_reward(config) -> None:
    """Validates ``config.remote_reward`` and, where ``rl.reward`` or ``rl.eval_reward`` is
    'remote', registers its client under that name (replacing an earlier run's), with the
    server's reward components for ``rl.advantage='decoupled'``: the runner, the explorer and
    the evaluation then find it by name like any shipped reward."""
    cfg = remote_reward_config(config)
    if REMOTE_REWARD not in (train_reward(config), eval_reward(config)):
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


def pretrain_config(config) -> PretrainConfig:
    return _build(_paths("pretrain", PretrainConfig),
                  lambda: pick_fields(PretrainConfig, config.pretrain))


def prompt_source(config) -> PromptSource:
    """Where the run's prompts and their model inputs come from, decided once: a model with a
    prompt encoder (``model.text_width > 0``) reads the synthetic world's prompts through its
    word tokenizer; one without (``text_width == 0``) reads the prompt-embedding file
    ``prompts.embeddings_file`` (its train/val splits, embeddings of width
    ``model.text_embed_dim`` padded to ``model.text_len``)."""
    m = model_config(config)
    path = config.prompts.embeddings_file

    def bad(why):
        raise ConfigError(f"prompts.embeddings_file={path!r}: {why}")

    if m.text_width:
        if path:
            bad(f"the model has its own prompt encoder (model.text_width={m.text_width}), which "
                "reads token ids; set --config.model.text_width=0 and "
                "--config.model.text_embed_dim=<the file's width> to use the file, or "
                "--config.prompts.embeddings_file=''")
        try:
            kinds = world.parse_kinds(config.prompts.train_kinds)
        except ValueError as e:
            raise ConfigError(f"prompts.train_kinds={config.prompts.train_kinds!r}: {e}") from None
        return WorldPrompts(world.WorldConfig(image_size=m.image_size), kinds)
    if config.prompts.train_kinds:
        raise ConfigError(f"prompts.train_kinds={config.prompts.train_kinds!r}: task kinds are "
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
    return _build({f.name: f.name for f in dataclasses.fields(ProcessConfig)},
                  lambda: pick_fields(ProcessConfig, config))


def cpu_device_count(config) -> int:
    """Emulated CPU devices this run needs (0 = leave the backend's default): the deployment's
    ``num_cpu_devices`` for the modes with spot devices; for ``baseline`` and ``explore_sync``,
    which run on the trainer's devices alone, exactly ``trainer_devices`` when it asks for more
    than one, else none (idle emulated devices slow every program on the shared cores: measured
    ~25% on the tiny update, docs/performance.md)."""
    n = int(config.num_cpu_devices)
    if n < 0:
        raise ConfigError(f"num_cpu_devices={n}: must be >= 0 (0 = the backend's default)")
    if mode_spec(config.mode).uses_spot:
        return n
    trainer = int(config.trainer_devices)
    return trainer if trainer > 1 else 0


def build_mesh(config, devices=None) -> Mesh:
    return make_mesh(devices, mesh_config(config))


def explore_mesh(trainer_mesh: Mesh, devices=None, batch_multiple: int = 1) -> Mesh | None:
    """Where ``spotlight`` mode explores while the trainer updates: a data-parallel mesh over
    devices the trainer's mesh does not use (of ``devices``, default all), as many as the largest
    power of two that divides ``batch_multiple`` (the explorer's padded batch). None when the
    trainer holds every device: exploration then shares the trainer's devices."""
    used = {d.id for d in trainer_mesh.devices.flat}
    free = [d for d in (jax.devices() if devices is None else devices) if d.id not in used]
    n = 1
    while 2 * n <= len(free) and batch_multiple % (2 * n) == 0:
        n *= 2
    if not free:
        return None
    return make_mesh(free[-n:], MeshConfig(data=-1, fsdp=1, sp=1))


def fleet_devices(trainer_mesh: Mesh, devices, num_nodes: int, per_node: int):
    """Where the emulated spot nodes live in ``spotlight`` mode: ``(devices, per_node)`` with
    the last ``num_nodes * per_node`` devices the trainer's mesh does not use, or one device per
    node when fewer are free (the groups then run unsharded), or None when not even that fits."""
    used = {d.id for d in trainer_mesh.devices.flat}
    free = [d for d in devices if d.id not in used]
    for n in (per_node, 1):
        if n >= 1 and len(free) >= num_nodes * n:
            return free[len(free) - num_nodes * n:], n
    return None


def abstract_model(cfg: MMDiTConfig, seed: int = 0):
    """``(graphdef, abstract_state)`` without allocating parameters."""
    return nnx.split(nnx.eval_shape(lambda: MMDiT(cfg, rngs=nnx.Rngs(seed))))


def create_model(cfg: MMDiTConfig, mesh: Mesh | None = None, seed: int = 0):
    """``(graphdef, state)`` with parameters created directly in their sharded layout."""
    graphdef, abstract = abstract_model(cfg, seed)

    def init():
        return nnx.split(MMDiT(cfg, rngs=nnx.Rngs(seed)))[1]

    if mesh is None:
        return graphdef, jax.jit(init)()
    shardings = param_specs(abstract, mesh)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), shardings,
                             is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return graphdef, jax.jit(init, out_shardings=shardings)()


# -- the deployment -------------------------------------------------------------------------

def deployment_config(config) -> DeploymentConfig:
    return _build(_paths("deployment", DeploymentConfig),
                  lambda: pick_fields(DeploymentConfig, config.deployment))


def trace_config(config) -> TraceConfig:
    return _build(_paths("trace", TraceConfig), lambda: pick_fields(TraceConfig, config.trace))


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
    return _build(_paths("cost", CostConfig), lambda: CostConfig(**values, profile_model=model))


def workload(config) -> Workload:
    """What the run does per rollout and per trained trajectory, for the cost model (reads
    ``config.sampler`` and ``config.rl``): Flow-GRPO trains its SDE steps with a KL reference
    forward; the forward-process objective trains K = ``rl.nft.times`` flow times per image,
    each with the old policy's forward (and the reference's with ``rl.nft.kl_beta`` > 0), one
    optimizer step, ODE rollouts without CFG in training."""
    s, r = config.sampler, config.rl
    if objective(config) == "nft":
        n = r.nft
        return Workload(num_steps=int(s.num_steps), train_steps=int(n.times), inner_epochs=1,
                        kl=True, rescore=False, cfg_passes=1 if float(s.guidance) == 1.0 else 2,
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
                    cfg_passes=1 if float(s.guidance) == 1.0 else 2,
                    lora_rank=int(r.lora_rank))


def make_deployment(config) -> Deployment:
    """The emulated deployment (on-demand devices, spot nodes, trace, cost model) of ``config``.
    A trace file that is missing or unreadable raises :class:`TraceError` naming
    ``trace.path``, the file and the fix."""
    trace = trace_config(config)
    try:
        return Deployment(deployment_config(config), trace, cost_config(config),
                          workload(config), num_steps=int(config.sampler.num_steps))
    except TraceError as e:
        raise TraceError(_qualify(str(e), _paths("trace", TraceConfig))) from e


# -- the whole config ---------------------------------------------------------------------------

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
    if s.reward not in known:
        bad("rl.reward", s.reward, f"unknown reward; registered rewards: {', '.join(known)}")
    if s.eval_reward not in known:
        bad("rl.eval_reward", s.eval_reward,
            f"unknown reward; registered rewards: {', '.join(known)} ('' = rl.reward)")
    e = s.explore
    _build(_paths("explore", PlannerConfig),
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
    _check_run_settings(_build({}, lambda: run_settings(config)))
    model_config(config)
    mesh_config(config)
    _sde_sampler_config(config)       # the SDE fields, whichever objective trains
    sampler_config(config)
    sampler_config(config, evaluation=True)
    _grpo_config(config)              # both objectives' fields: a typo in either is caught
    _nft_config(config)
    pretrain_config(config)
    remote_reward_config(config)      # (run_settings registered the client if the run uses it)
    if (config.prompts.embeddings_file or config.prompts.train_kinds
            or model_config(config).text_width):
        prompt_source(config)         # a missing or mismatched file (a real config without
        #                               one still validates: its dry run needs no prompts)
    deploy = deployment_config(config)
    trace = trace_config(config)
    if trace.paths:                   # missing files and a start past the trace's end
        _build(_paths("trace", TraceConfig), lambda: trace.load(deploy.spot_nodes, 3600.0))
    cost_config(config)
    workload(config)
    if devices is not None:
        check_devices(config, devices)


def check_devices(config, devices) -> None:
    """ConfigErrors for what ``devices`` (this process's) cannot hold: more trainer devices
    than are present, or a mesh the trainer's devices cannot form."""
    devices = list(devices)
    want = int(config.trainer_devices)
    if want > len(devices):
        emulated = cpu_device_count(config)
        where = f" (num_cpu_devices={emulated} emulated CPU devices)" if emulated else ""
        raise ConfigError(f"trainer_devices={want}: only {len(devices)} devices are "
                          f"present{where}; set --config.trainer_devices to at most "
                          f"{len(devices)} (0 = all)")
    n = want or len(devices)
    mesh = mesh_config(config)
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
    """Everything the runner reads from a config besides what its builders make (models,
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
    fleet: bool
    scheduler: bool
    rollout_on_groups: str | bool
    ray_spot_resource: str
    ray_explore_deadline: bool
    ray_address: str
    ray_host_wait_s: float
    target_frac: float          # compare mode's target share of the baseline's gain
    target_gain: float = 0.0    # > 0: compare mode's target is the baseline's start + this
    compare_seeds: tuple = ()   # compare mode: one comparison per config seed (() = seed)


def run_settings(config) -> RunSettings:
    """The runner's settings; registers the ``remote`` reward first where the run names it
    (:func:`register_remote_reward`), so that ``reward`` and ``eval_reward`` resolve."""
    register_remote_reward(config)
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
        transport=d.transport, fleet=bool(d.fleet), scheduler=bool(d.scheduler),
        rollout_on_groups=d.rollout_on_groups, ray_spot_resource=d.ray_spot_resource,
        ray_explore_deadline=bool(d.ray_explore_deadline), ray_address=str(d.ray_address),
        ray_host_wait_s=float(d.ray_host_wait_s),
        target_frac=float(config.compare.target_frac),
        target_gain=float(config.compare.target_gain),
        compare_seeds=tuple(config.compare.seeds or ()))


def host_config(config) -> dict:
    """The run's config as a plain dict, for a process that builds its own model from it (a Ray
    spot host)."""
    return config.to_dict()
