"""The runner's interfaces: the trainer (``rl.Trainer``: both objectives' trainers and the
cluster's multi-process ``TrainerJob``; advantages are the trainer's to compute from its own
config) and the explorer (``explore.Explorer``: in-process and the emulated spot fleet)."""
import inspect

import numpy as np
import pytest

from spotlight_jax import rl
from spotlight_jax.cluster.job import TrainerJob

MEMBERS = [n for n in dir(rl.Trainer) if not n.startswith("_")]


@pytest.mark.parametrize("cls", [rl.NFTTrainer, rl.GRPOTrainer, TrainerJob])
def test_every_trainer_has_the_protocols_members(cls):
    assert {"update", "advantages", "work", "sampling_state", "exported_lora"} <= set(MEMBERS)
    for name in MEMBERS:
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
        want = getattr(rl.Trainer, name)
        if inspect.isfunction(want):   # the same parameters, by name
            got = inspect.signature(getattr(cls, name)).parameters
            assert list(got) == list(inspect.signature(want).parameters), (cls, name)


class _Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _advantages(**cfg):
    t = object.__new__(rl.GRPOTrainer)     # only the config is read
    t.cfg = _Cfg(adv_clip=5.0, **cfg)
    return t


def test_the_trainer_computes_advantages_from_its_config():
    rewards = np.array([0.0, 1.0, 0.5, 0.5, 0.2, 0.8])
    ids = np.array([0, 0, 1, 1, 2, 2])
    for global_std in (False, True):
        t = _advantages(advantage="reward", global_std=global_std)
        assert not t.needs_reward_parts
        np.testing.assert_array_equal(t.advantages(rewards, ids),
                                      rl.advantages(rewards, ids, global_std=global_std))
    parts = np.stack([rewards, 1 - rewards], axis=1)
    t = _advantages(advantage="decoupled", global_std=False)
    assert t.needs_reward_parts
    np.testing.assert_array_equal(t.advantages(rewards, ids, parts),
                                  rl.decoupled_advantages(parts, ids))
    with pytest.raises(ValueError, match="needs the reward's parts"):
        t.advantages(rewards, ids)


def test_every_explorer_scores_through_the_explorer_protocol():
    from spotlight_jax.explore.explorer import Explorer, LocalExplorer
    from spotlight_jax.runner.backends.emulated_fleet import FleetExplorer
    from spotlight_jax.runner.backends.ray_explorer import RayExplorer

    want = inspect.signature(Explorer.score).parameters
    for cls in (LocalExplorer, FleetExplorer, RayExplorer):
        assert list(inspect.signature(cls.score).parameters) == list(want), cls
