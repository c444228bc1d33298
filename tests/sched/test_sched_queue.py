"""Scheduler queue: committed-state round trips, bad input, leases, exactly-once, policy versions,
capacity-sized pulls."""
import dataclasses
import json

import numpy as np
import pytest

from spotlight_jax.sched import (
    Commit,
    CommitRejected,
    InProcessWorker,
    QueueConfig,
    Request,
    RequestQueue,
    StepCost,
    ToyStepper,
    WorkerConfig,
    capacity_of,
    make_requests,
)

SHAPE = (2, 2, 1)
T = 4
PROMPTS = ["a red bar", "two blue squares"]


def chunk(req: Request, n: int, *, version=None, seed_offset=0):
    """A well-formed commit of ``n`` more steps for ``req`` (arbitrary but deterministic)."""
    rng = np.random.default_rng(req.seed + 1000 * req.state.step + seed_offset)
    lat = rng.standard_normal((n, *SHAPE)).astype(np.float32)
    lp = rng.standard_normal(n).astype(np.float32)
    init = rng.standard_normal(SHAPE).astype(np.float32) if req.state.step == 0 else None
    return Commit(rid=req.rid, start=req.state.step, step=req.state.step + n, latent=lat[-1].copy(),
                  latents=lat, log_probs=lp, initial=init,
                  policy_version=req.policy_version if version is None else version)


def fresh(n=4, **cfg):
    q = RequestQueue(SHAPE, QueueConfig(lease_s=10.0, **cfg))
    q.submit(make_requests(n, num_steps=T, prompts=PROMPTS))
    return q


def test_request_state_round_trips_through_json_and_arrays():
    q = fresh(2)
    lease = q.pull("g", 1.0, 0, 0.0, max_requests=1)
    rid = lease.requests[0].rid
    q.commit(lease.lease_id, chunk(q.request(rid), 2), 1.0)
    req = q.request(rid)
    arrays, meta = req.to_state()
    meta = json.loads(json.dumps(meta))
    back = Request.from_state({k: np.array(v) for k, v in arrays.items()}, meta)
    assert back.rid == req.rid and back.state.step == 2 and back.state.versions == (0, 0)
    for name in ("latent", "initial", "latents", "log_probs"):
        np.testing.assert_array_equal(getattr(back.state, name), getattr(req.state, name))
    # the whole queue, mid-run: leased requests come back pending at their last commit
    qa, qm = q.to_state()
    q2 = RequestQueue.from_state(qa, json.loads(json.dumps(qm)))
    q2.check_invariants()
    assert q2.pending() == [f"r{i:04d}" for i in range(2)]
    assert q2.request(rid).state.step == 2


def test_queue_checkpoint_with_orbax(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    q = fresh(2)
    lease = q.pull("g", 1.0, 0, 0.0)
    for r in lease.requests:
        q.commit(lease.lease_id, chunk(r, 3), 1.0)
    arrays, meta = q.to_state()
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(tmp_path / "queue", arrays)
    ckptr.wait_until_finished()
    restored = ckptr.restore(tmp_path / "queue")
    q2 = RequestQueue.from_state(restored, json.loads(json.dumps(meta)))
    q2.check_invariants()
    for r in lease.requests:
        np.testing.assert_array_equal(q2.request(r.rid).state.latents,
                                      q.request(r.rid).state.latents)


@pytest.mark.parametrize("fault,match", [
    ("shape", r"latent has shape \(4,\), expected \(2, 2, 1\)"),
    ("dtype", "latent has dtype float64, expected float32"),
    ("step", r"step 9 out of range: must be in \(2, 4\]"),
    ("start", "chunk starts at step 0 but the last good commit is at step 2"),
    ("nan", "latent has non-finite values"),
    ("version", "training rollout ran on policy version 3; it must run on version 0"),
    ("latents", r"latents has shape \(1, 2, 2, 1\), expected \(2, 2, 2, 1\)"),
])
def test_malformed_commit_is_rejected_and_rerun_from_last_good_commit(fault, match):
    q = fresh(1)
    lease = q.pull("g", 1.0, 0, 0.0)
    req = lease.requests[0]
    q.commit(lease.lease_id, chunk(req, 2), 1.0)
    good = q.request(req.rid)
    c = chunk(good, 2)
    bad = {"shape": dataclasses.replace(c, latent=c.latent.reshape(-1)),
           "dtype": dataclasses.replace(c, latent=c.latent.astype(np.float64)),
           "step": dataclasses.replace(c, step=9),
           "start": dataclasses.replace(c, start=0),
           "nan": dataclasses.replace(c, latent=np.full(SHAPE, np.nan, np.float32)),
           "version": dataclasses.replace(c, policy_version=3),
           "latents": dataclasses.replace(c, latents=c.latents[:1])}[fault]
    with pytest.raises(CommitRejected, match=match) as err:
        q.commit(lease.lease_id, bad, 2.0)
    assert err.value.rid == req.rid and f"request {req.rid!r}" in str(err.value)
    # not dropped: pending again, at the last good commit (step 2, its arrays untouched)
    q.check_invariants()
    assert q.pending() == [req.rid] and q.request(req.rid) is good
    # the old lease no longer holds it; a new pull re-runs it from step 2 to completion
    assert q.commit(lease.lease_id, c, 2.5) == "stale"
    lease2 = q.pull("h", 1.0, 0, 3.0)
    assert lease2.requests[0].state.step == 2
    assert q.commit(lease2.lease_id, chunk(lease2.requests[0], 2), 4.0) == "completed"
    assert q.all_done and q.stats["rejected"] == 1


def test_unknown_request_id_is_rejected_clearly():
    q = fresh(1)
    lease = q.pull("g", 1.0, 0, 0.0)
    c = dataclasses.replace(chunk(lease.requests[0], 1), rid="nope")
    with pytest.raises(CommitRejected, match="'nope' rejected: unknown request id"):
        q.commit(lease.lease_id, c, 1.0)
    # the worker hands the request it meant back; it re-runs from its last good commit
    assert q.release(lease.lease_id, 1.0, ["r0000"]) == ["r0000"]
    q.check_invariants()
    assert q.pending() == ["r0000"]


def test_exactly_once_late_duplicates_and_stale_commits():
    q = fresh(1)
    a = q.pull("A", 1.0, 0, 0.0)
    req = a.requests[0]
    q.commit(a.lease_id, chunk(req, 2), 1.0)
    # A goes silent: its lease expires, B resumes from the commit and completes
    assert [le.lease_id for le in q.expire(11.5)] == [a.lease_id]
    b = q.pull("B", 1.0, 0, 12.0)
    assert b.requests[0].state.step == 2
    final = chunk(b.requests[0], 2)
    assert q.commit(b.lease_id, final, 13.0) == "completed"
    # A's late results are dropped and counted; so is B retrying its final commit
    assert q.commit(a.lease_id, chunk(q.request(req.rid), 2), 14.0) == "duplicate"
    assert q.commit(b.lease_id, final, 14.0) == "duplicate"
    assert q.stats["duplicates"] == 2 and q.stats["completed"] == 1
    assert q.completed()[req.rid].group_id == "B"
    q.check_invariants()

    q = fresh(1)
    a = q.pull("A", 1.0, 0, 0.0)
    q.expire(10.0)
    b = q.pull("B", 1.0, 0, 10.0)
    # A's non-final commit after losing the lease is stale; B's progress is untouched
    assert q.commit(a.lease_id, chunk(a.requests[0], 1), 10.5) == "stale"
    assert q.request("r0000").state.step == 0 and q.leased() == {"r0000": b.lease_id}
    assert not q.heartbeat(a.lease_id, 11.0) and q.heartbeat(b.lease_id, 11.0)


def test_leases_renew_on_commit_and_heartbeat():
    q = fresh(1)
    lease = q.pull("g", 1.0, 0, 0.0)
    assert lease.expires_at == 10.0
    q.commit(lease.lease_id, chunk(lease.requests[0], 1), 8.0)
    assert q.expire(12.0) == [] and q.next_expiry() == 18.0
    assert q.heartbeat(lease.lease_id, 17.0) and q.next_expiry() == 27.0
    assert len(q.expire(27.0)) == 1 and q.pending() == ["r0000"]
    assert q.request("r0000").state.step == 1   # the last commit survives the expiry


def test_invariant_check_catches_a_lost_request():
    q = fresh(3)
    q.pull("g", 1.0, 0, 0.0, max_requests=1)
    q.check_invariants()
    q._pending.discard("r0001")           # simulate a bug that loses a request
    with pytest.raises(AssertionError, match=r"r0001: pending/leased/completed = \[False"):
        q.check_invariants()


def test_policy_version_rules():
    q = RequestQueue(SHAPE, QueueConfig(lease_s=10.0, guided=False))
    q.submit(make_requests(2, num_steps=T, prompts=PROMPTS, policy_version=5))
    q.submit(make_requests(2, num_steps=T, prompts=PROMPTS, kind="explore", policy_version=5,
                           prefix="e"))
    stale = q.pull("old", 1.0, 4, 0.0, max_requests=10)
    # a group with an older version gets only exploration requests; rollouts stay pending
    assert sorted(r.rid for r in stale.requests) == ["e0000", "e0001"]
    assert q.pending() == ["r0000", "r0001"] and q.stats["version_skips"] == 2
    assert q.pull("old", 1.0, 4, 0.0) is None
    # an exploration request records the (stale) version it ran on
    e = stale.requests[0]
    c = Commit(e.rid, 0, 2, np.zeros(SHAPE, np.float32), policy_version=4)
    assert q.commit(stale.lease_id, c, 1.0) == "accepted"
    c2 = Commit(e.rid, 2, T, np.ones(SHAPE, np.float32), policy_version=5)
    assert q.commit(stale.lease_id, c2, 1.0) == "completed"
    assert q.request(e.rid).state.versions == (4, 4, 5, 5)
    # the current-version group gets the rollouts
    cur = q.pull("new", 1.0, 5, 1.0, max_requests=10)
    assert [r.rid for r in cur.requests] == ["r0000", "r0001"]
    # a rollout chunk run on another version is rejected and re-queued (never accepted)
    with pytest.raises(CommitRejected, match="must run on version 5"):
        q.commit(cur.lease_id, chunk(cur.requests[0], 2, version=4), 2.0)
    assert "r0000" in q.pending()
    # an exploration worker on a stale version, through the real worker loop
    q3 = RequestQueue((4, 4, 3), QueueConfig(lease_s=10.0))
    q3.submit(make_requests(3, num_steps=T, prompts=PROMPTS, kind="explore", policy_version=2))
    w = InProcessWorker("w", ToyStepper((4, 4, 3), T), params=1, version=1)
    w.run(q3)
    assert q3.all_done and all(r.state.versions == (1,) * T for r in q3.results().values())


def test_pulls_are_sized_to_capacity_and_shrink_at_the_tail():
    cost = StepCost(sp_efficiency=1.0, call_overhead_s=0.0)
    caps = {"g4": capacity_of(cost, 4), "g2a": capacity_of(cost, 2), "g2b": capacity_of(cost, 2)}
    assert caps == {"g4": 4.0, "g2a": 2.0, "g2b": 2.0}
    q = fresh(100, batch_per_capacity=2.0)
    for g, c in caps.items():
        q.register_group(g, c)
    sizes = {g: len(q.pull(g, c, 0, 0.0).requests) for g, c in caps.items()}
    assert sizes == {"g4": 8, "g2a": 4, "g2b": 4}       # proportional to capacity
    # partially done requests weigh less: a half-done request counts half
    q2 = RequestQueue(SHAPE, QueueConfig(lease_s=10.0, batch_per_capacity=1.0, guided=False))
    q2.submit(make_requests(8, num_steps=T, prompts=PROMPTS))
    first = q2.pull("x", 4.0, 0, 0.0)
    for r in first.requests:
        q2.commit(first.lease_id, chunk(r, 2), 0.5)
    q2.release(first.lease_id, 1.0)
    assert len(q2.pull("y", 2.0, 0, 1.0).requests) == 4    # 4 half-done = 2 units
    # guided: near the end each group takes at most its capacity share of what is left
    q3 = fresh(10, batch_per_capacity=2.0)
    for g, c in caps.items():
        q3.register_group(g, c)
    tail = {g: len(q3.pull(g, c, 0, 0.0).requests) for g, c in caps.items()}
    assert tail == {"g4": 5, "g2a": 1, "g2b": 1}      # 10*4/8; 5*2/8 -> 1; 4*2/8
    assert len(q3.pending()) == 3                        # for whoever finishes first
    # fixed sizing ignores capacity (the baseline)
    q4 = fresh(100, sizing="fixed", fixed_batch=3)
    assert [len(q4.pull(g, c, 0, 0.0).requests) for g, c in caps.items()] == [3, 3, 3]


def test_worker_run_loop_with_commits_and_rejection():
    """The real-time loop: every request completes once; a rejected commit is re-run."""
    q = RequestQueue((4, 4, 3), QueueConfig(lease_s=1e9))
    q.submit(make_requests(5, num_steps=T, prompts=PROMPTS))
    w = InProcessWorker("w", ToyStepper((4, 4, 3), T), config=WorkerConfig(commit_every=2))
    calls = []

    def tamper(c):   # the first commit of r0001 arrives corrupted
        calls.append(c.rid)
        return dataclasses.replace(c, step=99) if calls.count("r0001") == 1 and \
            c.rid == "r0001" else c
    lease = q.pull("w", w.capacity, 0, 0.0)
    w.load(lease)
    while (plan := w.plan()) is not None:
        w.deliver(q, w.execute(plan), 0.0, tamper=tamper)
    assert q.stats["rejected"] == 1 and "r0001" in q.pending()
    w.run(q)
    q.check_invariants()
    assert q.all_done and q.stats["completed"] == 5
    ref = RequestQueue((4, 4, 3), QueueConfig(lease_s=1e9))
    ref.submit(make_requests(5, num_steps=T, prompts=PROMPTS))
    InProcessWorker("v", ToyStepper((4, 4, 3), T), config=WorkerConfig(commit_every=None)).run(ref)
    for rid, r in ref.results().items():
        np.testing.assert_array_equal(q.request(rid).trajectory()["latents"],
                                      r.trajectory()["latents"])


def test_retained_exploration_keeps_trajectories_on_the_worker_not_in_commits():
    """``WorkerConfig.retain``: exploration commits carry the latent only; the worker keeps
    each completed request's trajectory, bitwise the one a rollout request of the same seed
    ships; a request resumed from another worker's commit is not retained there; a new policy
    version clears them."""
    q = RequestQueue((4, 4, 3), QueueConfig(lease_s=1e9))
    q.submit(make_requests(5, num_steps=T, prompts=PROMPTS, kind="explore"))
    w = InProcessWorker("w", ToyStepper((4, 4, 3), T),
                        config=WorkerConfig(commit_every=2, retain=True))
    lease = q.pull("w", w.capacity, 0, 0.0)
    w.load(lease)
    sent = []
    while (plan := w.plan()) is not None:
        commits = w.execute(plan)
        sent += commits
        w.deliver(q, commits, 0.0)
    assert sent and all(c.latents is None and c.log_probs is None for c in sent)
    held = w.retained([f"r{i:04d}" for i in range(5)] + ["nope"])
    assert set(held) == {r.rid for r in lease.requests}
    ref = RequestQueue((4, 4, 3), QueueConfig(lease_s=1e9))
    ref.submit(make_requests(5, num_steps=T, prompts=PROMPTS, kind="rollout"))
    InProcessWorker("v", ToyStepper((4, 4, 3), T), config=WorkerConfig(commit_every=2)).run(ref)
    for rid, t in held.items():
        want = ref.results()[rid].trajectory()
        assert t["latents"].shape == (T + 1, 4, 4, 3)
        np.testing.assert_array_equal(t["latents"], want["latents"])
        np.testing.assert_array_equal(t["log_probs"], want["log_probs"])
    # a request another worker started: resumed here from its commit, not retained here
    q2 = RequestQueue((4, 4, 3), QueueConfig(lease_s=1e9))
    q2.submit(make_requests(1, num_steps=T, prompts=PROMPTS, kind="explore"))
    a = InProcessWorker("a", ToyStepper((4, 4, 3), T),
                        config=WorkerConfig(commit_every=2, retain=True))
    a.load(q2.pull("a", a.capacity, 0, 0.0))
    a.deliver(q2, a.execute(a.plan()) + a.flush(), 0.0)     # 1 step, committed, then gone
    q2.release(a.lease_id, 0.0)
    a.abandon()
    b = InProcessWorker("b", ToyStepper((4, 4, 3), T),
                        config=WorkerConfig(commit_every=2, retain=True))
    b.run(q2)
    assert q2.all_done and b.retained(["r0000"]) == {} and a.retained(["r0000"]) == {}
    w.set_policy(1, 1)
    assert w.retained(list(held)) == {}
