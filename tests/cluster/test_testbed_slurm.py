"""The SLURM launchers users get (launch/slurm/spotlight.sbatch and spot_hosts.sbatch, not test
copies) run on a local SLURM over the network test bed: the trainer job on the on-demand
partition starts the Ray head with the job's token, a spot job array joins from the spot
partition, and `spotlight` post-trains to completion with its exploration on the spot hosts.
~3 minutes: with -m slow."""
import json
import os
import sys
import time

import pytest
from helpers import MICRO_RUN_OVERRIDES, config_flags, micro_model

from spotlight_jax.cluster import testbed, testbed_slurm
from spotlight_jax.io import checkpoints

pytest.importorskip("ray")
pytestmark = [pytest.mark.cluster, pytest.mark.slow,
              pytest.mark.skipif(testbed.unavailable() is not None,
                                 reason=str(testbed.unavailable())),
              pytest.mark.skipif(testbed_slurm.unavailable() is not None,
                                 reason=str(testbed_slurm.unavailable()))]
ITERATIONS = 2
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _until(cond, within, what):
    deadline = time.time() + within
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(1.0)
    raise AssertionError(f"{what} within {within:.0f} s")


def test_the_sbatch_launchers_post_train_on_a_local_slurm(tmp_path):
    _, _, base = micro_model()
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed, \
            testbed_slurm.LocalSlurm(bed) as slurm:
        job_dir = os.path.join(bed.shared, "job")
        base_dir = os.path.join(bed.shared, "base")
        checkpoints.save_params(base_dir, base, {})
        env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               "WORKDIR": job_dir, "CONFIG": "configs/tiny.py", "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": ""}
        run_flags = config_flags({
            **MICRO_RUN_OVERRIDES, "mode": "spotlight", "base_checkpoint": base_dir,
            "rl.iterations": ITERATIONS,
            "rl.eval_every": ITERATIONS, "explore.max_extra_per_prompt": 4,
            "deployment.rollout_on_groups": "false", "deployment.spot_nodes": 2,
            "deployment.spot_devices_per_node": 2, "deployment.ray_host_wait_s": 600.0,
            "deployment.ray_explore_deadline": False,
            "deployment.spot_regroup_precompile": False, "trace.rate_per_node_hour": 0.0})
        trainer = slurm.sbatch(
            "--partition=ondemand", "--gpus-per-node=0", "--cpus-per-task=2", "--time=30",
            f"--output={bed.shared}/trainer-%j.log", "launch/slurm/spotlight.sbatch",
            "--cpu_devices=4", *run_flags, cwd=CHECKOUT, env=env)
        _until(lambda: os.path.exists(os.path.join(job_dir, "ray_head_address.txt")), 120,
               "the trainer job wrote the head's address")
        spot = slurm.sbatch(
            "--array=0-1", "--partition=spot", "--gpus-per-node=0", "--cpus-per-task=1",
            "--time=30", f"--output={bed.shared}/spot-%A_%a.log",
            "launch/slurm/spot_hosts.sbatch", cwd=CHECKOUT, env=env)
        log = os.path.join(bed.shared, f"trainer-{trainer}.log")

        def finished():
            state = slurm.job(trainer).get("JobState", "")
            return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None

        state = _until(finished, 480, "the trainer job finished")
        assert state == "COMPLETED", open(log).read()[-4000:]
        spot_jobs = [j for j in slurm.jobs() if j["id"].startswith(f"{spot}_")]
        assert sorted(j["nodes"] for j in spot_jobs) == ["h1", "h2"]
        slurm.run("scancel", str(spot))
        token = os.path.join(job_dir, "ray_token")
        assert oct(os.stat(token).st_mode & 0o777) == "0o600"
        rows = [json.loads(line) for line in open(os.path.join(job_dir, "rl.jsonl"))]
        trained = [r for r in rows if "loss" in r]
        assert [r["step"] for r in trained] == list(range(1, ITERATIONS + 1))
        assert all(r["explore_hosts"] == 2 and r["explore_candidates"] > 0 for r in trained)
        assert "val_reward" in rows[-1]
