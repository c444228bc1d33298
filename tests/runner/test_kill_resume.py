"""A spotlight run killed at a random point (SIGKILL, no clean exit) and resumed ends exactly like
an uninterrupted run: same params (bitwise), planner state, deployment state and metrics."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import KILL_ITERATIONS as ITERATIONS
from helpers import spotlight_config

from spotlight_jax import runner
from spotlight_jax.config import RunSpec, model_config
from spotlight_jax.io.metrics import read_jsonl
from spotlight_jax.models.factory import create_model
from spotlight_jax.runner import checkpointing
from spotlight_jax.runner.modes import WALL_CLOCK_KEYS

CHILD = """
import sys
sys.path.insert(0, {tests!r})
import jax
jax.config.update("jax_num_cpu_devices", 8)
from spotlight_jax.elastic.exec_cache import enable_persistent_cache
enable_persistent_cache({cache!r})   # the resumed process loads the killed one's programs
from helpers import spotlight_config
from spotlight_jax import runner
from spotlight_jax.config import RunSpec, model_config
from spotlight_jax.models.factory import create_model
c = spotlight_config({objective!r}, {mode!r})
graphdef, state = create_model(model_config(c))
runner.build_and_run(RunSpec.from_config(c), {workdir!r}, graphdef, state, progress=False)
"""




def _state(workdir, objective="flow_grpo", mode="spotlight"):
    c = spotlight_config(objective, mode)
    graphdef, base = create_model(model_config(c))
    r = runner.build_run(RunSpec.from_config(c), str(workdir), graphdef, base)
    assert checkpointing.restore(r)
    return r


def _completed_steps(ckdir: Path) -> list[int]:
    if not ckdir.exists():
        return []
    return [int(p.name) for p in ckdir.iterdir() if p.name.isdigit()]


def _spawn(workdir, objective, mode):
    code = CHILD.format(tests=str(Path(__file__).parents[1]), workdir=str(workdir),
                        cache=str(Path(workdir).parent / "xla_cache"), objective=objective,
                        mode=mode)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


@pytest.mark.e2e
# each mode and each objective once (an objective's state parts and a mode's extra state are
# restored independently of each other)
@pytest.mark.parametrize("mode,objective", [("spotlight", "flow_grpo"),
                                            ("spotlight_pipelined", "nft")])
def test_spotlight_run_killed_and_resumed_matches_an_uninterrupted_run(tmp_path, mode,
                                                                       objective):
    rng = np.random.default_rng(int(time.time()))
    killed = tmp_path / "killed"
    child = _spawn(killed, objective, mode)
    # wait for a first checkpoint, then kill after a random delay (possibly mid-iteration or
    # mid-save: a half-written checkpoint must fall back to the previous one)
    deadline = time.time() + 300
    while not _completed_steps(killed / "checkpoints"):
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    delay = float(rng.uniform(0.0, 2.0))
    time.sleep(delay)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    steps = _completed_steps(killed / "checkpoints")
    resumed = _spawn(killed, objective, mode)           # a fresh process resumes the workdir
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()[-2000:]

    straight = tmp_path / "straight"
    c = spotlight_config(objective, mode)
    graphdef, base = create_model(model_config(c))
    h_straight = runner.build_and_run(RunSpec.from_config(c), str(straight), graphdef, base,
                                      progress=False)

    a, b = _state(straight, objective, mode), _state(killed, objective, mode)
    assert a.iteration == b.iteration == ITERATIONS, (steps, delay)
    for part in a.trainer.state_parts:      # nft: the sampling policy θ_old too
        for x, y in zip(jax.tree.leaves(getattr(a.trainer, part)),
                        jax.tree.leaves(getattr(b.trainer, part))):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert json.dumps(a.planner.state_dict()) == json.dumps(b.planner.state_dict())
    assert json.dumps(a.deploy.state_dict()) == json.dumps(b.deploy.state_dict())
    assert a.next_seeds == b.next_seeds
    extra_a, extra_b = a.mode.extra_state(), b.mode.extra_state()   # pipelined: the ready batch
    assert (extra_a is None) == (extra_b is None)
    assert extra_a is None or mode == "spotlight_pipelined"
    if mode == "spotlight_pipelined":     # some iteration trained on a batch sampled on spot
        assert any(row.get("pipelined") == 1 for row in h_straight)
    for key in extra_a or {}:
        np.testing.assert_array_equal(extra_a[key], extra_b[key])

    def metrics(h):
        return [{k: v for k, v in row.items() if k not in WALL_CLOCK_KEYS} for row in h]

    assert metrics(b.history) == metrics(h_straight)
    # rl.jsonl holds every iteration once: the rows the killed process wrote past its last
    # checkpoint were dropped when the resumed one redid them
    rows = {d: read_jsonl(str(d / "rl.jsonl")) for d in (straight, killed)}
    assert [r["step"] for r in rows[killed]] == list(range(ITERATIONS + 1))
    assert metrics(rows[killed]) == metrics(rows[straight])
    assert sum(row.get("preemptions", 0) > 0 for row in h_straight) > 0   # the trace bit
