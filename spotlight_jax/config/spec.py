"""One run's config, validated and built once: :class:`RunSpec`.

The command line (or a library caller) turns the ConfigDict into a ``RunSpec`` once
(:meth:`RunSpec.from_config`); ``train``, the runner, ``compare``, ``dry_run``, the cluster
trainer job and the Ray spot hosts take the spec or its sections, never the ConfigDict. A spec
keeps its config as plain data (:meth:`RunSpec.plain`), which is what a Ray host receives and
rebuilds the same spec from (:meth:`RunSpec.from_plain`), and what :meth:`RunSpec.replace` applies
dotted overrides to (``compare`` runs every mode and config seed of one spec).
"""
from __future__ import annotations

import dataclasses
import os

import jax
import ml_collections
from jax.sharding import Mesh

from spotlight_jax import registry
from spotlight_jax.config import builders, sections
from spotlight_jax.config.loading import apply_overrides, build_section
from spotlight_jax.config.sections import ProcessConfig
from spotlight_jax.config.settings import (
    RunSettings,
    devices_fit,
    kernel_fits,
    run_settings,
    validate,
)
from spotlight_jax.diffusion import SamplerConfig
from spotlight_jax.emulation import CostConfig, Deployment, DeploymentConfig, TraceConfig, Workload
from spotlight_jax.models import AttentionSpec, MMDiTConfig
from spotlight_jax.parallel import MeshConfig, make_mesh
from spotlight_jax.pretrain import PretrainConfig
from spotlight_jax.prompt_embeddings import PromptSource
from spotlight_jax.rewards.learned import LearnedRewardsConfig
from spotlight_jax.rewards.remote import RemoteRewardConfig
from spotlight_jax.rl import GRPOConfig, NFTConfig


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Every section a run reads, as the frozen dataclasses the library takes.

    ``settings``: the runner's (mode, cadence, budget, evaluation, exploration, transport);
    ``model``, ``mesh``, ``attention``, ``sampler`` (training rollouts), ``eval_sampler``
    (held-out, ODE), ``rl`` (the objective's config), ``pretrain``, ``deployment``, ``trace``,
    ``cost``, ``workload`` (what the cost model charges); ``process`` (emulated devices,
    compilation cache, ``base_checkpoint``); ``diffusers_base``: the diffusers pipeline folder
    the base is converted from, or None; ``embeddings_file`` and ``train_kinds``: where the
    prompts come from (:meth:`prompt_source`); ``remote_reward`` and ``learned_rewards``: where a
    reward server's client and the learned rewards are built from. Built objects (mesh, trainer,
    deployment, prompt source, VAE, the rewards that need building) come from its methods
    (``config.builders``).
    """

    source: dict = dataclasses.field(repr=False, compare=False)
    process: ProcessConfig
    settings: RunSettings
    model: MMDiTConfig
    mesh: MeshConfig
    sampler: SamplerConfig
    eval_sampler: SamplerConfig
    rl: GRPOConfig | NFTConfig
    pretrain: PretrainConfig
    deployment: DeploymentConfig
    trace: TraceConfig
    cost: CostConfig
    workload: Workload
    diffusers_base: str | None
    embeddings_file: str
    train_kinds: str
    remote_reward: RemoteRewardConfig
    learned_rewards: LearnedRewardsConfig

    # -- building the spec -----------------------------------------------------------------
    @classmethod
    def from_config(cls, config, *, check: bool = True) -> RunSpec:
        """Builds every section of ``config`` (a ConfigDict); with ``check`` first validates
        the whole config (:func:`~spotlight_jax.config.settings.validate`: a bad value raises
        a one-line ConfigError naming its field)."""
        if check:
            validate(config)
        p = config.prompts
        return cls(
            source=config.to_dict(), process=sections.process_config(config),
            settings=run_settings(config), model=sections.model_config(config),
            mesh=sections.mesh_config(config), sampler=sections.sampler_config(config),
            eval_sampler=sections.sampler_config(config, evaluation=True),
            rl=sections.rl_config(config), pretrain=sections.pretrain_config(config),
            deployment=sections.deployment_config(config), trace=sections.trace_config(config),
            cost=sections.cost_config(config), workload=sections.workload(config),
            diffusers_base=sections.diffusers_base(config),
            embeddings_file=str(p.embeddings_file or ""), train_kinds=str(p.train_kinds or ""),
            remote_reward=sections.remote_reward_config(config),
            learned_rewards=sections.learned_rewards_config(config))

    @classmethod
    def of(cls, spec_or_config) -> RunSpec:
        """``spec_or_config`` itself when it is a spec, else its spec (for library entry points
        that also take a ConfigDict)."""
        if isinstance(spec_or_config, RunSpec):
            return spec_or_config
        return cls.from_config(spec_or_config)

    def plain(self) -> dict:
        """The config as plain data (nested dicts of numbers, strings, tuples): what a process
        that builds its own objects (a Ray spot host) receives."""
        return self.source

    @classmethod
    def from_plain(cls, data: dict) -> RunSpec:
        """The spec :meth:`plain` came from (not validated again: its run already was, and a
        host need not hold the run's trace file)."""
        return cls.from_config(ml_collections.ConfigDict(data), check=False)

    def replace(self, overrides: dict) -> RunSpec:
        """This run's config with dotted ``overrides`` (``{"mode": "baseline", "seed": 1}``),
        built into a spec again (validated)."""
        config = ml_collections.ConfigDict(self.source)
        return RunSpec.from_config(apply_overrides(config, overrides))

    # -- what it builds --------------------------------------------------------------------
    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def objective(self) -> str:
        return self.settings.objective

    def build_mesh(self, devices=None) -> Mesh:
        """The trainer's mesh over ``devices`` (default: all) with the ``mesh`` section's
        axes."""
        return make_mesh(devices, self.mesh)

    def attention_spec(self, mesh: Mesh | None) -> AttentionSpec:
        """How the trainer's forwards (and the samplers on its mesh) lay out attention: the
        ``attention`` strategy over the mesh's ``sp`` axis when it has one, else dense."""
        return builders.attention_for(self.process.attention, mesh, self.process.attention_impl)

    def make_trainer(self, graphdef, base, mesh=None):
        """The objective's trainer over ``base`` (placed on ``mesh``)."""
        return builders.trainer_of(self.rl, self.sampler, self.process.attention, graphdef,
                                   base, mesh, self.seed, self.process.attention_impl)

    def image_decoder(self):
        """The frozen VAE of a diffusers base (None for a model that draws pixels)."""
        return builders.decoder_of(self.diffusers_base, self.model)

    def load_diffusers_base(self, mesh: Mesh | None = None):
        """``(graphdef, state)`` of the diffusers base's transformer, each parameter streamed
        straight onto its sharding on ``mesh`` (None: the default device)."""
        return builders.transformer_of(self.diffusers_base, self.model, mesh)

    def trainer_devices(self) -> list:
        """This process's devices the trainer uses (``trainer_devices`` of them; 0 = all)."""
        local = list(jax.local_devices())
        return local[:self.settings.trainer_devices] if self.settings.trainer_devices else local

    def prompt_source(self) -> PromptSource:
        """The run's prompts and their model inputs (the world's, or the embedding file's)."""
        return builders.prompts_of(self.model, self.embeddings_file, self.train_kinds)

    def make_deployment(self, rents_spot: bool | None = None) -> Deployment:
        """The emulated deployment (on-demand devices, spot nodes, trace, cost model).
        ``rents_spot`` (default: whether the run's mode uses spot devices): whether the run pays
        for the spot nodes (a ``baseline`` run pays for its on-demand devices only)."""
        if rents_spot is None:
            rents_spot = registry.mode_spec(self.settings.mode).uses_spot
        return builders.deployment_of(self.deployment, self.trace, self.cost, self.workload,
                                      self.sampler.num_steps, rents_spot)

    def register_rewards(self) -> None:
        """Registers the rewards this run names that have to be built first (a reward server's
        client, learned rewards), so that they resolve by name (``rewards.resolve``)."""
        builders.register_rewards(self)

    def cpu_device_count(self) -> int:
        """Emulated CPU devices this run needs (0 = the backend's default)."""
        return build_section({}, lambda: sections.cpu_devices_for(
            self.process.num_cpu_devices, self.settings.mode, self.settings.trainer_devices))

    def check_devices(self, devices) -> None:
        """ConfigErrors for what ``devices`` cannot hold: more trainer devices than are
        present, a mesh the trainer's devices cannot form, or a forced attention kernel that
        cannot run on them."""
        devices_fit(self.settings.trainer_devices, self.cpu_device_count(), self.mesh, devices)
        kernel_fits(self.process.attention_impl, self.model, devices)

    @property
    def compilation_cache_dir(self) -> str:
        return os.path.expanduser(self.process.compilation_cache_dir)
