"""Post-training by a two-process trainer job (jax.distributed over gloo, 2 CPU devices each):
process 0 runs the controller, process 1 follows its commands. The run must match the same run
in one process over 4 devices, and its checkpoint must restore in single-process mode.

Tolerance: as in test_cluster_trainer, the cross-process all-reduce sums in gloo's order, so the
weights can differ in the last bits after each update (1e-3 of the largest weight change is
allowed); rollouts and evaluation run on process 0's two devices in the job and on four in the
reference, which splits the batch differently. Rewards are thresholded detector scores, so tiny
weight differences change them rarely; the per-iteration rewards must agree to 1e-4 and the
number of iterations, prompts and seeds exactly.
"""
import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import (
    MICRO_RUN_OVERRIDES,
    TINY,
    child_env,
    config_flags,
    free_port,
    micro_config,
    micro_model,
)

from spotlight_jax import checkpoint, runner
from spotlight_jax.config import RunSpec
from spotlight_jax.runner import checkpointing

ITERATIONS = 3


def _overrides(base_dir):
    return {**MICRO_RUN_OVERRIDES, "rl.iterations": ITERATIONS, "rl.eval_every": ITERATIONS,
            "base_checkpoint": base_dir}


@pytest.mark.cluster
def test_two_process_job_matches_single_process_run_and_restores_there(tmp_path):
    c = micro_config(ITERATIONS, **{"rl.eval_every": ITERATIONS})
    _, graphdef, base = micro_model()    # perturbed: diverse images, so groups have signal
    base_dir = str(tmp_path / "base")
    checkpoint.save_params(base_dir, base, {})

    # the job: controller in process 0, process 1 follows
    port = free_port()
    job_dir = tmp_path / "job"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "spotlight_jax.main", f"--coordinator=127.0.0.1:{port}",
         "--num_processes=2", f"--process_id={i}", "--cpu_devices=2", f"--config={TINY}",
         *config_flags(_overrides(base_dir)), f"--workdir={job_dir}"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    assert "stop after 3 updates" in outs[1], outs[1][-2000:]
    printed = [json.loads(line) for line in outs[0].splitlines() if line.startswith('{"process"')]
    assert printed and printed[0]["iterations"] == ITERATIONS

    # the reference: one process, 4 devices
    ref_dir = tmp_path / "ref"
    ref = runner.run(RunSpec.of(c), str(ref_dir), graphdef, base, progress=False,
                         devices=jax.devices()[:4])

    # the job's checkpoint restores in single-process mode
    run = runner.RunState(RunSpec.of(c), str(job_dir), graphdef, base, jax.devices()[:4])
    assert checkpointing.restore(run)
    assert run.iteration == ITERATIONS
    got = run.history
    assert [h["iteration"] for h in got] == [h["iteration"] for h in ref]
    assert all(h["reward_std"] > 0 for h in ref[1:])     # GRPO had advantages to follow
    for g, r in zip(got[1:], ref[1:]):
        np.testing.assert_allclose(g["reward_mean"], r["reward_mean"], atol=1e-4)
        np.testing.assert_allclose(g["loss"], r["loss"], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(got[-1]["val_reward"], ref[-1]["val_reward"], atol=1e-4)

    want_run = runner.RunState(RunSpec.of(c), str(ref_dir), graphdef, base, jax.devices()[:4])
    assert checkpointing.restore(want_run)
    before = jax.tree.leaves(runner.RunState(RunSpec.of(c), str(tmp_path / "fresh"), graphdef, base,
                                            jax.devices()[:4]).trainer.trainable)
    want = jax.tree.leaves(want_run.trainer.trainable)
    have = jax.tree.leaves(run.trainer.trainable)
    change = max(float(np.abs(np.asarray(w) - np.asarray(b)).max())
                 for w, b in zip(want, before))
    worst = max(float(np.abs(np.asarray(h) - np.asarray(w)).max()) for h, w in zip(have, want))
    print(f"job vs one process after {ITERATIONS} iterations: max |dparam| {worst:.2e}, "
          f"total change {change:.2e}")
    assert change > 0 and worst <= 1e-3 * change, (worst, change)
    # the optimizer state was saved too (Adam moments moved)
    mu = [np.asarray(x) for x in jax.tree.leaves(run.trainer.opt_state) if np.ndim(x) > 0]
    assert any(np.abs(m).max() > 0 for m in mu)
