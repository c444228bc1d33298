"""Every post-training mode runs end to end on the micro model; spotlight explores with stale
weights off the critical path and trains on the chosen seeds; the emulated clock charges phases."""

import jax
import numpy as np
import pytest
from helpers import mode_config

from spotlight_jax import runner, world
from spotlight_jax.config import RunSpec
from spotlight_jax.diffusion.engine import candidate_seeds
from spotlight_jax.emulation import utilization
from spotlight_jax.explore import max_variance_subset
from spotlight_jax.rl import work_of
from spotlight_jax.runner import outputs
from spotlight_jax.runner.backends.rollouts import group_seeds, rollout_on_groups
from spotlight_jax.runner.exploration import extras_budget_s


# spotlight_pipelined with nft: test_pipelined_trains_on_the_batch_its_spot_devices_sampled;
# spotlight with nft: test_spotlight_trains_on_max_variance_seeds_explored_with_stale_weights;
# the spot modes' runs here are among the longer checks (the default suite's 8-minute budget)
@pytest.mark.parametrize("mode,objective", [
    pytest.param(m, "flow_grpo", marks=pytest.mark.e2e) if m in ("spotlight", "spotlight_pipelined")
    else (m, "flow_grpo") for m in runner.MODES] + [
    ("baseline", "nft"), pytest.param("spotlight", "nft", marks=pytest.mark.e2e)])
def test_mode_runs_and_charges_the_clock(tmp_path, base, mode, objective):
    graphdef, state = base
    spec = RunSpec.from_config(mode_config(mode, objective=objective))
    h = runner.build_and_run(spec, str(tmp_path), graphdef, state, progress=False)
    rows = [r for r in h if "reward_mean" in r]
    assert len(rows) == 2
    # throughput of the phases, from the row's own wall times
    n = spec.settings.prompts_per_iter * spec.settings.group_size
    tokens = ((spec.model.num_patches + spec.model.text_len) * spec.sampler.num_steps
              * (1 if spec.sampler.guidance == 1.0 else 2))
    update_flops = utilization.update_flops(work_of(spec.rl, spec.sampler), spec.model, n)
    for r in rows:
        assert r["train_images_per_s"] == pytest.approx(n / r["time_train"])
        assert r["train_tflops"] == pytest.approx(update_flops / r["time_train"] / 1e12)
        assert r["train_mfu"] > 0
        if not r.get("pipelined"):
            assert r["rollout_images_per_s"] == pytest.approx(n / r["time_rollout"])
            assert r["rollout_tokens_per_s"] == pytest.approx(n * tokens / r["time_rollout"])
    assert 0 < rows[0]["vtime_s"] < rows[1]["vtime_s"]
    assert rows[1]["dollars"] > 0
    if mode in ("spotlight", "spotlight_pipelined", "explore_sync"):
        assert all(r["explore_candidates"] >= 2 * 4 for r in rows)
    # evaluations say where the held-out reward is lost: the shares add up to 1 - reward
    evals = [r for r in h if "val_reward" in r]
    assert evals
    for r in evals:
        shares = [v for k, v in r.items() if k.startswith("val_missing_")]
        assert len(shares) == 5
        assert sum(shares) == pytest.approx(1.0 - r["val_reward"], abs=1e-5)


# the Flow-GRPO variant (~30 s) among the longer checks (the default suite's 8-minute budget);
# the nft variant stays
@pytest.mark.parametrize("objective", [pytest.param("flow_grpo", marks=pytest.mark.e2e), "nft"])
def test_spotlight_trains_on_max_variance_seeds_explored_with_stale_weights(tmp_path, base,
                                                                          objective):
    graphdef, state = base
    c = mode_config("spotlight", iterations=1, objective=objective)
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    # the weights that sample the training batch (θ_k; nft: the sampling policy θ_old)
    stale = jax.tree.map(np.asarray, r.trainer.sampling_state())
    r.step(0)
    # the chosen seeds are the max-variance subset of candidates scored with θ_0 (stale), and
    # re-scoring them with θ_0 reproduces that choice
    prompts = r.prompts(1)
    assert r.next_seeds is not None and len(r.next_seeds) == len(prompts)
    G = c.rl.group_size
    n0 = G + r.planner.last_plan["extra"][prompts[0]]
    pool = candidate_seeds(c.seed, 1, 0, n0)
    rewards = r.mode.spot.explorer.score(stale, [prompts[0]], [pool])[0]
    assert sorted(pool[max_variance_subset(rewards, G)].tolist()) == sorted(r.next_seeds[0])


def test_spotlight_explores_on_other_devices_concurrently_with_the_update(tmp_path, base):
    graphdef, state = base
    c = mode_config("spotlight", iterations=1)
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    trainer = {d.id for d in r.mesh.devices.flat}
    spot = {d for _, _, g in r.mode.fleet.groups for d in g.device_ids}
    assert len(r.mode.fleet.groups) == c.deployment.spot_nodes
    assert spot and not trainer & spot, (trainer, spot)
    # the explorer's rollouts really run on the spot groups' devices ...
    r.mode.spot.pull(r.trainer.policy_state(), 0)
    for node, i, g in r.mode.fleet.groups:
        out = node.rollout(*world.tokenize(["a red bar"] * r.engine.chunk,
                                                      r.mcfg.text_len),
                           np.arange(r.engine.chunk, dtype=np.uint32), group=i)
        assert {d.id for d in out["images"].devices()} == set(g.device_ids)
    # ... concurrently with the update: both wall intervals intersect
    row = r.step(0)
    r.close()
    assert row["pull_bytes"] > 0 and row["pull_s"] > 0
    assert row["overlap_wall_s"] > 0, row
    assert row["overlap_wall_s"] <= min(row["explore_wall_s"], row["train_wall_s"]) + 1e-9


def test_spot_fleet_scores_like_the_trainer_and_regroups_on_trace_events(tmp_path, base):
    graphdef, state = base
    c = mode_config("spotlight", iterations=1)
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    params = r.trainer.policy_state()
    r.mode.spot.pull(params, 0)
    prompts = ["a red bar", "two blue squares", "a green column"]
    cands = [candidate_seeds(0, 1, i, 5) for i in range(3)]
    # 15 candidates in chunks of 32 on whichever group: the same rewards as the trainer's own
    # single-device sampler (same program, other devices)
    want = r.explorer.score(params, prompts, cands)
    got = r.mode.fleet.score(None, prompts, cands)
    for a, b in zip(want, got):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # the trace preempts a node: its devices are lost and its weight buffers really deleted
    d = r.deploy
    lost = sorted(d.alive_nodes)[0]
    snode = r.mode.fleet.fleet.nodes[lost]
    bufs = snode.device_buffers(snode.devices)
    d.alive_nodes.discard(lost)
    row = {}
    r.mode.sync(r, row)
    assert row["fleet_regroups"] == 1 and row["fleet_compiles"] == 0
    assert all(b.is_deleted() for b in bufs) and not snode.groups
    assert lost not in r.mode.fleet.alive_nodes
    np.testing.assert_array_equal(np.concatenate(r.mode.fleet.score(None, prompts, cands)),
                                  np.concatenate(got))   # exploration goes on without it
    # ... and rejoins: it pulls the weights device-to-device from a live peer, compiling nothing
    d.alive_nodes.add(lost)
    row = {}
    r.mode.sync(r, row)
    assert row["fleet_regroups"] == 1 and row["fleet_compiles"] == 0
    # (its time is recorded; how long a regroup takes is bench.reconfig's to measure, not a
    # wall-clock bound on a shared machine)
    assert row["fleet_bytes_copied"] > 0 and row["fleet_regroup_s"] > 0
    assert snode.groups
    got = [jax.device_get(x) for x in jax.tree.leaves(snode.group_params(0))]
    for a, b in zip(got, jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, np.asarray(b))
    # every node down (a real trace does this), then one back: no peer holds the weights, so it
    # pulls them from the trainer's device, which is outside the fleet's pool
    trainer_ids = {dev.id for x in jax.tree.leaves(params) for dev in x.devices()}
    assert not trainer_ids & {dev.id for dev in r.mode.fleet.pool.devices(alive=None)}
    d.alive_nodes.clear()
    r.mode.sync(r, {})
    assert not r.mode.fleet.alive_nodes and not r.mode.fleet.groups
    d.alive_nodes.add(lost)
    row = {}
    r.mode.sync(r, row)
    assert row["fleet_regroups"] == 1 and row["fleet_compiles"] == 0
    report = snode.reports[-1]
    assert report.kind == "peer_pull" and report.source_devices <= trainer_ids
    got = [jax.device_get(x) for x in jax.tree.leaves(snode.group_params(0))]
    for a, b in zip(got, jax.tree.leaves(r.trainer.policy_state())):
        np.testing.assert_array_equal(a, np.asarray(b))
    r.close()


def test_scheduled_rollout_survives_preemptions_and_equals_the_direct_rollout(tmp_path, base):
    # spot_rollout / spotlight rollouts go through the pull scheduler; a notice, an abrupt loss
    # and a rejoin inside the phase must not change a bit of the trajectories (against the same
    # phase without events), and the abrupt loss costs at most commit_every steps per request
    from spotlight_jax.emulation.clock import EventCursor
    from spotlight_jax.emulation.traces import SpotEvent

    graphdef, state = base
    c = mode_config("spotlight", iterations=1)
    c.deployment.commit_every = 1              # (one program: bitwise equal whoever resumes)
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    prompts = r.prompts(0)
    seeds = group_seeds(c.seed, 0, len(prompts), c.rl.group_size)
    setup_step = r.deploy.scheduler_setup(8, 1.0)["sample_step_s"]
    t = setup_step  # one sample-step: events land while the first calls are in flight
    r.deploy.events = EventCursor([
        SpotEvent(0.5 * t, "notice", "spot0", deadline=3 * t),
        SpotEvent(1.5 * t, "loss", "spot1", abrupt=True),
        SpotEvent(3 * t, "loss", "spot0"),
        SpotEvent(4 * t, "join", "spot1")])
    got, info = r.spot_rollouts.rollout(0, prompts, seeds)
    assert info["sched_events"] >= 3
    assert info["sched_lost_steps"] <= c.deployment.commit_every * len(got["seeds"])
    r.deploy.events = EventCursor([])
    calm, calm_info = r.spot_rollouts.rollout(0, prompts, seeds)
    assert calm_info["sched_events"] == 0
    for key in ("latents", "log_probs", "images", "rewards", "tokens", "seeds", "prompt_ids"):
        np.testing.assert_array_equal(got[key], calm[key])     # bitwise: nothing lost or redone
    # the direct one-program rollout runs other batch shapes: equal up to float rounding
    direct = r.rollout(prompts, seeds)
    for key in ("latents", "log_probs", "images"):
        np.testing.assert_allclose(got[key], direct[key], atol=1e-5)
    for key in ("tokens", "seeds", "prompt_ids"):
        np.testing.assert_array_equal(got[key], direct[key])


def test_scheduled_rollout_computes_on_the_groups_own_devices(tmp_path, base):
    # deployment.rollout_on_groups: every SP group runs its requests on its own devices (SP 2
    # on the on-demand node's pair, SP 1 on each of two spot nodes: three programs to compile);
    # a request handed from one group to another by a notice still ends equal to the
    # one-program direct rollout
    from spotlight_jax.emulation.clock import EventCursor
    from spotlight_jax.emulation.traces import SpotEvent

    graphdef, state = base
    c = mode_config("spot_rollout", iterations=1)   # (no spot fleet to build)
    c.deployment.rollout_on_groups = "true"
    c.deployment.on_demand_devices, c.deployment.spot_nodes = 2, 2
    c.deployment.commit_every = 1
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    prompts = r.prompts(0)
    seeds = group_seeds(c.seed, 0, len(prompts), c.rl.group_size)
    t = r.deploy.scheduler_setup(8, 1.0)["sample_step_s"]
    r.deploy.events = EventCursor([SpotEvent(0.5 * t, "notice", "spot0", deadline=3 * t),
                                   SpotEvent(1.5 * t, "loss", "spot1", abrupt=True)])
    got, info = r.spot_rollouts.rollout(0, prompts, seeds)
    assert info["sched_events"] >= 2
    ran = {d for st in r.spot_rollouts.steppers if st.calls for d in st.group.device_ids}
    assert info["sched_group_devices"] == len(ran)
    assert len(ran) == 4 and ran - {d.id for d in r.mesh.devices.flat}, ran
    assert any(st.group.degree == 2 and st.calls for st in r.spot_rollouts.steppers)
    direct = r.rollout(prompts, seeds)
    for key in ("latents", "log_probs", "images"):
        np.testing.assert_allclose(got[key], direct[key], atol=1e-5)
    for key in ("tokens", "seeds", "prompt_ids"):
        np.testing.assert_array_equal(got[key], direct[key])
    r.close()


def test_too_few_devices_for_the_scheduler_pool_runs_rollouts_directly(tmp_path, base, caplog):
    """One on-demand device plus one per spot node are needed for the scheduler's pool; with 8
    devices and 8 spot nodes (a one-GPU runtime in miniature) the rollouts run directly."""
    graphdef, state = base
    c = mode_config("spot_rollout", iterations=1)
    c.deployment.spot_nodes = len(jax.devices())
    run = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    assert not run.scheduler_on
    assert "cannot hold the scheduler's pool" in caplog.text
    row = run.step(0)
    assert "sched_makespan_s" not in row and row["vtime_s"] > 0
    c.deployment.spot_nodes = 2
    assert runner.build_run(RunSpec.from_config(c), str(tmp_path / "b"), graphdef,
                            state).scheduler_on


def test_rollout_on_groups_setting_resolves_and_rejects_bad_values():
    assert rollout_on_groups("auto") is False        # emulated CPU devices
    assert rollout_on_groups("True") is True
    assert rollout_on_groups(False) is False
    with pytest.raises(ValueError, match="'sometimes'"):
        rollout_on_groups("sometimes")


def test_decoupled_advantage_trains_on_each_constraint_normalised(tmp_path, base):
    from spotlight_jax.rewards import resolve
    from spotlight_jax.rl import advantages, decoupled_advantages
    from spotlight_jax.runner.update import train_on
    graphdef, state = base
    c = mode_config("baseline", iterations=1)
    c.rl.advantage = "decoupled"
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    seen = {}
    update = r.trainer.update

    def capture(batch, key, k):
        seen.update(batch)
        return update(batch, key, k)

    r.trainer.update = capture
    prompts = r.prompts(0)
    batch = r.rollout(prompts, group_seeds(c.seed, 0, len(prompts), c.rl.group_size))
    train_on(r, batch, 0, prompts)
    flat = [prompts[i] for i in batch["prompt_ids"]]
    parts = resolve("geneval_lite").components()(batch["images"], flat)
    want = decoupled_advantages(parts, batch["prompt_ids"])
    np.testing.assert_array_equal(seen["advantages"], want)
    assert np.any(want != 0)
    # the scalar reward's advantages differ (the constraints are not weighted by their spread)
    assert not np.allclose(want, advantages(batch["rewards"], batch["prompt_ids"]))
    r.close()
    for bad, match in (({"advantage": "per_part"}, "use 'reward' or 'decoupled'"),
                       ({"advantage": "decoupled", "global_std": True}, "global_std"),
                       ({"advantage": "decoupled", "reward": "ocr_lite"}, "no components")):
        c2 = mode_config("baseline", iterations=1)
        c2.rl.update(bad)
        with pytest.raises(ValueError, match=match):
            runner.build_run(RunSpec.from_config(c2), str(tmp_path / "bad"), graphdef, state)


def test_shaped_training_reward_is_measured_by_the_eval_reward(tmp_path, base):
    from spotlight_jax import rewards
    from spotlight_jax.evaluate import evaluate
    graphdef, state = base
    c = mode_config("baseline", iterations=1)
    c.rl.reward = "geneval_lite_shaped"
    c.rl.eval_reward = "geneval_lite"
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    prompts = r.prompts(0)
    batch = r.rollout(prompts, group_seeds(c.seed, 0, len(prompts), c.rl.group_size))
    flat = [prompts[i] for i in batch["prompt_ids"]]
    np.testing.assert_array_equal(batch["rewards"],
                                  rewards.get("geneval_lite_shaped")(batch["images"], flat))
    got = outputs.evaluate(r, 0)
    want, _, _ = evaluate(r.eval_sampler, r.trainer.eval_state(), r.val_prompts,
                          num_seeds=c.rl.eval_seeds, text_len=r.mcfg.text_len,
                          reward=rewards.resolve("geneval_lite"))
    assert got["reward"] == want["reward"] and "acc_text" in got
    r.close()
    c.rl.eval_reward = "imagereward"
    # (a ConfigError, a ValueError, now raised as the spec is built, before the run starts)
    with pytest.raises(ValueError, match="rl.eval_reward='imagereward': unknown reward"):
        runner.build_run(RunSpec.from_config(c), str(tmp_path / "bad"), graphdef, state)


def test_exploration_budget_fits_base_and_extra_candidates_in_the_update_window():
    """The planner's budget covers extras only; the controller deducts the prompts x G base
    candidates every exploration also scores, so the whole exploration fits the update's
    window on the live spot devices (it used to overrun it when preemptions shrank the fleet)."""
    from spotlight_jax.explore import Planner, PlannerConfig
    assert extras_budget_s(10.0, 4, 16, 0.5) == 40.0 - 16 * 0.5
    assert extras_budget_s(1.0, 2, 16, 0.5) == 0.0      # the base alone fills it
    P, G, per = 8, 8, 0.5
    planner = Planner(PlannerConfig(group_size=G, max_extra_per_prompt=24))
    prompts = [f"p{i}" for i in range(P)]
    for devices in (8, 6, 4, 2):
        window = 20.0       # 8 devices: 160 device-s, all 8 x 32 candidates cost 128
        plan = planner.plan(prompts, extras_budget_s(window, devices, P * G, per),
                            per)
        used = sum(plan.values()) * per / devices
        assert used <= window + 1e-9, (devices, used)
        if devices <= 6:        # the window binds: fewer candidates than the 8 x 32 cap
            assert sum(plan.values()) < P * (G + 24)


def test_pipelined_trains_on_the_batch_its_spot_devices_sampled(tmp_path, base):
    """spotlight_pipelined: the candidates explored during update k with the sampling policy of
    that moment are iteration k+1's batch (the chosen seeds' own rollouts, rewards of those very
    images, the policy that sampled them kept for the loss), and iteration k+1 charges no
    rollout or reward time: its critical path is the update."""
    graphdef, state = base
    c = mode_config("spotlight_pipelined", iterations=2, objective="nft")
    c.rl.nft.anchor = "sampler"          # the sampling policy is kept (the default needs none)
    r = runner.build_run(RunSpec.from_config(c), str(tmp_path), graphdef, state)
    stale = jax.tree.map(np.asarray, r.trainer.sampling_state())      # θ_old before update 0
    old_before = jax.tree.map(np.asarray, r.trainer.old)
    assert r.step(0)["pipelined"] == 0                                 # nothing ready yet
    k, batch, generator = r.mode.pending
    assert k == 1 and r.next_seeds is not None
    prompts = r.prompts(1)
    G = c.rl.group_size
    np.testing.assert_array_equal(batch["prompt_ids"], np.repeat(np.arange(len(prompts)), G))
    assert [sorted(batch["seeds"][i * G:(i + 1) * G].tolist()) for i in range(len(prompts))] \
        == [sorted(ss) for ss in r.next_seeds]
    flat = [prompts[i] for i in batch["prompt_ids"]]
    again = r.engine.run(stale, flat, batch["seeds"])       # the same seeds, on the trainer
    np.testing.assert_allclose(batch["images"], again["images"], atol=1e-5)
    np.testing.assert_allclose(batch["latents"], again["latents"], atol=1e-5)
    np.testing.assert_array_equal(batch["rewards"],
                                  np.asarray(r.engine.reward_fn(batch["images"], flat),
                                             np.float32))
    for x, y in zip(jax.tree.leaves(generator), jax.tree.leaves(old_before)):
        np.testing.assert_array_equal(np.asarray(x), y)
    before = r.deploy.clock.breakdown()
    row = r.step(1)
    assert row["pipelined"] == 1 and r.mode.pending[0] == 2
    after = r.deploy.clock.breakdown()
    # no rollout and no reward phase on the critical path: the spot groups sampled and rewarded
    # the batch during update 0, and their exploration charge holds both
    for phase in ("rollout", "reward"):
        assert after[phase]["critical_s"] == before[phase]["critical_s"] > 0, phase
    assert np.isfinite(row["loss"]) and row["reward_mean"] == pytest.approx(
        float(batch["rewards"].mean()))
    r.close()
