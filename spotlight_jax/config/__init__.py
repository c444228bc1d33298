"""The config boundary: a ConfigDict (``configs/*.py`` plus ``--config.*`` overrides) becomes the
frozen, validated :class:`RunSpec` the rest of the project takes.

Parsing: ``loading`` (config files, dotted overrides, the one-line :class:`ConfigError`),
``sections`` (each section -> the library's frozen dataclass: ``model_config``,
``sampler_config``, ``rl_config``, ``deployment_config``, ..., validated, with no side effects),
``settings`` (the runner's :class:`RunSettings` and :func:`validate` of a whole config).
Building: ``build`` (objects from the parsed sections: trainer, base, VAE, prompt source, mesh,
deployment, the rewards that need building). ``spec``: :class:`RunSpec`, parsed once per run,
whose methods build what a run needs.
"""
from spotlight_jax.config.builders import (
    attention_spec,
    build_mesh,
    image_decoder,
    load_diffusers_base,
    make_deployment,
    make_trainer,
    prompt_source,
    register_rewards,
)
from spotlight_jax.config.loading import (
    CONFIG_DIR,
    ConfigError,
    apply_overrides,
    load_config,
    pick_fields,
)
from spotlight_jax.config.sections import (
    GRPO_LR,
    GRPO_REWARD,
    NFT_LR,
    NFT_REWARD,
    REMOTE_REWARD,
    RUN_MODEL_FIELDS,
    SHARED_INIT_BITS,
    ProcessConfig,
    cost_config,
    cpu_device_count,
    deployment_config,
    diffusers_base,
    eval_reward,
    mesh_config,
    mode_spec,
    model_config,
    objective,
    pretrain_config,
    process_config,
    remote_reward_config,
    rl_config,
    sampler_config,
    trace_config,
    train_reward,
    workload,
)
from spotlight_jax.config.settings import (
    ExploreSettings,
    RunSettings,
    check_devices,
    run_settings,
    validate,
)
from spotlight_jax.config.spec import RunSpec

__all__ = [
    "CONFIG_DIR", "ConfigError", "ExploreSettings", "GRPO_LR", "GRPO_REWARD", "NFT_LR",
    "NFT_REWARD", "ProcessConfig", "REMOTE_REWARD", "RUN_MODEL_FIELDS", "RunSettings", "RunSpec",
    "SHARED_INIT_BITS", "apply_overrides", "attention_spec", "build_mesh", "check_devices",
    "cost_config", "cpu_device_count", "deployment_config", "diffusers_base", "eval_reward",
    "image_decoder", "load_config", "load_diffusers_base", "make_deployment", "make_trainer",
    "mesh_config", "mode_spec", "model_config", "objective", "pick_fields", "pretrain_config",
    "process_config", "prompt_source", "register_rewards", "remote_reward_config",
    "rl_config", "run_settings", "sampler_config", "trace_config", "train_reward", "validate",
    "workload",
]
