"""`spotlight` and `spotlight_pipelined` across the network test bed: the trainer on h0 (the Ray
head bound to its cluster address, token authentication on), spot hosts on h1 and h2 joining
with the `spot_node` resource and the job's token; the command-line run must explore and train
as the emulated transport's run of the same seed does (what the loopback test,
test_cluster_explore, checks in one process)."""
import json
import os
import subprocess
import sys
import time

import pytest
from helpers import MICRO_RUN_OVERRIDES, TINY, child_env, config_flags, micro_model

from spotlight_jax.cluster import testbed
from spotlight_jax.cluster.testbed_ray import TestBedRay
from spotlight_jax.io import checkpoints

pytest.importorskip("ray")
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(testbed.unavailable() is not None,
                                 reason=str(testbed.unavailable()))]

ITERATIONS = 3


def _overrides(mode, base_dir, transport, address=""):
    return {**MICRO_RUN_OVERRIDES, "mode": mode, "base_checkpoint": base_dir,
            "rl.iterations": ITERATIONS, "rl.eval_every": ITERATIONS, "checkpoint.every": 10,
            "explore.max_extra_per_prompt": 4, "deployment.rollout_on_groups": "false",
            "deployment.spot_nodes": 2, "deployment.spot_devices_per_node": 2,
            "deployment.transport": transport, "deployment.ray_address": address,
            "deployment.ray_spot_resource": "spot_node", "deployment.ray_host_wait_s": 600.0,
            "deployment.ray_explore_deadline": False,
            "deployment.spot_regroup_precompile": False, "trace.rate_per_node_hour": 0.0}


def _rows(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "rl.jsonl"))]


# ~90 s each: spotlight_pipelined with -m slow (the cluster phase's budget)
@pytest.mark.parametrize("mode", ["spotlight",
                                  pytest.param("spotlight_pipelined", marks=pytest.mark.slow)])
def test_spot_modes_across_hosts_explore_and_train_as_the_emulated_run(tmp_path, mode):
    _, _, base = micro_model()
    env = child_env()
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed:
        base_dir = os.path.join(bed.shared, "base")
        checkpoints.save_params(base_dir, base, {})
        ray = TestBedRay(bed, str(tmp_path / "logs"), env).start()
        ray_dir = os.path.join(bed.shared, "ray_run")
        out = ray.run("h0", [sys.executable, "-m", "spotlight_jax.main", f"--config={TINY}",
                             f"--workdir={ray_dir}",
                             *config_flags(_overrides(mode, base_dir, "ray", ray.address))],
                      timeout=900)
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    emu_dir = str(tmp_path / "emulated")
    ref = subprocess.run([sys.executable, "-m", "spotlight_jax.main", f"--config={TINY}",
                          f"--workdir={emu_dir}",
                          *config_flags(_overrides(mode, base_dir, "emulated"))],
                         env=env, capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr[-4000:]
    got, want = _rows(ray_dir), _rows(emu_dir)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got[1:], want[1:]):
        assert g["explore_hosts"] == 2 and g["explore_dropped"] == 0, g
        assert g["explore_candidates"] == w["explore_candidates"] > 0
        for key in ("reward_mean", "reward_std", "loss"):
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-6), (g["step"], key)
    assert got[-1]["val_reward"] == pytest.approx(want[-1]["val_reward"], rel=1e-5, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("down_s,new_address", [(45.0, False), (45.0, True), (5.0, False)],
                         ids=["same_address", "new_address", "brief"])
def test_a_partition_that_heals_during_a_run_loses_nothing(tmp_path, down_s, new_address):
    """After the first iteration h2's link goes down for 45 s (its processes keep running,
    nothing answers): Ray declares its node dead, the in-flight work resumes on h1 from its last
    commit. When the link comes back the partitioned node's Ray processes find themselves
    declared dead and stop (Ray takes no node back); its host starts a new node, as a requeued
    spot job would, and the run takes it; ``new_address``: the host comes back with another
    address. A brief one (5 s: the head unreachable for less than Ray's health checks allow)
    costs no host. Every iteration trains on a whole batch, no request completes twice."""
    iterations = 5
    _, _, base = micro_model()
    env = child_env()
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed:
        base_dir = os.path.join(bed.shared, "base")
        checkpoints.save_params(base_dir, base, {})
        ray = TestBedRay(bed, str(tmp_path / "logs"), env).start()
        ray_dir = os.path.join(bed.shared, "ray_run")
        overrides = {**_overrides("spotlight", base_dir, "ray", ray.address),
                     "rl.iterations": iterations, "rl.eval_every": iterations}
        log = str(tmp_path / "run.log")
        run = bed.spawn("h0", [sys.executable, "-m", "spotlight_jax.main", f"--config={TINY}",
                               f"--workdir={ray_dir}", *config_flags(overrides)],
                        env=ray.env, log=log, cwd=os.getcwd())
        rows_file = os.path.join(ray_dir, "rl.jsonl")
        deadline = time.time() + 300
        while time.time() < deadline and not (os.path.exists(rows_file)
                                               and len(_rows(ray_dir)) >= 2):
            assert run.poll() is None, open(log).read()[-3000:]
            time.sleep(0.5)
        down = bed.link_down("h2")
        time.sleep(down_s)
        if new_address:
            bed.readdress("h2", "10.213.0.77")
        up = bed.link_up("h2")
        brief = down_s < 10.0
        if not brief:
            ray.nodes["h2"].wait(timeout=120)      # declared dead: its processes stop
            ray.add_node("h2")
        assert run.wait(timeout=600) == 0, open(log).read()[-4000:]
        assert up - down >= down_s
        if brief:                                  # the node lived through it
            assert ray.alive("h2")
    rows = _rows(ray_dir)
    trained = [r for r in rows if "loss" in r]
    assert [r["step"] for r in trained] == list(range(1, iterations + 1))
    assert sum(r.get("explore_duplicates", 0) + r.get("ray_duplicates", 0)
               for r in trained) == 0
    assert sum(r.get("explore_rejected", 0) + r.get("explore_dropped", 0) for r in trained) == 0
    lost = [r["step"] for r in trained if r.get("ray_hosts_lost") or r.get("explore_lost")
            or r.get("explore_hosts_dead")]
    assert bool(lost) == (down_s >= 10.0), [
        {k: v for k, v in r.items() if k.startswith(("ray_", "explore_h"))} for r in trained]
    print("partition: host lost at iteration(s)", lost,
          [(r["step"], round(r.get("ray_rollout_wall_s", 0), 1),
            round(r.get("explore_s", 0), 1)) for r in trained])
