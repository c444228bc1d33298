"""The loop's compiled programs move data between host and devices only where the code says so.

A rollout chunk (the engine's sampling of a chunk, scored as it finishes), an update step of
each objective, and exploration's scoring run under ``jax.transfer_guard("disallow")``: an
implicit transfer (a numpy array or Python scalar handed to a jitted program, ``float()`` of a
device value) fails, while the explicit ``jax.device_put`` / ``jax.device_get`` pass. A stray
conversion inside a step is caught here, on CPU, before it costs a GPU a synchronisation.
(On the CPU backend a device-to-host read is not a transfer, so this checks the host-to-device
direction; the code reads results with ``jax.device_get``.)"""
import jax
import numpy as np
import pytest
from helpers import mode_config

from spotlight_jax import runner
from spotlight_jax.config import RunSpec
from spotlight_jax.diffusion.engine import candidate_seeds
from spotlight_jax.runner.update import train_on


@pytest.mark.parametrize("objective", ["nft", "flow_grpo"])
def test_rollout_update_and_exploration_make_no_implicit_transfer(tmp_path, base, objective):
    graphdef, state = base
    c = mode_config("baseline", iterations=1, objective=objective)
    run = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    prompts = run.prompts(0)
    G = c.rl.group_size
    seeds = [candidate_seeds(c.seed, 0, i, G) for i in range(len(prompts))]
    for attempt in range(2):          # the first compiles, the second runs the cached programs
        with jax.transfer_guard("disallow"):
            # the rollout phase on the trainer's devices: the engine's chunks, scored as they end
            batch, _ = run.direct.rollout(attempt, prompts, seeds)
            metrics = train_on(run, batch, attempt, prompts)
            scored = run.explorer.score(run.trainer.sampling_state(), prompts, seeds)
        assert np.isfinite(metrics["loss"])
        assert len(scored) == len(prompts) and all(len(r) == G for r in scored)
    # the guard is on: an implicit transfer inside it fails
    with jax.transfer_guard("disallow"), pytest.raises(Exception, match="Disallowed"):
        jax.jit(lambda x: x + 1)(np.ones(2, np.float32))
