"""Every mode and objective is declared once (``spotlight_jax.registry``), and the runner, the
trainer layer and config validation all read that one list."""
import collections

import pytest
from helpers import micro_config

from spotlight_jax import registry, rl, runner
from spotlight_jax.config import ConfigError, cpu_device_count, validate


def test_every_mode_is_declared_once_and_has_one_runner_class():
    names = [m.name for m in registry.MODES] + [registry.COMPARE.name]
    assert [n for n, c in collections.Counter(names).items() if c > 1] == []
    assert list(runner.MODES) == list(registry.mode_names())
    for name, cls in runner.MODES.items():
        assert cls.name == name
        assert cls.uses_spot == registry.mode_spec(name).uses_spot
    assert len({id(c) for c in runner.MODES.values()}) == len(runner.MODES)


def test_every_objective_is_declared_once_and_has_one_trainer():
    assert len(set(registry.OBJECTIVES)) == len(registry.OBJECTIVES)
    assert set(rl.TRAINERS) == set(registry.OBJECTIVES)
    assert len(set(rl.TRAINERS.values())) == len(rl.TRAINERS)


def test_a_renamed_mode_fails_naming_its_new_name():
    with pytest.raises(ValueError, match=r"mode='flow_grpo' was renamed to 'baseline'"):
        registry.mode_spec("flow_grpo")
    with pytest.raises(ConfigError, match=r"renamed to 'baseline'"):
        validate(micro_config(1, mode="flow_grpo"))
    with pytest.raises(ConfigError, match=r"mode='nope': choose one of \('baseline'"):
        cpu_device_count(micro_config(1, mode="nope"))


def test_spot_modes_get_the_deployments_devices():
    for spec in (*registry.MODES, registry.COMPARE):
        c = micro_config(1, mode=spec.name, num_cpu_devices=12, trainer_devices=1)
        assert cpu_device_count(c) == (12 if spec.uses_spot else 0), spec.name
