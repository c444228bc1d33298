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
    qwen_fixture_overrides,
)

from spotlight_jax import runner
from spotlight_jax.config import RunSpec
from spotlight_jax.io import checkpoints
from spotlight_jax.runner import checkpointing

ITERATIONS = 3


def _overrides(base_dir):
    return {**MICRO_RUN_OVERRIDES, "rl.iterations": ITERATIONS, "rl.eval_every": ITERATIONS,
            "base_checkpoint": base_dir}


def _job(job_dir, overrides: dict) -> list[str]:
    """Runs the two-process job (controller in process 0, process 1 follows) on ``overrides``;
    returns both processes' output."""
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "spotlight_jax.main", f"--coordinator=127.0.0.1:{port}",
         "--num_processes=2", f"--process_id={i}", "--cpu_devices=2", f"--config={TINY}",
         *config_flags(overrides), f"--workdir={job_dir}"],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    assert f"stop after {ITERATIONS} updates" in outs[1], outs[1][-2000:]
    printed = [json.loads(line) for line in outs[0].splitlines() if line.startswith('{"process"')]
    assert printed and printed[0]["iterations"] == ITERATIONS
    return outs


def _matches_reference(spec, job_dir, ref_dir, graphdef, base):
    """The one-process run over 4 devices; the job's checkpoint restores in single-process mode
    and its rows match the reference's (the module docstring's tolerances)."""
    ref = runner.build_and_run(spec, str(ref_dir), graphdef, base, progress=False,
                     devices=jax.devices()[:4])
    run = runner.build_run(spec, str(job_dir), graphdef, base, jax.devices()[:4])
    assert checkpointing.restore(run)
    assert run.iteration == ITERATIONS
    got = run.history
    assert [h["iteration"] for h in got] == [h["iteration"] for h in ref]
    assert all(h["reward_std"] > 0 for h in ref[1:])     # the groups had advantages to follow
    for g, r in zip(got[1:], ref[1:]):
        np.testing.assert_allclose(g["reward_mean"], r["reward_mean"], atol=1e-4)
        np.testing.assert_allclose(g["loss"], r["loss"], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(got[-1]["val_reward"], ref[-1]["val_reward"], atol=1e-4)
    want_run = runner.build_run(spec, str(ref_dir), graphdef, base, jax.devices()[:4])
    assert checkpointing.restore(want_run)
    before = jax.tree.leaves(runner.build_run(spec, str(ref_dir) + "_fresh", graphdef, base,
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


@pytest.mark.cluster
def test_two_process_job_matches_single_process_run_and_restores_there(tmp_path):
    c = micro_config(ITERATIONS, **{"rl.eval_every": ITERATIONS})
    _, graphdef, base = micro_model()    # perturbed: diverse images, so groups have signal
    base_dir = str(tmp_path / "base")
    checkpoints.save_params(base_dir, base, {})
    _job(tmp_path / "job", _overrides(base_dir))
    _matches_reference(RunSpec.from_config(c), tmp_path / "job", tmp_path / "ref", graphdef, base)


@pytest.mark.cluster
def test_two_process_job_post_trains_a_diffusers_base(tmp_path):
    """The tiny random Qwen-Image pipeline (transformer + VAE) as the job's base: both
    processes load it from the diffusers folder, prompts come from an embedding file, the VAE
    decodes on process 0; the run matches the one-process run on the same base."""
    overrides = {**MICRO_RUN_OVERRIDES, "rl.iterations": ITERATIONS,
                 "rl.eval_every": ITERATIONS, **qwen_fixture_overrides(tmp_path, "nft")}
    outs = _job(tmp_path / "job", overrides)
    assert "diffusers" in outs[0], outs[0][-2000:]
    spec = RunSpec.from_config(micro_config(ITERATIONS, **overrides))
    graphdef, base = spec.load_diffusers_base()
    _matches_reference(spec, tmp_path / "job", tmp_path / "ref", graphdef, base)

