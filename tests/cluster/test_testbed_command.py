"""The one command that shows Spotlight across hosts on a network with faults injected
(`python -m spotlight_jax.cluster_programs.testbed`), on the micro model: the run completes,
nothing is completed twice, no iteration trains on a short batch, a driver without the token is
refused, each fault is recorded with when Ray noticed it and when the host was back, and the
test bed leaves nothing behind. Both with -m slow (~2 and ~8 minutes); CI runs the pieces:
the test bed and Ray across it (test_testbed*.py), the fault bookkeeping
(test_testbed_faults.py)."""
import json
import os
import subprocess
import sys

import pytest
from helpers import MICRO_RUN_OVERRIDES, child_env, config_flags, micro_model

from spotlight_jax.cluster import testbed
from spotlight_jax.io import checkpoints

pytest.importorskip("ray")
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(testbed.unavailable() is not None,
                                 reason=str(testbed.unavailable()))]
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _command(tmp_path, hosts, iterations, faults, *extra):
    _, _, base = micro_model()
    base_dir = str(tmp_path / "base")
    checkpoints.save_params(base_dir, base, {})
    over = {k: v for k, v in MICRO_RUN_OVERRIDES.items() if k != "mode"}
    over.update({"base_checkpoint": base_dir, "rl.eval_every": iterations,
                 "checkpoint.every": 100, "explore.max_extra_per_prompt": 4,
                 # the micro model's iterations are shorter than a host's start and its update
                 # shorter than an exploration: wait for both (every iteration explores on
                 # the hosts, so a fault always meets work; a replacement host that cannot be
                 # placed holds its phase up to 120 s)
                 "deployment.ray_explore_deadline": False,
                 "deployment.ray_host_wait_s": 120.0})
    sets = [f"--set={f[len('--config.'):]}" for f in config_flags(over)]
    workdir = tmp_path / "w"
    out = subprocess.run(
        [sys.executable, "-m", "spotlight_jax.cluster_programs.testbed", f"--hosts={hosts}",
         f"--iterations={iterations}", f"--faults={','.join(faults)}", f"--workdir={workdir}",
         *extra, *sets], env=child_env(), capture_output=True, text=True, timeout=900,
        cwd=CHECKOUT)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return json.load(open(workdir / "testbed.json"))


def _check_nothing_lost(got, hosts, iterations):
    assert [h["role"] for h in got["hosts"]] == ["trainer"] + ["spot"] * (hosts - 1)
    assert got["iterations"] == iterations
    assert got["requests_completed_twice"] == 0
    assert got["short_batches"] == 0
    assert got["unauthenticated_refused"] is True
    assert got["faults_not_injected"] == []
    assert got["leftovers"] == []


# ~2 minutes: with -m slow, for CI's 30-minute budget (.ci/run measured 30m41s with it)
@pytest.mark.slow
def test_a_killed_spot_host_is_noticed_and_comes_back_and_nothing_is_lost(tmp_path):
    got = _command(tmp_path, 3, 12, ["kill"])
    _check_nothing_lost(got, 3, 12)
    (kill,) = got["faults"]
    assert kill["kind"] == "kill" and kill["host"] == "h1"
    # Ray listed the node dead, and a new node of the host was alive (either may come first:
    # the new node starts 5 s after the kill, Ray may take longer to give up on the old one)
    assert kill["at_s"] < kill["noticed_s"]
    assert kill["at_s"] + 5.0 < kill["rejoined_s"] == kill["recovered_s"]
    assert kill["next_iteration_s"] is not None


@pytest.mark.slow
def test_every_network_fault_in_one_run_loses_nothing(tmp_path):
    """A partition that heals (30 s), the head unreachable from one host (5 s), a host back
    with a new address, a SIGKILL and a host gone for good, on 3 spot hosts. ~5 minutes."""
    faults = ["partition", "head_unreachable", "new_address", "kill", "gone"]
    got = _command(tmp_path, 4, 60, faults)
    _check_nothing_lost(got, 4, 60)
    by_kind = {f["kind"]: f for f in got["faults"]}
    assert [f["host"] for f in got["faults"]] == ["h1", "h2", "h3", "h1", "h2"]
    assert by_kind["new_address"]["new_ip"] not in {h["ip"] for h in got["hosts"]}
    for kind in ("new_address", "kill"):
        assert by_kind[kind]["recovered_s"] > by_kind[kind]["at_s"], kind
    assert by_kind["head_unreachable"]["healed_s"] >= by_kind["head_unreachable"]["at_s"] + 5
    assert by_kind["gone"]["recovered_s"] is None
