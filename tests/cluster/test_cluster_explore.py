"""Spotlight's exploration on real Ray spot hosts (``deployment.transport='ray'``): the hosts
score exploration candidates with the stale θ_k while the trainer updates, reward them
themselves, and survive a SIGKILL and a SIGTERM mid-exploration without a candidate lost or
counted twice; a result from the wrong policy version is rejected; a deadline drops what is
unfinished. References are independent: the emulated transport's run of the same seed, and the
trainer's own sampler on the same (prompt, seed, weights)."""
import os
import signal
import threading
import time

import jax
import numpy as np
import pytest
from helpers import mode_config, qwen_fixture_config

ray = pytest.importorskip("ray", reason="cluster tests need: pip install -e '.[cluster]'")
from spotlight_jax import runner  # noqa: E402
from spotlight_jax.config import RunSpec, model_config  # noqa: E402
from spotlight_jax.diffusion.engine import candidate_seeds  # noqa: E402
from spotlight_jax.models.factory import create_model  # noqa: E402
from spotlight_jax.runner import outputs  # noqa: E402

pytestmark = pytest.mark.cluster

PROMPTS = ["a red bar", "two blue squares", 'the text "7"']
SLACK_S = 5.0       # a deadline's exploration returns within this after the update ends


def _config(mode, transport, iterations=3, deadline=False, spot_nodes=2):
    c = mode_config(mode, iterations=iterations)
    c.deployment.spot_nodes = spot_nodes
    c.deployment.spot_devices_per_node = 2
    c.deployment.transport = transport
    c.deployment.ray_explore_deadline = deadline
    c.deployment.ray_host_wait_s = 600.0      # every host up before a phase (test's own Ray)
    c.deployment.spot_regroup_precompile = False   # no regroups here: spare the 2 cores
    c.trace.rate_per_node_hour = 0.0          # no trace preemption: the same plan either way
    return c


@pytest.fixture(scope="module")
def model():
    c = _config("spotlight", "emulated")
    return create_model(model_config(c))


def _run(c, workdir, model, iterations):
    graphdef, base = model
    r = runner.build_run(RunSpec.from_config(c), str(workdir), graphdef, base)
    rows, seeds = [], []
    for k in range(iterations):
        rows.append(r.step(k))
        seeds.append(r.next_seeds)
    val = outputs.evaluate(r, iterations)
    return r, rows, seeds, val


def test_ray_spotlight_explores_on_the_hosts_like_the_emulated_fleet(cluster, tmp_path, model):
    n = 3
    emu, emu_rows, emu_seeds, emu_val = _run(_config("spotlight", "emulated"),
                                             tmp_path / "emulated", model, n)
    emu.close()
    ray_run, ray_rows, ray_seeds, ray_val = _run(_config("spotlight", "ray"), tmp_path / "ray",
                                                 model, n)
    try:
        for k in range(n):
            a, b = emu_rows[k], ray_rows[k]
            assert b["explore_candidates"] == a["explore_candidates"] > 0
            assert b["explore_hosts"] == 2 and b["explore_dropped"] == 0
            assert b["explore_rejected"] == 0 and b["explore_fallback_calls"] == 0
            # every candidate's steps ran on the hosts
            assert b["explore_request_steps"] == (b["explore_candidates"]
                                                  * ray_run.train_sampler_cfg.num_steps)
            assert ray_seeds[k] == emu_seeds[k], k          # the same selected seeds
            for key in ("reward_mean", "reward_std", "loss"):
                np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
            assert 0.0 <= b["explore_overlap"] <= 1.0 and b["policy_lag"] == 0
            # LoRA: a version ships the sampling factors only, merged into the hosts' base
            lora = sum(np.asarray(x).nbytes
                       for x in jax.tree.leaves(ray_run.trainer.sampling_trainable()))
            full = sum(np.asarray(x).nbytes for x in jax.tree.leaves(ray_run.base_state))
            assert b["pull_bytes"] == b["ray_publish_bytes"] == lora < full
        for key in emu_val:
            np.testing.assert_allclose(ray_val[key], emu_val[key], rtol=1e-5, atol=1e-6)
    finally:
        ray_run.close()


def test_ray_pipelined_batch_is_the_chosen_candidates_under_the_stale_weights(
        cluster, tmp_path, model):
    graphdef, base = model
    r = runner.build_run(RunSpec.from_config(_config("spotlight_pipelined", "ray", iterations=2)),
                        str(tmp_path), graphdef, base)
    try:
        stale = jax.tree.map(np.asarray, r.trainer.sampling_state())   # θ_0
        row = r.step(0)
        assert row["pipelined"] == 0 and row["explore_dropped"] == 0
        k, batch, _ = r.mode.pending
        assert k == 1 and len(batch["rewards"]) == len(PROMPTS[:2]) * 4
        prompts = r.prompts(1)
        flat = [prompts[i] for i in batch["prompt_ids"]]
        want = r.engine.run(stale, flat, batch["seeds"])     # the trainer's own sampler
        for key in ("latents", "log_probs", "images", "rewards"):
            np.testing.assert_allclose(batch[key], want[key], atol=1e-5, err_msg=key)
        # only the chosen candidates' trajectories travelled, fetched from the hosts that ran
        # them (the others stayed there); the exploration commits carried latents only
        chosen = len(batch["rewards"])
        assert row["explore_candidates"] > chosen
        assert row["explore_fetched"] == chosen and row["explore_resampled"] == 0
        assert row["explore_fetch_bytes"] == batch["latents"].nbytes + batch["log_probs"].nbytes
        row = r.step(1)
        assert row["pipelined"] == 1 and row["policy_lag"] == 1
        assert np.isfinite(row["loss"])
    finally:
        r.close()


def _explorer(tmp_path, model, deadline, spot_nodes=3):
    graphdef, base = model
    spec = RunSpec.from_config(_config("spotlight", "ray", deadline=deadline,
                                       spot_nodes=spot_nodes))
    r = runner.build_run(spec, str(tmp_path), graphdef, base)
    return r, r.mode.spot.ray


def _candidates(n=6):
    return [candidate_seeds(0, 1, i, n) for i in range(len(PROMPTS))]


def _score_in_thread(explorer, params, cands):
    out = {}
    t = threading.Thread(target=lambda: out.update(r=explorer.score(None, PROMPTS, cands)))
    t.start()
    return t, out


def _wait(cond, timeout=300.0):
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.02)


def test_sigkill_and_sigterm_mid_exploration_lose_no_candidate(cluster, tmp_path, model):
    r, ex = _explorer(tmp_path, model, deadline=False)
    try:
        params = r.trainer.sampling_state()
        cands = _candidates()
        want = r.explorer.score(params, PROMPTS, cands)      # the trainer's own sampler
        ex.pull(params, 0)
        a, b, _ = ex.fleet.hosts
        t, out = _score_in_thread(ex, params, cands)
        _wait(lambda: a.steps >= 3 and b.steps >= 3)         # both mid-exploration
        os.kill(a.pid, signal.SIGKILL)
        os.kill(b.pid, signal.SIGTERM)
        t.join(timeout=600)
        got = out["r"]
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=1e-5)      # every candidate, scored once
        q, last = ex.queue, ex.last
        assert q.all_done and len(q.completed()) == sum(len(c) for c in cands)
        assert q.stats["duplicates"] == 0
        assert last["explore_lost"] == 2 and last["explore_rejected"] == 0
        assert [w.group_id for w in ex.fleet.hosts] == ["spot2"]
        # the replacements are started for the next version
        started, dead = ex.fleet.top_up(1, params)
        assert started == 2 and dead == 0 and len(ex.fleet.hosts) == 3
    finally:
        r.close()


def test_wrong_version_rejected_and_deadline_drops_the_unfinished(cluster, tmp_path, model):
    r, ex = _explorer(tmp_path, model, deadline=True, spot_nodes=2)
    try:
        params = r.trainer.sampling_state()
        cands = _candidates(8)
        want = r.explorer.score(params, PROMPTS, cands)
        ex.pull(params, 0)
        wrong = ex.fleet.hosts[0]
        wrong.set_policy(ex.fleet.publish(0, params), 7)      # the same bits, but version 7
        t, out = _score_in_thread(ex, params, cands)
        _wait(lambda: ex.queue is not None and any(
            c.group_id == "spot1" for c in ex.queue.completed().values()))
        ex.update_done()                                     # the update ended: stop now
        t_end = time.perf_counter()
        t.join(timeout=600)
        late = time.perf_counter() - t_end
        got, last = out["r"], ex.last
        # the slack an iteration may exceed its update by: each host's call in flight (one
        # step of 4 rows here) and its commit, then the results; SLACK_S is generous for a
        # shared 2-core machine, against the many seconds the dropped candidates would take
        print(f"exploration returned {late:.3f} s after the update ended")
        assert late < SLACK_S, late
        flat_got, flat_want = np.concatenate(got), np.concatenate(want)
        scored = np.isfinite(flat_got)
        assert last["explore_rejected"] > 0                  # what the version-7 host ran
        assert last["explore_dropped"] == len(flat_got) - scored.sum() > 0
        np.testing.assert_allclose(flat_got[scored], flat_want[scored], atol=1e-5)
        done_by = {rid: c.group_id for rid, c in ex.queue.completed().items()}
        assert "spot0" in done_by.values()                   # it completed some, all rejected
        assert last["explore_hosts"] == 1
    finally:
        r.close()


def test_a_host_that_finishes_starting_joins_the_exploration_under_way(cluster, tmp_path,
                                                                        model):
    r, ex = _explorer(tmp_path, model, deadline=False, spot_nodes=1)
    try:
        params = r.trainer.sampling_state()
        cands = _candidates(64)               # seconds of work for one host: time to join
        want = r.explorer.score(params, PROMPTS, cands)
        ex.pull(params, 0)
        ex.fleet._launch()                                   # a second host comes up ...
        (_, info), = ex.fleet.starting
        ray.wait([info], timeout=300)                        # ... ready, not yet in the fleet
        got = ex.score(None, PROMPTS, cands)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=1e-5)
        assert ex.last["explore_hosts_joined"] == 1
        assert ex.last["explore_hosts"] == 2                 # the joiner scored candidates
        assert len(ex.fleet.hosts) == 2 and not ex.fleet.starting
    finally:
        r.close()


def test_a_diffusers_base_end_to_end_over_ray_hosts(cluster, tmp_path):
    """The tiny Qwen-Image fixture (transformer + VAE, prompts from an embedding file): each host
    loads the base itself, scores candidates with its own VAE and reward exactly as the trainer
    does, and a spotlight iteration trains on Ray rollouts equal to the trainer's own."""
    from spotlight_jax.config import load_diffusers_base
    c = qwen_fixture_config(tmp_path, "nft", iterations=1, mode="spotlight")
    c.explore.max_extra_per_prompt = 4
    c.deployment.update({"transport": "ray", "spot_nodes": 1, "spot_devices_per_node": 2,
                         "ray_explore_deadline": False, "ray_host_wait_s": 600.0,
                         "spot_regroup_precompile": False})
    c.trace.rate_per_node_hour = 0.0
    graphdef, base = load_diffusers_base(c)
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path / "run"), graphdef, base)
    try:
        prompts = r.prompts(0)
        seeds = [candidate_seeds(0, 1, i, 5) for i in range(len(prompts))]
        params = r.trainer.sampling_state()
        want = r.explorer.score(params, prompts, seeds)      # trainer: sampler, VAE, reward
        ex = r.mode.spot.ray
        ex.pull(params, 0)
        (host,) = ex.fleet.hosts
        assert host.has_base                                 # loaded from the folder itself
        got = ex.score(None, prompts, seeds)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=1e-5)
        assert ex.last["explore_hosts"] == 1 and ex.last["explore_fallback_calls"] == 0
        row = r.step(0)
        assert row["ray_request_steps"] > 0 and row["ray_fallback_calls"] == 0
        assert np.isfinite(row["loss"]) and row["explore_hosts"] == 1
    finally:
        r.close()

