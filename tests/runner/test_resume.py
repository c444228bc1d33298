"""Checkpoints: straight vs stopped-and-resumed runs give identical parameters (bitwise, CPU);
an 8-device checkpoint restores on 4 devices; a corrupt latest checkpoint falls back."""
import os
import pathlib

import jax
import numpy as np
import pytest
from helpers import MICRO, micro_config  # noqa: F401

from spotlight_jax import runner
from spotlight_jax.config import RunSpec, model_config
from spotlight_jax.models.factory import create_model
from spotlight_jax.runner import checkpointing

ROOT = pathlib.Path(__file__).resolve().parents[2]


def params_of(workdir, c, devices=None):
    graphdef, base = create_model(model_config(c))
    r = runner.build_run(RunSpec.from_config(c), str(workdir), graphdef, base, devices)
    assert checkpointing.restore(r)
    return r


@pytest.mark.parametrize("objective,n_devices", [
    ("flow_grpo", None), ("nft", None),
    # trainer_devices=2 on CPU (one per core): batch split, weights replicated (~30 s)
    pytest.param("nft", 2, marks=pytest.mark.e2e, id="nft-two_devices")])
def test_resume_is_bitwise_identical(tmp_path, base, objective, n_devices):
    graphdef, state = base
    devices = None if n_devices is None else jax.devices()[:n_devices]
    o = {"rl.objective": objective, "rl.nft.times": 2, "rl.nft.eta_rate": 0.25}
    kw = dict(progress=False, devices=devices)
    straight = tmp_path / "straight"
    h1 = runner.build_and_run(RunSpec.from_config(micro_config(3, **o)), str(straight), graphdef,
                              state, **kw)
    resumed = tmp_path / "resumed"
    runner.build_and_run(RunSpec.from_config(micro_config(2, **o)), str(resumed), graphdef, state,
                         **kw)
    h2 = runner.build_and_run(RunSpec.from_config(micro_config(3, **o)), str(resumed), graphdef,
                              state, **kw)
    ra = params_of(straight, micro_config(3, **o), devices)
    rb = params_of(resumed, micro_config(3, **o), devices)
    if n_devices:
        assert len(jax.tree.leaves(ra.trainer.trainable)[0].sharding.device_set) == n_devices
    # nft: the sampling policy θ_old is part of the state (it lags θ from iteration 1 on)
    parts = ra.trainer.state_parts
    assert ("old" in parts) == (objective == "nft")
    for part in parts:
        a, b = getattr(ra.trainer, part), getattr(rb.trainer, part)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    if objective == "nft":
        diff = [np.abs(np.asarray(x) - np.asarray(y)).max() for x, y in zip(
            jax.tree.leaves(ra.trainer.old), jax.tree.leaves(ra.trainer.trainable))]
        assert max(diff) > 0
    assert [h["reward_mean"] for h in h1 if "reward_mean" in h] == \
        [h["reward_mean"] for h in h2 if "reward_mean" in h]


@pytest.mark.slow  # ~70 s: an update over 8 emulated devices on 2 cores
def test_checkpoint_from_8_devices_restores_on_4(tmp_path, base):
    graphdef, state = base
    c = micro_config(1)
    runner.build_and_run(RunSpec.from_config(c), str(tmp_path), graphdef, state, progress=False,
                         devices=jax.devices())
    r8 = params_of(tmp_path, c, jax.devices())
    r4 = params_of(tmp_path, c, jax.devices()[:4])
    leaves4 = jax.tree.leaves(r4.trainer.trainable)
    assert all(len(x.sharding.device_set) <= 4 for x in leaves4)
    for x, y in zip(jax.tree.leaves(r8.trainer.trainable), leaves4):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_resuming_with_another_objective_names_both(tmp_path, base):
    graphdef, state = base
    runner.build_and_run(RunSpec.from_config(micro_config(1)), str(tmp_path), graphdef, state,
                         progress=False)
    r = runner.build_run(RunSpec.from_config(micro_config(2, **{"rl.objective": "nft"})),
                         str(tmp_path),
                        graphdef, state)
    with pytest.raises(ValueError, match="holds a rl.objective='flow_grpo' run.*'nft'"):
        checkpointing.restore(r)


def test_corrupt_latest_checkpoint_falls_back_with_warning(tmp_path, base, caplog):
    graphdef, state = base
    c = micro_config(2)
    runner.build_and_run(RunSpec.from_config(c), str(tmp_path), graphdef, state, progress=False)
    ckdir = tmp_path / "checkpoints"
    latest = max(int(p.name) for p in ckdir.iterdir() if p.name.isdigit())
    # truncate every array file of the latest checkpoint (a half-written save)
    for root, _, files in os.walk(ckdir / str(latest)):
        for f in files:
            if not f.endswith(".json") and "meta" not in root:
                open(os.path.join(root, f), "wb").close()
    graphdef2, base2 = create_model(model_config(c))
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef2, base2)
    with caplog.at_level("WARNING"):
        assert checkpointing.restore(r)
    assert r.iteration == latest - 1
    assert "unreadable" in caplog.text


def test_metric_writer_drops_rows_a_resumed_run_redoes(tmp_path):
    from spotlight_jax.io.metrics import MetricWriter, read_jsonl
    w = MetricWriter(str(tmp_path), "rl", tensorboard=False)
    for step in range(6):
        w.write(step, x=float(step))
    assert w.drop_after(3) == 2
    assert [r["step"] for r in read_jsonl(w.path)] == [0, 1, 2, 3]
    assert w.drop_after(3) == 0 and not os.path.exists(w.path + ".tmp")
    w.write(4, x=4.5)                                   # the redone iteration, once
    assert [(r["step"], r["x"]) for r in read_jsonl(w.path)][-2:] == [(3, 3.0), (4, 4.5)]
    assert w.drop_after(-1) == 5 and read_jsonl(w.path) == []
    assert MetricWriter(str(tmp_path / "new"), "rl", tensorboard=False).drop_after(0) == 0


@pytest.mark.e2e   # ~30 s each; the default suite checks the pipelined batch in test_modes
@pytest.mark.parametrize("objective", ["flow_grpo", "nft"])
def test_pipelined_resume_is_bitwise_identical_with_the_ready_batch(tmp_path, base, objective):
    """spotlight_pipelined checkpoints the batch its spot devices sampled for the next iteration
    (and the policy that sampled it): a stopped and resumed run trains on the same batch."""
    graphdef, state = base
    o = {"rl.objective": objective, "rl.nft.times": 2, "rl.nft.eta_rate": 0.25,
         "rl.nft.anchor": "sampler", "mode": "spotlight_pipelined",
         "explore.max_extra_per_prompt": 4,
         "deployment.rollout_on_groups": "false", "deployment.fleet": False}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    h1 = runner.build_and_run(RunSpec.from_config(micro_config(2, **o)), str(straight), graphdef,
                              state,
                    progress=False)
    runner.build_and_run(RunSpec.from_config(micro_config(1, **o)), str(resumed), graphdef, state,
                         progress=False)
    assert any(p.name == "mode_1.npz" for p in (resumed / "checkpoints").iterdir())
    # the resumed run's first iteration trains on the batch restored from mode_1.npz
    h2 = runner.build_and_run(RunSpec.from_config(micro_config(2, **o)), str(resumed), graphdef,
                              state, progress=False)
    assert [h.get("pipelined") for h in h1[1:]] == [h.get("pipelined") for h in h2[1:]] == [0, 1]
    ra, rb = params_of(straight, micro_config(2, **o)), params_of(resumed, micro_config(2, **o))
    for part in ra.trainer.state_parts:
        for x, y in zip(jax.tree.leaves(getattr(ra.trainer, part)),
                        jax.tree.leaves(getattr(rb.trainer, part))):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    ea, eb = ra.mode.extra_state(), rb.mode.extra_state()
    assert ea is not None and sorted(ea) == sorted(eb)
    assert any(k.startswith("generator/") for k in ea) == (objective == "nft")
    for key in ea:
        np.testing.assert_array_equal(ea[key], eb[key])
    assert [h["reward_mean"] for h in h1 if "reward_mean" in h] == \
        [h["reward_mean"] for h in h2 if "reward_mean" in h]
