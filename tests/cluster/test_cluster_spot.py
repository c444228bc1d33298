"""Spot hosts as real Ray actors (separate processes with their own JAX) serving the
controller's queue through the ``Worker`` interface: a host killed with SIGKILL mid-rollout,
one that gets a SIGTERM notice, and one that joins mid-run. Every request completes exactly
once, with the same bits as an undisturbed in-process run of the same signature (microbatch,
SP degree, strategy)."""
import os
import signal
import time

import jax
import pytest
from helpers import MICRO_RUN_OVERRIDES, micro_model

from spotlight_jax.config import RunSpec, load_config, sampler_config
from spotlight_jax.elastic.groups import GroupConfig, form_node_groups
from spotlight_jax.sched import (
    InProcessWorker,
    QueueConfig,
    RequestQueue,
    SamplerCache,
    SamplerStepper,
    WorkerConfig,
    make_requests,
    results_equal,
)

ray = pytest.importorskip("ray", reason="cluster tests need: pip install -e '.[cluster]'")
from spotlight_jax.cluster import ray_hosts as spot  # noqa: E402
from spotlight_jax.config import model_config  # noqa: E402
from spotlight_jax.runner.backends.rollouts import group_seeds  # noqa: E402

pytestmark = pytest.mark.cluster

OVERRIDES = {**MICRO_RUN_OVERRIDES, "sampler.num_steps": 6}
WORKER = dict(commit_every=2, steps_per_call=1, microbatch=2)
N = 16
PROMPTS = ["a red bar", "two blue squares", 'the text "7"']


@pytest.fixture(scope="module")
def setup():
    cfg = load_config("tiny", OVERRIDES)
    mcfg, graphdef, params = micro_model()
    scfg = sampler_config(cfg)
    requests = make_requests(N, num_steps=scfg.num_steps, prompts=PROMPTS, seed0=100)
    # the undisturbed reference: one in-process worker on an SP group of 2 of this process's
    # devices -- the same signature as a spot host's group over its 2 devices
    (group,) = form_node_groups("ref", jax.devices()[:2], GroupConfig(heads=mcfg.num_heads),
                                log=False)
    stepper = SamplerStepper(SamplerCache(graphdef, (mcfg.image_size,) * 2 + (mcfg.channels,),
                                          scfg).get(group), mcfg.text_len, group)
    ref_q = RequestQueue(stepper.latent_shape)
    ref_q.submit(requests)
    InProcessWorker("ref", stepper, degree=group.degree, config=WorkerConfig(**WORKER),
                    params=params).run(ref_q)
    assert ref_q.all_done
    return params, stepper.latent_shape, requests, ref_q.results()


def _host(name, precompile=False):
    """A spot host; ``precompile``: with its regroup programs (background compiles)."""
    config = load_config("tiny", {**OVERRIDES, "deployment.spot_regroup_precompile": precompile})
    return spot.start_host(name, RunSpec.from_config(config), cpu_devices=2, worker=WORKER)


def _serve_all(workers, queue):
    return spot.serve_in_threads(workers, queue)


def _queue_and_hosts(setup, names, precompile=False):
    """A locked queue holding the requests, the published weights, and started hosts that
    installed them."""
    params, shape, requests, _ = setup
    queue = spot.LockedQueue(RequestQueue(shape, QueueConfig(lease_s=600.0)))
    queue.submit(requests)
    ref = spot.publish(params)
    hosts = [_host(n, precompile) for n in names]
    for w in hosts:
        w.set_policy(ref, 0)
    return queue, ref, hosts


def _wait(cond, timeout=240.0):
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.05)


def test_sigkill_mid_rollout_and_a_late_joiner(cluster, setup):
    _, _, requests, want = setup
    queue, ref, (a, b) = _queue_and_hosts(setup, ["spot0", "spot1"])
    c = _host("spot2")                       # a host coming up; it joins after the kill
    threads, out = _serve_all([a, b], queue)
    _wait(lambda: a.steps >= 3)              # spot0 is mid-rollout (between commits or not)
    os.kill(a.pid, signal.SIGKILL)
    c.set_policy(ref, 0)                     # the joiner pulls the latest published weights
    more, out_c = _serve_all([c], queue)
    for t in threads + more:
        t.join(timeout=300)
    assert out["spot0"]["left"] == "lost"
    assert queue.all_done and len(queue.completed()) == N
    assert out_c["spot2"]["leases"] >= 1 and c.steps > 0     # the joiner got work
    assert results_equal(queue.results(), want) == []        # exactly once, bit-identical
    # redone work: at most commit_every steps per request spot0 held
    total = a.steps + b.steps + c.steps
    assert N * requests[0].num_steps <= total <= N * requests[0].num_steps + 2 * N


def test_sigterm_notice_loses_no_step(cluster, setup):
    _, _, requests, want = setup
    queue, _, (a, b) = _queue_and_hosts(setup, ["spot3", "spot4"])
    threads, out = _serve_all([a, b], queue)
    _wait(lambda: a.steps >= 3)
    os.kill(a.pid, signal.SIGTERM)
    for t in threads:
        t.join(timeout=300)
    assert out["spot3"]["left"] == "notice"
    assert queue.all_done and len(queue.completed()) == N
    assert results_equal(queue.results(), want) == []
    assert a.steps + b.steps == N * requests[0].num_steps     # nothing computed twice


def test_host_regroups_onto_its_surviving_device_without_compiling(cluster, setup):
    """A partial device failure (``set_devices``): the host regroups from its resident weights
    onto the device left with a program compiled at start (0 XLA compiles), and its requests
    come out as the undisturbed SP-2 run's up to float rounding (another signature)."""
    import numpy as np
    _, _, requests, want = setup
    queue, _, (a,) = _queue_and_hosts(setup, ["spot5"], precompile=True)
    assert a.degree == 2
    info = ray.get(a.actor.info.remote())
    out = a.set_devices([0])
    assert out["compiles"] == 0 and out["degree"] == 1 and out["devices"] == [0], out
    assert out["regroup_s"] < info["warmup_s"]            # no compile on the regroup's path
    threads, stats = _serve_all([a], queue)
    for t in threads:
        t.join(timeout=300)
    assert stats["spot5"]["left"] == "done" and queue.all_done
    got = queue.results()
    assert sorted(got) == sorted(want)
    for rid, r in got.items():
        assert all("/sp1/" in lay for lay in r.state.layouts), r.state.layouts
        np.testing.assert_allclose(r.state.latent, want[rid].state.latent, atol=1e-5)
        np.testing.assert_allclose(r.state.log_probs, want[rid].state.log_probs, atol=1e-5)


def test_controller_rollouts_on_ray_spot_hosts_survive_a_lost_host(cluster, tmp_path):
    """``deployment.transport='ray'``: a spot_rollout run's rollouts go to real spot host
    actors; one is SIGKILLed between iterations, the next iteration starts a replacement and
    trains on; the rollouts match the trainer's own sampler up to float rounding."""
    import numpy as np

    from spotlight_jax import runner
    from spotlight_jax.models.factory import create_model

    c = load_config("tiny", {**MICRO_RUN_OVERRIDES, "mode": "spot_rollout", "rl.iterations": 2,
                             "deployment.transport": "ray", "deployment.spot_nodes": 2,
                             "deployment.ray_host_wait_s": 600.0,
                             "deployment.spot_regroup_precompile": False})
    graphdef, base = create_model(model_config(c))
    run = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, base)
    prompts = run.prompts(0)
    seeds = group_seeds(c.seed, 0, len(prompts), c.rl.group_size)
    got, info = run.spot_rollouts.rollout(0, prompts, seeds)
    assert info["ray_hosts_started"] == 2 and info["ray_hosts_lost"] == 0
    assert info["ray_request_steps"] == len(got["seeds"]) * c.sampler.num_steps
    direct = run.rollout(prompts, seeds)
    for key in ("latents", "log_probs", "images"):
        np.testing.assert_allclose(got[key], direct[key], atol=1e-5)
    np.testing.assert_array_equal(got["rewards"], direct["rewards"])
    os.kill(run.spot_rollouts.hosts[0].pid, signal.SIGKILL)
    row = run.step(1)                        # found dead when handed the new weights
    assert row["ray_hosts_lost"] == 1 and row["ray_hosts_started"] == 1
    assert sorted(w.group_id for w in run.spot_rollouts.hosts) == ["spot1", "spot2"]
    assert row["ray_request_steps"] == len(got["seeds"]) * c.sampler.num_steps
    assert np.isfinite(row["loss"])
    run.close()
