"""The SLURM launchers users get (launch/slurm/spotlight.sbatch and spot_hosts.sbatch, not test
copies) run on a local SLURM over the network test bed: the trainer job on the on-demand
partition starts the Ray head with the job's token, a spot job array joins from the spot
partition, and `spotlight` post-trains to completion with its exploration on the spot hosts.
~3 minutes: with -m slow."""
import json
import os

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
    return testbed.wait_until(cond, within, what, every=1.0)


def _submit(slurm, bed, iterations):
    """The trainer job, then (once it has written the head's address) the spot job array of 2,
    as a user submits them; returns ``(trainer id, spot array id, job folder)``."""
    _, _, base = micro_model()
    job_dir = os.path.join(bed.shared, "job")
    base_dir = os.path.join(bed.shared, "base")
    checkpoints.save_params(base_dir, base, {})
    run_flags = config_flags({
        **MICRO_RUN_OVERRIDES, "mode": "spotlight", "base_checkpoint": base_dir,
        "rl.iterations": iterations, "rl.eval_every": iterations,
        "explore.max_extra_per_prompt": 4, "deployment.rollout_on_groups": "false",
        "deployment.spot_nodes": 2, "deployment.spot_devices_per_node": 2,
        "deployment.ray_host_wait_s": 600.0, "deployment.ray_explore_deadline": False,
        "deployment.spot_regroup_precompile": False, "trace.rate_per_node_hour": 0.0})
    trainer, spot = slurm.submit_spotlight(job_dir, run_flags, 2, "configs/tiny.py", CHECKOUT)
    return trainer, spot, job_dir


def _finish(slurm, bed, trainer, within=480):
    def finished():
        state = slurm.job(trainer).get("JobState", "")
        return state if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None

    state = _until(finished, within, "the trainer job finished")
    log = os.path.join(bed.shared, f"trainer-{trainer}.log")
    assert state == "COMPLETED", open(log).read()[-4000:]


def _trained(job_dir):
    rows = [json.loads(line) for line in open(os.path.join(job_dir, "rl.jsonl"))]
    return rows, [r for r in rows if "loss" in r]


def test_the_sbatch_launchers_post_train_on_a_local_slurm(tmp_path):
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed, \
            testbed_slurm.LocalSlurm(bed) as slurm:
        trainer, spot, job_dir = _submit(slurm, bed, ITERATIONS)
        _finish(slurm, bed, trainer)
        spot_jobs = [j for j in slurm.jobs() if j["id"].startswith(f"{spot}_")]
        assert sorted(j["nodes"] for j in spot_jobs) == ["h1", "h2"]
        slurm.run("scancel", str(spot))
        token = os.path.join(job_dir, "ray_token")
        assert oct(os.stat(token).st_mode & 0o777) == "0o600"
        rows, trained = _trained(job_dir)
        assert [r["step"] for r in trained] == list(range(1, ITERATIONS + 1))
        assert all(r["explore_hosts"] == 2 and r["explore_candidates"] > 0 for r in trained)
        assert "val_reward" in rows[-1]


def test_a_spot_host_preempted_by_a_higher_priority_job_is_requeued_and_nothing_is_lost(
        tmp_path):
    """An `urgent` job takes h1: SLURM preempts its spot job (REQUEUE: SIGTERM, then SIGKILL
    after KillWait), the run goes on with h2 and every iteration trains on a whole batch, no
    request completed twice; the spot job comes back on h1 once the urgent job ends."""
    iterations = 6
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed, \
            testbed_slurm.LocalSlurm(bed) as slurm:
        trainer, spot, job_dir = _submit(slurm, bed, iterations)
        _until(lambda: os.path.exists(os.path.join(job_dir, "rl.jsonl"))
               and len(_trained(job_dir)[1]) >= 1, 300, "the first iteration trained")
        on_h1 = next(j["id"] for j in slurm.jobs()
                     if j["id"].startswith(f"{spot}_") and j["nodes"] == "h1")
        slurm.sbatch("--partition=urgent", "--nodelist=h1", "--exclusive", "--time=5",
                     f"--output={bed.shared}/urgent-%j.log", "--wrap", "sleep 20",
                     cwd=bed.shared)
        _until(lambda: int(slurm.job(on_h1).get("Restarts", "0")) >= 1, 120,
               "the spot job on h1 was preempted and requeued")
        _finish(slurm, bed, trainer)
        _until(lambda: slurm.job(on_h1).get("JobState") == "RUNNING", 120,
               "the requeued spot job ran again")
        slurm.run("scancel", str(spot))
        _, trained = _trained(job_dir)
        assert [r["step"] for r in trained] == list(range(1, iterations + 1))
        assert sum(r["explore_duplicates"] for r in trained) == 0
        assert sum(r["explore_rejected"] + r["explore_dropped"] for r in trained) == 0
        assert all(r["explore_candidates"] > 0 for r in trained)
        # the preemption reached the run (a host lost in a rollout phase or an exploration),
        # and the requeued job's host came back (started again after the first iteration)
        assert any(r.get("ray_hosts_lost") or r.get("explore_hosts_dead")
                   or r.get("explore_lost") for r in trained)
        assert sum(r.get("ray_hosts_started", 0) for r in trained[1:]) >= 1
        assert sum(r.get("ray_duplicates", 0) for r in trained) == 0


def test_the_trainer_job_requeued_resumes_from_its_checkpoint_and_the_spot_hosts_rejoin(
        tmp_path):
    """`scontrol requeue` kills the trainer job (and its Ray head) after its second iteration;
    SLURM runs it again, it resumes from its checkpoint in the job folder with a new head at the
    same address, the spot jobs' hosts join it again, and the run completes."""
    iterations = 5
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed, \
            testbed_slurm.LocalSlurm(bed) as slurm:
        trainer, spot, job_dir = _submit(slurm, bed, iterations)
        _until(lambda: os.path.exists(os.path.join(job_dir, "rl.jsonl"))
               and len(_trained(job_dir)[1]) >= 2, 300, "two iterations trained")
        out = slurm.run("scontrol", "requeue", str(trainer))
        assert out.returncode == 0, out.stderr
        _until(lambda: int(slurm.job(trainer).get("Restarts", "0")) >= 1, 120,
               "the trainer job requeued")
        _finish(slurm, bed, trainer, within=600)
        slurm.run("scancel", str(spot))
        log = open(os.path.join(bed.shared, f"trainer-{trainer}.log")).read()
        assert "resumed from iteration" in log, log[-3000:]
        _, trained = _trained(job_dir)
        assert sorted({r["step"] for r in trained}) == list(range(1, iterations + 1))
        assert trained[-1]["step"] == iterations
        # after the restart the exploration ran on the rejoined spot hosts
        assert trained[-1]["explore_hosts"] == 2
