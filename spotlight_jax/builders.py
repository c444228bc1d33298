"""Config sections -> frozen dataclasses, and sharded model construction.

This is the boundary where the ConfigDict ends: every library module below takes its own small
frozen dataclass, built here. Models are initialised sharded from the start
(``eval_shape`` -> shardings -> ``jit(init, out_shardings=...)``), never on one device first.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import runpy

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from spotlight_jax.diffusion import SamplerConfig
from spotlight_jax.models import MMDiT, MMDiTConfig
from spotlight_jax.parallel import MeshConfig, make_mesh
from spotlight_jax.parallel.sharding import param_specs
from spotlight_jax.rl import GRPOConfig, NFTConfig, trainer_class

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"


def load_config(name_or_path: str | os.PathLike, overrides: dict | None = None):
    """A config from ``configs/<name>.py`` (e.g. ``"tiny"``) or a path to a config file, with
    dotted overrides applied (``{"rl.lr": 1e-3, "mode": "flow_grpo"}``) as ``--config.x=...``
    would. Unknown keys raise KeyError naming the key, so a typo never passes silently."""
    path = pathlib.Path(name_or_path)
    if path.suffix != ".py":
        path = CONFIG_DIR / f"{name_or_path}.py"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.py")) if CONFIG_DIR.is_dir() else []
        raise FileNotFoundError(f"no config file {str(path)!r}; known configs: {known} "
                                "(a config lives in the repository's configs/ folder)")
    config = runpy.run_path(str(path))["get_config"]()
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


def model_config(config) -> MMDiTConfig:
    return pick_fields(MMDiTConfig, config.model).validate()


def mesh_config(config) -> MeshConfig:
    return pick_fields(MeshConfig, config.mesh)


OBJECTIVES = ("flow_grpo", "nft")


def objective(config) -> str:
    """``rl.objective``: how the policy learns from a batch (``flow_grpo``: the score-function
    gradient through SDE steps; ``nft``: the forward-process regression on finished images)."""
    name = config.rl.get("objective", "flow_grpo")
    if name not in OBJECTIVES:
        raise ValueError(f"rl.objective={name!r}: choose one of {OBJECTIVES}")
    return name


def sampler_config(config, *, evaluation: bool = False) -> SamplerConfig:
    """The training rollouts' sampler (the held-out ODE sampler with ``evaluation``). The
    ``nft`` objective samples its training images with the deterministic ODE at
    ``sampler.num_steps`` steps (a seed then fixes x_T, and with it the image)."""
    s = config.sampler
    window = tuple(s.sde_window) if s.get("sde_window") is not None else None
    patches = s.get("noise_patches")
    if evaluation:
        return SamplerConfig(num_steps=s.eval_steps, shift=s.shift, noise_level=0.0,
                             sde_type="ode", guidance=s.eval_guidance).validate()
    if objective(config) == "nft":
        if s.get("shared_initial_noise"):
            raise ValueError("sampler.shared_initial_noise=True gives every rollout of a prompt "
                             "the same x_T, so the ODE rollouts of rl.objective='nft' would be "
                             "identical; set sampler.shared_initial_noise=False")
        return SamplerConfig(num_steps=s.num_steps, shift=s.shift, noise_level=0.0,
                             sde_type="ode", guidance=s.guidance).validate()
    return SamplerConfig(num_steps=s.num_steps, shift=s.shift, noise_level=s.noise_level,
                         sde_type=s.sde_type, guidance=s.guidance, sde_window=window,
                         shared_init_bits=SHARED_INIT_BITS if s.get("shared_initial_noise")
                         else 0, noise_patch=s.get("noise_patch", 1),
                         noise_patches=tuple(int(p) for p in patches) if patches else None
                         ).validate()


def rl_config(config) -> GRPOConfig | NFTConfig:
    """The objective's frozen config from ``config.rl`` (``rl.nft.*`` for ``nft``), with
    ``rl.global_std=None`` and ``rl.lr=None`` resolved to the objective's defaults (batch std
    for ``nft``, as its anchor, per-group std for ``flow_grpo``; `NFT_LR`, `GRPO_LR`)."""
    r = config.rl
    nft = objective(config) == "nft"
    std, lr = r.get("global_std"), r.get("lr")
    resolved = {"global_std": nft if std is None else bool(std),
                "lr": (NFT_LR if nft else GRPO_LR) if lr is None else float(lr)}
    if nft:
        fields = {**dict(r), **dict(r.get("nft") or {})}
        return pick_fields(NFTConfig, fields, **resolved).validate()
    return pick_fields(GRPOConfig, r, **resolved)


# The objectives' default learning rates (LoRA r16/a32 on the tiny config; measured, README
# "Flow-GRPO" and docs/objectives.md).
GRPO_LR, NFT_LR = 5e-4, 1e-3


def make_trainer(config, graphdef, base, mesh=None):
    """The objective's trainer over ``base`` (placed on ``mesh``), sampling with
    :func:`sampler_config`."""
    cfg = rl_config(config)
    return trainer_class(cfg)(graphdef, base, cfg, sampler_config(config), mesh=mesh)


# Low seed bits that vary inside a prompt slot when its rollouts share x_T: up to 256 seeds
# (group plus exploration candidates) per slot.
SHARED_INIT_BITS = 8


def eval_reward(config) -> str:
    """The held-out measurement's reward: ``rl.eval_reward`` ('' = the training reward
    ``rl.reward``), so a shaped training reward is still measured by the reward it shapes."""
    return config.rl.get("eval_reward", "") or config.rl.reward


SPOT_MODES = ("spot_rollout", "spotlight", "compare")


def cpu_device_count(config) -> int:
    """Emulated CPU devices this run needs (0 = leave the backend's default): the deployment's
    ``num_cpu_devices`` for the modes with spot devices; none for ``flow_grpo`` and
    ``explore_sync``, which run on the trainer's device alone (idle emulated devices slow every
    program on the shared cores: measured ~25% on the tiny update, docs/performance.md)."""
    return int(config.num_cpu_devices) if config.mode in SPOT_MODES else 0


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


def state_shardings(abstract_state, mesh: Mesh):
    specs = param_specs(abstract_state, mesh)
    return jax.tree.map(lambda v, s: NamedSharding(mesh, s), nnx.to_pure_dict(abstract_state),
                        nnx.to_pure_dict(specs))


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


def make_deployment(config):
    """The emulated deployment (on-demand devices, spot nodes, trace, cost model) of ``config``."""
    from spotlight_jax.emulation import Deployment  # noqa: PLC0415
    return Deployment(config)
