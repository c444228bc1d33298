"""State moves from live devices only: shrink re-wraps survivors' buffers (zero copy), grow copies
from a live replica on the node, a rejoining node pulls from a peer, never from a dead device."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spotlight_jax.elastic import (
    DevicePool,
    PoolConfig,
    StateLostError,
    move_tree,
    shard_views,
)
from spotlight_jax.parallel.mesh import MeshConfig, make_mesh


def host_tree():
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((24, 16)).astype(np.float32),
            "b": rng.standard_normal((16,)).astype(np.float32),
            "step": np.int32(7)}


def sp_mesh(devices):
    return make_mesh(devices, MeshConfig(data=1, fsdp=1, sp=len(devices)))


def delete_buffers_on(tree, lost):
    """Simulates a loss for real: the lost devices' buffers are freed."""
    for leaf in jax.tree.leaves(tree):
        for s in leaf.addressable_shards:
            if s.device.id in lost:
                s.data.delete()


def pointers(arr):
    return {s.device.id: s.data.unsafe_buffer_pointer() for s in arr.addressable_shards}


def assert_tree_equal(tree, host):
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(host)):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_shrink_8_to_6_rewraps_survivor_buffers_then_grow_copies():
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 8),)))
    devs = pool.devices()
    mesh8 = sp_mesh(devs)
    params = jax.device_put(host_tree(), NamedSharding(mesh8, P()))
    old_ptrs = {k: pointers(v) for k, v in params.items()}
    lost = {2, 5}
    pool.mark_lost(lost)
    delete_buffers_on(params, lost)
    mesh6 = sp_mesh(pool.devices())
    params6, rep = move_tree(params, mesh6, pool)

    assert rep.kind == "shrink" and rep.bytes_copied == 0 and rep.bytes_reused > 0
    assert rep.devices_before == tuple(range(8)) and rep.devices_after == (0, 1, 3, 4, 6, 7)
    assert not rep.source_devices & lost
    assert {s.method for s in rep.sources} == {"reuse"}
    assert rep.seconds > 0
    for k, v in params6.items():
        assert v.sharding == NamedSharding(mesh6, P())
        new = pointers(v)
        assert new == {d: p for d, p in old_ptrs[k].items() if d not in lost}  # zero copy
    assert_tree_equal(params6, host_tree())
    assert float(jnp.sum(params6["w"])) == pytest.approx(float(host_tree()["w"].sum()), rel=1e-5)

    pool.mark_joined(lost)
    params8, rep = move_tree(params6, mesh8, pool)
    assert rep.kind == "grow"
    copies = [s for s in rep.sources if s.method == "copy"]
    assert sorted({s.target_device for s in copies}) == [2, 5]
    assert all(pool.node_of(s.source_devices[0]) == "spot0" for s in copies)
    assert rep.bytes_copied == 2 * sum(np.asarray(x).nbytes for x in jax.tree.leaves(host_tree()))
    for k, v in params8.items():
        new = pointers(v)
        assert {d: new[d] for d in new if d not in lost} == pointers(params6[k])
        assert new[2] not in pointers(params6[k]).values()
    assert_tree_equal(params8, host_tree())


def test_losing_the_first_device_rewraps_via_shard_views(caplog):
    """JAX's wrapper cannot list shards once its first buffer is deleted: views taken before the
    loss still reach the survivors (zero copy); the bare array falls back to peers or fails."""
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 8),)))
    mesh8 = sp_mesh(pool.devices())
    params = jax.device_put(host_tree(), NamedSharding(mesh8, P()))
    views = shard_views(params)
    old = pointers(params["w"])
    pool.mark_lost([0, 1])
    delete_buffers_on(params, {0, 1})
    mesh6 = sp_mesh(pool.devices())
    with pytest.raises(StateLostError):
        move_tree(params, mesh6, pool)
    assert "shard_views" in caplog.text
    new, rep = move_tree(views, mesh6, pool)
    assert rep.kind == "shrink" and rep.bytes_copied == 0 and not rep.source_devices & {0, 1}
    assert pointers(new["w"]) == {d: p for d, p in old.items() if d > 1}
    assert_tree_equal(new, host_tree())


def test_rejoining_node_pulls_from_peer_never_from_dead_devices():
    pool = DevicePool()  # od0: 0-3, spot0: 4-5, spot1: 6-7
    spot0 = sp_mesh(pool.alive_devices("spot0"))
    spot1 = sp_mesh(pool.alive_devices("spot1"))
    p0 = jax.device_put(host_tree(), NamedSharding(spot0, P()))
    p1 = jax.device_put(host_tree(), NamedSharding(spot1, P()))
    views1 = shard_views(p1)
    pool.mark_node_lost("spot0")
    delete_buffers_on(p0, {4, 5})  # the node's memory is gone with it
    pool.mark_lost([6])  # the peer lost one device (its buffer deleted): the other one serves
    delete_buffers_on(p1, {6})
    pool.mark_node_joined("spot0")
    # p1's wrapper can no longer list its shards (its first buffer is gone): its views can
    new, rep = move_tree(p0, spot0, pool, peers=[views1])
    assert_tree_equal(new, host_tree())
    assert rep.kind == "peer_pull" and rep.source_devices == {7}
    assert {s.method for s in rep.sources} == {"copy"}


def test_rejoin_from_peer_and_trainer_copy():
    pool = DevicePool()
    spot0 = sp_mesh(pool.alive_devices("spot0"))
    spot1 = sp_mesh(pool.alive_devices("spot1"))
    trainer = make_mesh(pool.alive_devices("od0"), MeshConfig(data=1, fsdp=4, sp=1))
    p1 = jax.device_put(host_tree(), NamedSharding(spot1, P()))
    specs = {"w": P("fsdp", None), "b": P("fsdp"), "step": P()}
    ptrainer = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(trainer, s)),
                            host_tree(), specs)
    pool.mark_node_lost("spot0")
    pool.mark_node_joined("spot0")  # fresh devices: nothing of the old state is there
    new, rep = move_tree(None, spot0, pool, specs=jax.tree.map(lambda _: P(), specs),
                         peers=[p1, ptrainer])
    assert rep.kind == "peer_pull" and rep.source_devices <= {6, 7}  # the spot peer first
    assert_tree_equal(new, host_tree())
    pool.mark_node_lost("spot1")
    delete_buffers_on(p1, {6, 7})
    new, rep = move_tree(None, spot0, pool, specs=jax.tree.map(lambda _: P(), specs),
                         peers=[p1, ptrainer])
    assert rep.source_devices <= {0, 1, 2, 3}  # the trainer's FSDP shards, assembled
    assert {s.method for s in rep.sources if s.leaf != "['step']"} == {"assemble"}
    assert_tree_equal(new, host_tree())


def test_sharded_state_lost_without_a_replica():
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 8),)))
    mesh8 = make_mesh(pool.devices(), MeshConfig(data=1, fsdp=8, sp=1))
    w = jax.device_put(host_tree()["w"], NamedSharding(mesh8, P("fsdp", None)))
    pool.mark_lost([3])
    delete_buffers_on(w, {3})
    mesh4 = make_mesh(pool.devices()[:4], MeshConfig(data=1, fsdp=4, sp=1))
    with pytest.raises(StateLostError, match="no live device holds region"):
        move_tree(w, mesh4, pool)
    # a replicated copy elsewhere (the trainer's) rescues it; shards that survive are cut locally
    backup = jax.device_put(host_tree()["w"], jax.devices()[7])
    new, rep = move_tree(w, mesh4, pool, peers=[backup])
    np.testing.assert_array_equal(np.asarray(new), host_tree()["w"])
    assert 3 not in rep.source_devices


def test_target_mesh_with_dead_device_is_refused():
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 8),)))
    mesh = sp_mesh(pool.devices())
    p = jax.device_put(host_tree(), NamedSharding(mesh, P()))
    pool.mark_lost([0])
    with pytest.raises(ValueError, match="dead devices \\[0\\]"):
        move_tree(p, mesh, pool)
