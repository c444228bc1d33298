"""The shared update's window: each gradient shard accepted exactly once whatever happens (a
notice mid-shard, an abrupt loss, a straggler), every attempt accounted for, the window no
longer than the trainer alone plus one recomputation; shards run only at their version."""
import pytest

from spotlight_jax.sched import Commit, QueueConfig, Request, RequestQueue, SimEvent
from spotlight_jax.sched.update_window import TRAINER, ShardGroup, simulate_window

TRAINER_S = 1.0          # the trainer's seconds per shard


def _groups(spot_s=2.2, nodes=4):
    return [ShardGroup(TRAINER, "od0", 4, TRAINER_S)] + [
        ShardGroup(f"spot{i}/0", f"spot{i}", 2, spot_s) for i in range(nodes)]


def test_no_event_every_shard_once_and_the_window_shorter():
    r = simulate_window(16, _groups(), version=3)
    r.check_accounting()
    # pull-based: the trainer takes a shard per second, each spot group one per 2.2 s; at 5 s
    # the idle trainer takes over a shard due at 6.6 s (it finishes it at 6 s: the spot
    # group's late result is dropped)
    assert r.lost == 0 and r.dropped == 1 and r.attempts == 17
    assert r.spot_shards == 10 and r.seconds == pytest.approx(6.6)
    assert r.seconds < 16 * TRAINER_S
    assert sum(r.spot_busy_s.values()) == pytest.approx(r.spot_shards * 2.2 + r.wasted_s)
    alone = simulate_window(16, _groups(), version=3, spot_quota=0)
    assert alone.seconds == 16 * TRAINER_S and alone.spot_shards == 0 and not alone.spot_busy_s
    # a quota caps the spot groups' share; they wait for the step's weights
    capped = simulate_window(16, _groups(), version=3, spot_quota=4, spot_ready_s=0.5)
    capped.check_accounting()
    assert capped.spot_shards == 4 and capped.seconds == pytest.approx(12.0)


def test_notice_hands_back_abrupt_loss_is_recomputed_after_a_heartbeat():
    events = [SimEvent(0.5, "loss", "spot1", abrupt=True),
              SimEvent(1.0, "notice", "spot2", deadline=1.5),     # its shard is due at 2.2
              SimEvent(1.0, "notice", "spot3", deadline=5.0)]     # finishes, then leaves
    r = simulate_window(16, _groups(), version=0, events=events, heartbeat_s=1.0)
    r.check_accounting()
    assert r.lost == 2 and r.attempts == 18
    assert r.wasted_s == pytest.approx(0.5 + 1.0)                 # time spent before each
    shards_of = {g: sorted(i for i, c in r.computed_by.items() if c == g)
                 for g in set(r.computed_by.values())}
    assert "spot1/0" not in shards_of and "spot2/0" not in shards_of
    assert len(shards_of["spot3/0"]) == 1                          # its first, then no more
    log = dict((what, t) for t, what in r.log)
    assert log["shard00002 back to pending (loss)"] == pytest.approx(1.5)   # 0.5 + heartbeat
    assert log["shard00003 back to pending (notice)"] == pytest.approx(1.0)


def test_a_straggler_never_holds_the_step_longer_than_the_trainer_recomputing_it():
    slow = _groups(spot_s=100.0, nodes=2)          # spot groups 100x slower than the trainer
    r = simulate_window(8, slow, version=0)
    r.check_accounting()
    # the trainer does its shards, then takes the stragglers' over (their late results are
    # dropped): never longer than doing all of them alone
    assert r.seconds <= 8 * TRAINER_S + 1e-9
    assert r.spot_shards == 0 and r.dropped == 2
    assert any("takes over" in what for _, what in r.log)


@pytest.mark.parametrize("seed", range(20))
def test_random_chaos_accounting_holds_per_event(seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    events = []
    for node in range(4):
        t = float(rng.uniform(0, 8))
        if rng.random() < 0.5:
            events.append(SimEvent(t, "notice", f"spot{node}", deadline=t + rng.uniform(0, 3)))
        else:
            events.append(SimEvent(t, "loss", f"spot{node}", abrupt=True))
    n = int(rng.integers(4, 33))
    r = simulate_window(n, _groups(spot_s=float(rng.uniform(0.5, 5))), version=1,
                        events=sorted(events, key=lambda e: e.time),
                        spot_quota=int(rng.integers(0, n + 1)))
    r.check_accounting()
    # never worse than the trainer alone, plus the heartbeat a silent loss costs
    assert r.seconds <= n * TRAINER_S + 1.0 + 1e-9


def test_a_shard_runs_only_at_its_version_and_its_commit_carries_no_latent():
    q = RequestQueue((1,), QueueConfig(sizing="fixed", fixed_batch=1))
    q.submit([Request(rid="shard00000", prompt="", seed=0, num_steps=1, kind="shard",
                      policy_version=5)])
    assert q.pull("g", 1.0, policy_version=4, now=0.0) is None      # stale weights: no
    lease = q.pull("g", 1.0, policy_version=5, now=0.0)
    with pytest.raises(ValueError, match="gradient shard ran on policy version 4"):
        q.commit(lease.lease_id, Commit("shard00000", 0, 1, None, policy_version=4), 0.0)
    lease = q.pull("g", 1.0, policy_version=5, now=0.0)
    assert q.commit(lease.lease_id, Commit("shard00000", 0, 1, None, 5), 0.0) == "completed"
    assert q.commit(lease.lease_id, Commit("shard00000", 0, 1, None, 5), 0.0) == "duplicate"
    q.check_invariants()
