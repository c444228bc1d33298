"""Chaos tests of the scheduler: random preemption schedules (notices, abrupt losses, joins,
network stalls, corrupted commits) replayed on groups of the 8 emulated devices (an on-demand node
of 4 + two spot nodes of 2). Every request completes exactly once, results equal an undisturbed
run bit for bit, and the work lost per abrupt loss is bounded by ``commit_every``.

These use the cheap toy stepper (same resumable contract as the model); the real model path is
tested in test_sched_real.py.
"""
import functools

import pytest

from spotlight_jax.emulation import ReplayConfig, SpotTrace, replay, synthetic_trace
from spotlight_jax.sched import (
    QueueConfig,
    RequestQueue,
    SimConfig,
    SimEvent,
    Simulation,
    StepCost,
    ToyStepper,
    WorkerConfig,
    events_from_replay,
    make_requests,
    random_schedule,
    results_equal,
)

SHAPE = (4, 4, 3)
T = 8
PROMPTS = ["a red bar", "two blue squares", 'the text "37"']
NODES = ("od0", "spot0", "spot1")
SPOT = ("spot0", "spot1")


def requests(n_rollout, n_explore=0):
    return (make_requests(n_rollout, num_steps=T, prompts=PROMPTS)
            + make_requests(n_explore, num_steps=T, prompts=PROMPTS, kind="explore",
                            prefix="e", seed0=1000))


def simulate(reqs, events=(), worker=None, policy=None, down_at_start=(), **cfg):
    worker = worker or WorkerConfig()
    q = RequestQueue(SHAPE, cfg.pop("queue", QueueConfig()))
    q.submit(reqs)
    sim = Simulation(q, lambda g: ToyStepper(SHAPE, T), events,
                     SimConfig(worker=worker, **cfg), policy=policy, down_at_start=down_at_start)
    return q, sim.run()


@functools.cache
def reference(n_rollout, n_explore):
    """Undisturbed run (no events); the toy stepper's rows never depend on the batch, so one
    reference serves every worker config."""
    q, rep = simulate(requests(n_rollout, n_explore))
    assert q.all_done and rep.wasted_steps == 0
    return q.results(), rep.makespan


def check_run(q, rep, ref, bound):
    """Exactly once, bit-identical, full accounting, lost work within the bound."""
    assert q.all_done, q.summary()
    q.check_invariants()
    assert rep.completed == q.num_requests == q.stats["completed"]   # each completed once
    assert results_equal(ref, q.results()) == []
    rep.check_accounting()
    for loss in rep.losses:
        if not loss["stalled"]:       # an abrupt loss during a partition is a double fault
            assert loss["max_lost_per_request"] <= bound + 1e-9, loss
            assert loss["lost_steps"] <= bound * loss["requests"] + 1e-9, loss


CONFIGS = [WorkerConfig(commit_every=2), WorkerConfig(commit_every=1),
           WorkerConfig(commit_every=3, steps_per_call=1), WorkerConfig(commit_every=None),
           WorkerConfig(commit_every=2, microbatch=2), WorkerConfig(commit_every=4,
                                                                    steps_per_call=2)]


def test_chaos_random_schedules_hundreds_of_events(capsys):
    n_rollout, n_explore = 30, 6
    ref, makespan = reference(n_rollout, n_explore)
    total, kinds, losses, dupes = 0, {}, 0, 0
    for seed in range(24):
        wc = CONFIGS[seed % len(CONFIGS)]
        events = random_schedule(seed, spot_nodes=SPOT, all_nodes=NODES, horizon_s=makespan,
                                 num_events=18, lead_time_s=(12.0, 40.0), p_abrupt=0.4,
                                 p_stall=0.12, p_corrupt=0.12, stall_s=(5.0, 60.0))
        q, rep = simulate(requests(n_rollout, n_explore), events, worker=wc)
        check_run(q, rep, ref, wc.commit_every or T)
        total += rep.num_events
        losses += len(rep.losses)
        dupes += q.stats["duplicates"] + q.stats["stale"]
        for k, v in rep.events.items():
            kinds[k] = kinds.get(k, 0) + v
    with capsys.disabled():
        print(f"\n[chaos] {total} events applied over 24 schedules: {kinds}; "
              f"{losses} groups killed; {dupes} late results dropped")
    assert total >= 300
    assert kinds["abrupt_loss"] >= 30 and kinds["notice"] >= 30 and kinds["join"] >= 30
    assert kinds["corrupt"] >= 20 and kinds["stall"] >= 20 and dupes > 0


def test_notices_lose_no_denoising_step():
    """Notice-only schedules: every in-flight request is committed before the deadline, so the
    steps computed equal the steps needed, exactly."""
    ref, makespan = reference(30, 0)
    total = flushed = 0
    for seed in range(8):
        wc = WorkerConfig(commit_every=4, steps_per_call=1)   # notices land between commits
        events = random_schedule(100 + seed, spot_nodes=SPOT, all_nodes=NODES,
                                 horizon_s=makespan, num_events=12, lead_time_s=(6.0, 30.0),
                                 p_abrupt=0.0, p_stall=0.0, p_corrupt=0.0)
        # half the runs keep working through the lead time, with background heartbeats
        extra = {"use_notice_lead": True, "heartbeat_s": 2.0} if seed % 2 else {}
        q, rep = simulate(requests(30), events, worker=wc, **extra)
        check_run(q, rep, ref, 4)
        assert rep.events["notice"] > 0 and all(n["ok"] and n["lost_steps"] == 0
                                                for n in rep.notices)
        assert rep.wasted_steps == 0 and rep.executed_steps == rep.required_steps
        flushed += sum(n["committed"] for n in rep.notices)
        total += rep.num_events
    assert total >= 40 and flushed > 0     # notices did land between commits


@pytest.mark.parametrize("k", [1, 2, 4])
def test_abrupt_losses_lose_at_most_commit_every_steps(k):
    ref, makespan = reference(30, 0)
    lost = []
    for seed in range(4):
        events = random_schedule(200 + seed, spot_nodes=SPOT, all_nodes=NODES,
                                 horizon_s=makespan, num_events=10, lead_time_s=(10.0, 20.0),
                                 p_abrupt=1.0, p_stall=0.0, p_corrupt=0.0)
        q, rep = simulate(requests(30), events, worker=WorkerConfig(commit_every=k))
        check_run(q, rep, ref, k)
        lost += [x["max_lost_per_request"] for x in rep.losses if x["requests"]]
    assert lost and max(lost) <= k and max(lost) > 0


@pytest.mark.parametrize("source", ["synthetic", "handmade"])
def test_replayed_spot_trace(source):
    """Events from elastic.traces.replay: a synthetic trace (Poisson preemptions, 30 s notices,
    half abrupt), and a hand-made one that starts with a spot node down."""
    ref, _ = reference(60, 6)
    if source == "synthetic":
        trace = synthetic_trace(2, 900.0, rate_per_node_hour=90.0, mean_outage_s=20.0,
                                gap_seconds=5.0, seed=3)
    else:
        trace = SpotTrace(5.0, (1, 1, 1, 2, 2, 2, 1, 1, 0, 0, 2, 2, 2, 2) * 6)
    rp = replay(trace, list(SPOT), ReplayConfig(lead_time_s=30.0, abrupt_fraction=0.5, seed=3))
    down = [n for n in rp.nodes if n not in rp.initial_alive]
    assert (source == "handmade") == bool(down)
    q, rep = simulate(requests(60, 6), events_from_replay(rp), worker=WorkerConfig(commit_every=2),
                      down_at_start=down)
    check_run(q, rep, ref, 2)
    assert rep.events["abrupt_loss"] + rep.events["loss"] >= 2 and rep.events["join"] >= 1


def test_partitioned_group_late_results_are_dropped():
    """od0 is cut off from the queue for longer than a lease: its requests are re-run by the
    spot groups, and od0's late commits (stale or duplicate) are dropped, not double-counted."""
    ref, _ = reference(30, 0)
    events = [SimEvent(3.0, "stall", "od0", duration=35.0)]
    q, rep = simulate(requests(30), events, worker=WorkerConfig(commit_every=2))
    check_run(q, rep, ref, 2)
    assert q.stats["expired_leases"] >= 1 and q.stats["duplicates"] + q.stats["stale"] >= 1
    assert rep.wasted_by["duplicate"] + rep.wasted_by["stale"] > 0


def test_policy_versions_in_simulation():
    """Spot groups hold a stale version: they only explore (recording it); the training
    rollouts run on the on-demand group, which has the current one."""
    reqs = (make_requests(12, num_steps=T, prompts=PROMPTS, kind="explore",
                          policy_version=1, prefix="e", seed0=500)
            + make_requests(12, num_steps=T, prompts=PROMPTS, policy_version=1))
    q, rep = simulate(reqs, policy=lambda node: (1, 1) if node == "od0" else (0, 0))
    assert q.all_done
    done = q.completed()
    assert all(done[r.rid].group_id.startswith("od0") for r in reqs if r.kind == "rollout")
    assert q.stats["version_skips"] > 0
    versions = {v for r in q.results().values() if r.kind == "explore" for v in r.state.versions}
    assert versions == {0, 1}
    assert all(set(r.state.versions) == {1} for r in q.results().values() if r.kind == "rollout")


def test_capacity_sized_pulls_shrink_the_idle_tail():
    """Groups of 4, 2, 2 devices: capacity-sized (guided) pulls leave a smaller idle tail than
    fixed equal batches (the benchmark reports the numbers)."""
    cost = StepCost(sp_efficiency=1.0, call_overhead_s=0.0, commit_s=0.0)
    tails = {}
    for name, qc in {"capacity": QueueConfig(),
                     "fixed": QueueConfig(sizing="fixed", fixed_batch=8)}.items():
        q, rep = simulate(requests(200), queue=qc, cost=cost,
                          worker=WorkerConfig(commit_every=None))
        assert q.all_done
        tails[name] = rep.idle_tail_device_s / (8 * rep.makespan)
    assert tails["capacity"] < tails["fixed"], tails
