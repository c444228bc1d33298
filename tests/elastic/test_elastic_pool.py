"""DevicePool: layout from PoolConfig, clear errors, liveness changes and their history."""
import jax
import pytest

from spotlight_jax.elastic import DevicePool, PoolConfig
from spotlight_jax.emulation import ReplayConfig, SpotEvent


def test_default_layout_on_8_devices():
    pool = DevicePool()
    assert pool.nodes == ("od0", "spot0", "spot1")
    assert [d.id for d in pool.alive_devices("od0")] == [0, 1, 2, 3]
    assert [d.id for d in pool.alive_devices("spot0")] == [4, 5]
    assert [d.id for d in pool.alive_devices("spot1")] == [6, 7]
    assert pool.role("od0") == "on_demand" and pool.role("spot1") == "spot"
    assert pool.nodes_with_role("spot") == ("spot0", "spot1")
    by_role = pool.alive_by_role()
    assert len(by_role["on_demand"]) == 4 and len(by_role["spot"]) == 4
    assert pool.node_of(jax.devices()[5]) == "spot0" and pool.node_of(5) == "spot0"
    assert pool.history == ()


def test_layout_needing_more_devices_than_exist():
    cfg = PoolConfig(nodes=(("od0", "on_demand", 4), ("spot0", "spot", 4), ("spot1", "spot", 2)))
    with pytest.raises(ValueError, match=r"needs 10 devices .* only 8 exist"):
        DevicePool(cfg)


@pytest.mark.parametrize("nodes, match", [
    ((), "at least one node"),
    ((("a", "spot", 2), ("a", "spot", 2)), "more than once"),
    ((("a", "preemptible", 2),), "role 'preemptible'"),
    ((("a", "spot", 0),), "positive integer"),
    ((("a", "spot"),), "not \\(name, role, num_devices\\)"),
])
def test_bad_layouts(nodes, match):
    with pytest.raises(ValueError, match=match):
        DevicePool(PoolConfig(nodes=nodes))


def test_fewer_devices_than_exist_uses_a_prefix():
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 3),)))
    assert [d.id for d in pool.devices()] == [0, 1, 2]
    assert pool.node_of(7) is None


def test_loss_join_and_history():
    pool = DevicePool()
    ev = pool.mark_node_lost("spot0", time=10.0, reason="preempted")
    assert [(e.kind, e.node, e.devices, e.time) for e in ev] == [("lost", "spot0", (4, 5), 10.0)]
    assert pool.alive_devices("spot0") == ()
    assert [d.id for d in pool.devices(role="spot")] == [6, 7]
    assert [d.id for d in pool.devices(node="spot0", alive=False)] == [4, 5]
    assert pool.dead_device_ids() == {4, 5}
    assert pool.mark_node_lost("spot0") == []  # already dead: no event
    pool.mark_lost([jax.devices()[7], 1])  # devices of two nodes: one event per node
    assert [(e.node, e.devices) for e in pool.history[1:]] == [("spot1", (7,)), ("od0", (1,))]
    assert not pool.is_alive(1) and pool.is_alive(0)
    pool.mark_joined([4])
    assert [d.id for d in pool.alive_devices("spot0")] == [4]
    pool.mark_node_joined("spot0")
    assert [d.id for d in pool.alive_devices("spot0")] == [4, 5]
    assert [e.kind for e in pool.history] == ["lost", "lost", "lost", "joined", "joined"]
    assert [e.seq for e in pool.history] == [0, 1, 2, 3, 4]
    assert "spot0(spot: 2/2 alive)" in repr(pool)


def test_errors_name_the_problem():
    pool = DevicePool()
    with pytest.raises(KeyError, match="unknown node 'spot9'"):
        pool.mark_node_lost("spot9")
    with pytest.raises(ValueError, match="not in the pool"):
        DevicePool(PoolConfig(nodes=(("s", "spot", 2),))).mark_lost([5])
    with pytest.raises(ValueError, match="unknown role"):
        pool.devices(role="reserved")


def test_apply_trace_events():
    pool = DevicePool()
    assert pool.apply(SpotEvent(1.0, "notice", "spot1", deadline=121.0)) == []
    pool.apply(SpotEvent(121.0, "loss", "spot1"))
    assert pool.alive_devices("spot1") == ()
    assert pool.history[-1].reason == "preempted"
    pool.apply(SpotEvent(500.0, "join", "spot1"))
    assert len(pool.alive_devices("spot1")) == 2
    assert ReplayConfig.preset("gcp").lead_time_s == 30.0


def test_local_pool_uses_real_local_devices():
    pool = DevicePool.local(role="spot")
    assert pool.devices() == tuple(jax.local_devices())
    assert pool.nodes == ("host0",)
