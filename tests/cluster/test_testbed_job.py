"""The trainer's two-process job across two hosts of the network test bed: jax.distributed with
its coordinator at h0's cluster address, gloo collectives between h0 and h1, the base model and
the job folder on the shared folder, each host with its own /tmp. The run must match the same
run in one process (the tolerances of test_cluster_job) and restore there."""
import json
import os
import sys

import pytest
from helpers import TINY, child_env, config_flags, micro_config, micro_model
from test_cluster_job import ITERATIONS, _matches_reference, _overrides

from spotlight_jax.cluster import testbed
from spotlight_jax.config import RunSpec
from spotlight_jax.io import checkpoints

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(testbed.unavailable() is not None,
                                 reason=str(testbed.unavailable()))]
PORT = 12355


def test_two_process_job_across_two_hosts_matches_the_single_process_run(tmp_path):
    c = micro_config(ITERATIONS, **{"rl.eval_every": ITERATIONS})
    _, graphdef, base = micro_model()
    with testbed.TestBed(2, str(tmp_path / "bed")) as bed:
        base_dir = os.path.join(bed.shared, "base")
        job_dir = os.path.join(bed.shared, "job")
        checkpoints.save_params(base_dir, base, {})
        coordinator = f"{bed.hosts[0].ip}:{PORT}"
        logs = [str(tmp_path / f"process{i}.log") for i in range(2)]
        procs = [bed.spawn(h.name, [
            sys.executable, "-m", "spotlight_jax.main", f"--coordinator={coordinator}",
            "--num_processes=2", f"--process_id={i}", "--cpu_devices=2", f"--config={TINY}",
            *config_flags(_overrides(base_dir)), f"--workdir={job_dir}"],
            env=child_env(), log=logs[i], cwd=os.getcwd()) for i, h in enumerate(bed.hosts)]
        for p in procs:
            p.wait(timeout=600)
        outs = [open(f).read() for f in logs]
        for p, out in zip(procs, outs):
            assert p.returncode == 0, out[-4000:]
        assert f"stop after {ITERATIONS} updates" in outs[1], outs[1][-2000:]
        printed = [json.loads(line) for line in outs[0].splitlines()
                   if line.startswith('{"process"')]
        assert printed and printed[0]["iterations"] == ITERATIONS
        _matches_reference(RunSpec.from_config(c), job_dir, tmp_path / "ref", graphdef, base)
