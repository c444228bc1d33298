"""The RunSpec: a config validated and built once; its plain data rebuilds the same spec (what a
Ray host receives); dotted overrides rebuild it (compare's modes and seeds); the runner takes
nothing else."""
import dataclasses

import pytest
from helpers import micro_config

from spotlight_jax import config as conf
from spotlight_jax import runner
from spotlight_jax.config import ConfigError, RunSpec


def test_the_spec_holds_every_section_as_the_config_builds_it():
    c = micro_config(2, **{"rl.objective": "nft", "mode": "spotlight"})
    spec = RunSpec.from_config(c)
    assert spec.model == conf.model_config(c)
    assert spec.mesh == conf.mesh_config(c)
    assert spec.sampler == conf.sampler_config(c)
    assert spec.eval_sampler == conf.sampler_config(c, evaluation=True)
    assert spec.rl == conf.rl_config(c)
    assert spec.settings == conf.run_settings(c)
    assert spec.deployment == conf.deployment_config(c)
    assert spec.trace == conf.trace_config(c)
    assert spec.workload == conf.workload(c)
    assert spec.cpu_device_count() == conf.cpu_device_count(c)
    assert RunSpec.of(spec) is spec and RunSpec.of(c) == spec       # the entry points' door


def test_plain_data_rebuilds_the_same_spec():
    spec = RunSpec.from_config(micro_config(2, **{"deployment.transport": "emulated"}))
    again = RunSpec.from_plain(spec.plain())
    for f in dataclasses.fields(RunSpec):
        if f.compare:
            assert getattr(again, f.name) == getattr(spec, f.name), f.name


def test_overrides_rebuild_a_validated_spec():
    spec = RunSpec.from_config(micro_config(2))
    other = spec.replace({"mode": "spotlight", "seed": 3})
    assert (other.settings.mode, other.seed) == ("spotlight", 3)
    assert (spec.settings.mode, spec.seed) != ("spotlight", 3)     # the first is unchanged
    assert other.rl == spec.rl and other.model == spec.model
    with pytest.raises(ConfigError, match="rl.lr=-1.0"):
        spec.replace({"rl.lr": -1.0})


def test_a_bad_config_fails_once_at_the_boundary_and_the_runner_takes_only_specs():
    with pytest.raises(ConfigError, match="rl.group_size=1"):
        RunSpec.from_config(micro_config(1, **{"rl.group_size": 1}))
    with pytest.raises(TypeError, match="RunSpec"):
        runner.build_run(micro_config(1), "/tmp/unused", None, None)


def test_the_spec_checks_what_the_devices_present_can_hold():
    import jax

    devices = jax.devices()[:2]
    RunSpec.from_config(micro_config(1, **{"trainer_devices": 2})).check_devices(devices)
    with pytest.raises(ConfigError, match="trainer_devices=3: only 2 devices are present"):
        RunSpec.from_config(micro_config(1, **{"trainer_devices": 3})).check_devices(devices)
    with pytest.raises(ConfigError, match="mesh.data=3, mesh.fsdp=1, mesh.sp=1: cannot be formed"):
        RunSpec.from_config(micro_config(1, **{"mesh.data": 3})).check_devices(devices)
