"""The spot nodes' share of a phase, priced against the trace's events inside it
(``Deployment.spot_phase``), and one reward price for every device (``Deployment.reward_s``):
closed forms on hand-made events."""

import pytest

from spotlight_jax.config import load_config, make_deployment
from spotlight_jax.emulation.clock import EventCursor
from spotlight_jax.emulation.traces import SpotEvent


def _deployment(events=()):
    """4 on-demand devices + 4 spot nodes x 2 devices, every node up, then ``events``."""
    c = load_config("tiny")
    c.trace.rate_per_node_hour = 0.0
    d = make_deployment(c)
    assert d.alive_nodes == {f"spot{i}" for i in range(4)} and d.cfg.spot_devices_per_node == 2
    d.events = EventCursor(list(events))
    return d


def _redo(d):
    """Device-seconds an abrupt loss redoes: commit_every steps of a batch of 8, per device."""
    c = d.cfg
    return c.spot_devices_per_node * c.commit_every * d.cost.rollout(8, sp=c.spot_sp) / d.num_steps


def test_without_events_the_work_splits_over_every_live_spot_device():
    d = _deployment()
    p = d.spot_phase(80.0)
    assert p.seconds == pytest.approx(80.0 / 8)
    assert p.lost_device_s == p.stalled_s == p.handover_device_s == 0.0


def test_a_loss_with_notice_slows_the_rest_and_redoes_nothing():
    d = _deployment([SpotEvent(4.0, "loss", "spot0")])
    p = d.spot_phase(80.0)
    # 4 s on 8 devices (32 device-s), then 48 device-s on 6 devices
    assert p.seconds == pytest.approx(4.0 + 48.0 / 6)
    assert p.lost_device_s == 0.0


def test_an_abrupt_loss_redoes_its_work_since_the_last_commit():
    d = _deployment([SpotEvent(4.0, "loss", "spot0", abrupt=True)])
    redo = _redo(d)
    p = d.spot_phase(80.0)
    assert p.lost_device_s == pytest.approx(redo) and redo > 0
    assert p.seconds == pytest.approx(4.0 + (48.0 + redo) / 6)


def test_a_joined_node_works_once_it_has_regrouped():
    d = _deployment([SpotEvent(0.0, "loss", "spot3"), SpotEvent(2.0, "join", "spot3")])
    grow = d.cost.regroup("grow")
    assert grow > 0
    p = d.spot_phase(80.0)
    start = 2.0 + grow                                  # 6 devices until the regroup ends
    assert p.seconds == pytest.approx(start + (80.0 - 6 * start) / 8)


def test_the_on_demand_devices_take_what_no_spot_node_is_left_to_finish():
    d = _deployment([SpotEvent(1.0, "loss", f"spot{i}") for i in range(4)]
                    + [SpotEvent(500.0, "join", "spot0")])
    p = d.spot_phase(80.0)
    assert p.seconds == pytest.approx(1.0) and p.handover_device_s == pytest.approx(72.0)


def test_a_phase_reads_the_events_ahead_and_leaves_them_to_advance():
    d = _deployment([SpotEvent(4.0, "loss", "spot0")])
    d.spot_phase(80.0)
    assert d.events.position == 0 and "spot0" in d.alive_nodes
    d.clock.advance_to(5.0)
    d.advance()
    assert "spot0" not in d.alive_nodes and d.stats["preemptions"] == 1


def test_charging_a_phase_puts_the_stall_on_the_critical_path():
    d = _deployment([SpotEvent(4.0, "loss", "spot0", abrupt=True)])
    with d.clock.concurrent() as phase:
        p = d.charge_spot_work(phase, "explore", 80.0)
        phase.run("train", d.od, 1.0)
    assert d.clock.now() == pytest.approx(p.seconds)
    crit = {k: v["critical_s"] for k, v in d.clock.breakdown().items()}
    assert crit["explore"] + crit["spot_stall"] == pytest.approx(p.seconds)
    assert crit["spot_stall"] > 0
    assert d.stats["lost_work_s"] == pytest.approx(_redo(d))


def test_a_reward_costs_every_device_the_same_per_image():
    d = _deployment()
    per_image = d.cost.reward(1)
    assert d.reward_s(64, 4) == pytest.approx(64 * per_image / 4)
    assert d.reward_s(64, 12) == pytest.approx(64 * per_image / 12)
    # a candidate on a spot group: its rollout on the group's devices plus one image's reward
    sp = d.cfg.spot_sp
    assert d.spot_seconds_per_candidate() == pytest.approx(
        sp * d.cost.rollout(8, sp=sp) / 8 + per_image)
    assert d.od_seconds_per_candidate() == pytest.approx(d.cost.rollout(8, sp=1) / 8 + per_image)
    with pytest.raises(ValueError, match="at least one device"):
        d.reward_s(64, 0)
