"""Regrouping inside nodes, the executable cache, and a full 8 -> 6 -> 8 regroup with deleted
buffers that compiles nothing on the critical path."""
import logging
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spotlight_jax.elastic import (
    DevicePool,
    ExecutableCache,
    GroupConfig,
    PoolConfig,
    choose_strategy,
    count_backend_compiles,
    enable_persistent_cache,
    form_groups,
    form_node_groups,
    move_tree,
    reachable_groups,
    reachable_survivor_sets,
)
from spotlight_jax.parallel.mesh import device_key

HEADS = 8
ONE_NODE = PoolConfig(nodes=(("spot0", "spot", 8),))


def test_strategy_choice():
    assert choose_strategy(8, 8)[:2] == ("ulysses", 8)
    assert choose_strategy(8, 1)[:2] == ("dense", 1)
    s, u, why = choose_strategy(8, 6)
    assert (s, u) == ("ring", 1) and "8 heads not divisible by SP degree 6" in why
    assert choose_strategy(8, 6, allow_usp=True)[:2] == ("usp", 2)
    assert choose_strategy(3, 6, allow_usp=True)[:2] == ("usp", 3)
    assert choose_strategy(5, 6, allow_usp=True)[:2] == ("ring", 1)


def test_regroup_8_6_8_heads_8(caplog):
    pool = DevicePool(ONE_NODE)
    cfg = GroupConfig(heads=HEADS, sp_degree=8)
    (g8,) = form_groups(pool, cfg)
    assert (g8.degree, g8.strategy, g8.device_ids) == (8, "ulysses", tuple(range(8)))
    assert g8.mesh.shape == {"data": 1, "fsdp": 1, "sp": 8}
    pool.mark_lost([2, 5])
    with caplog.at_level(logging.INFO, logger="spotlight_jax.elastic.groups"):
        (g6,) = form_groups(pool, cfg)
    assert (g6.degree, g6.strategy, g6.device_ids) == (6, "ring", (0, 1, 3, 4, 6, 7))
    fallback = [r for r in caplog.records if "ring attention" in r.getMessage()]
    assert len(fallback) == 1 and "[0, 1, 3, 4, 6, 7]" in fallback[0].getMessage()
    pool.mark_joined([2, 5])
    (g8b,) = form_groups(pool, cfg)
    assert g8b.key == g8.key and g8b.strategy == "ulysses"


def test_target_degree_and_remainder_policies():
    devs = jax.devices()[:6]
    groups = form_node_groups("n", devs, GroupConfig(heads=8, sp_degree=4))
    assert [(g.degree, g.strategy) for g in groups] == [(4, "ulysses"), (2, "ulysses")]
    groups = form_node_groups("n", devs, GroupConfig(heads=8, sp_degree=4, remainder="data"))
    assert [(g.degree, g.strategy) for g in groups] == [(4, "ulysses"), (1, "dense")]
    assert groups[1].mesh.shape == {"data": 2, "fsdp": 1, "sp": 1}
    # fewer devices than the target: use what is left, as one SP group
    (g,) = form_node_groups("n", devs[:3], GroupConfig(heads=8, sp_degree=4, remainder="data"))
    assert (g.degree, g.strategy) == (3, "ring")
    assert form_node_groups("n", (), GroupConfig(heads=8)) == ()


def test_random_losses_groups_cover_alive_spot_devices_within_nodes():
    rng = random.Random(0)
    pool = DevicePool()  # od0: 0-3, spot0: 4-5, spot1: 6-7
    cfg = GroupConfig(heads=HEADS, sp_degree=2)
    for _ in range(40):
        dev = rng.randrange(8)
        (pool.mark_lost if pool.is_alive(dev) and rng.random() < 0.6 else pool.mark_joined)([dev])
        groups = form_groups(pool, cfg, log=False)
        covered = sorted(i for g in groups for i in g.device_ids)
        assert covered == sorted(d.id for d in pool.devices(role="spot"))
        for g in groups:
            assert {pool.node_of(d) for d in g.devices} == {g.node}
            assert pool.role(g.node) == "spot"
            assert g.degree == len(g.devices) == g.mesh.devices.size


def test_reachable_sets_coverage():
    devs = jax.devices()
    assert len(reachable_survivor_sets(devs[:4])) == 15  # auto -> every subset
    assert len(reachable_survivor_sets(devs, "contiguous")) == 36
    assert len(reachable_survivor_sets(devs, "prefix")) == 8
    assert reachable_survivor_sets(devs[2:4], "node") == (tuple(devs[2:4]),)
    auto8 = reachable_survivor_sets(devs)  # contiguous runs + every single loss
    assert len(auto8) == 36 + 8 - 2
    assert tuple(d for d in devs if d.id != 3) in auto8
    groups = reachable_groups("spot0", devs[:4], GroupConfig(heads=HEADS, sp_degree=4))
    assert len(groups) == 15 and len({g.key for g in groups}) == 15


# ---- executable cache and a full regroup ------------------------------------------------------
D, S, B = 16, 24, 2  # S divides 8 and 6


def step(params, x):
    """Stand-in rollout step: per-token MLP on a sequence-sharded input, reduced over the
    sequence (so the SP devices must communicate)."""
    h = jnp.tanh(x @ params["w1"] + params["b"])
    return jnp.sum(h @ params["w2"], axis=1)


def abstract_args(mesh, batch=B):
    rep = NamedSharding(mesh, P())
    params = {"w1": jax.ShapeDtypeStruct((D, D), jnp.float32, sharding=rep),
              "b": jax.ShapeDtypeStruct((D,), jnp.float32, sharding=rep),
              "w2": jax.ShapeDtypeStruct((D, D), jnp.float32, sharding=rep)}
    x = jax.ShapeDtypeStruct((batch, S, D), jnp.float32,
                             sharding=NamedSharding(mesh, P(None, "sp", None)))
    return params, x


def host_params():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return {"w1": np.asarray(jax.random.normal(k1, (D, D))) / 4,
            "b": np.asarray(jax.random.normal(k2, (D,))),
            "w2": np.asarray(jax.random.normal(k3, (D, D))) / 4}


X = np.asarray(jax.random.normal(jax.random.key(1), (B, S, D)))


def put_x(mesh, x=X):
    return jax.device_put(x, NamedSharding(mesh, P(None, "sp", None)))


def test_cache_hits_and_same_result_as_fresh_jit(caplog):
    cache = ExecutableCache()
    devs = jax.devices()
    meshes = [g.mesh for g in form_node_groups("n", devs[:4], GroupConfig(heads=HEADS))]
    cache.precompile("step", step, abstract_args, meshes, batch_sizes=(2, 4))
    assert len(cache) == 2
    mesh = meshes[0]
    params = jax.device_put(host_params(), NamedSharding(mesh, P()))
    with count_backend_compiles() as c:
        exe = cache.get("step", mesh, 2)
        out = exe(params, put_x(mesh))
    assert c["n"] == 0 and cache.hits == 1 and cache.num_misses == 0
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.jit(step)(params, put_x(mesh))))
    # a batch size that was not precompiled is a logged miss that still works
    mesh3 = form_node_groups("n", devs[:3], GroupConfig(heads=HEADS))[0].mesh
    with caplog.at_level(logging.WARNING, logger="spotlight_jax.elastic.exec_cache"):
        exe3 = cache.get("step", mesh3, 2)
    assert cache.num_misses == 1 and cache.misses[0].key == device_key(mesh3)
    assert any("MISS" in r.getMessage() for r in caplog.records)
    out3 = exe3(jax.device_put(host_params(), NamedSharding(mesh3, P())), put_x(mesh3))
    np.testing.assert_allclose(np.asarray(out3), np.asarray(out), rtol=1e-5, atol=1e-5)
    assert ("step", device_key(mesh3), 2) in cache
    with pytest.raises(KeyError, match="never registered"):
        cache.get("other", mesh, 2)


def test_cache_compiles_with_the_registered_compiler_options():
    """A program's compiler options reach its compilation: an invalid value fails to compile,
    a valid one compiles the same function."""
    mesh = form_node_groups("n", jax.devices()[:1], GroupConfig(heads=HEADS))[0].mesh
    cache = ExecutableCache()
    cache.register("bad", step, abstract_args,
                   compiler_options={"xla_cpu_experimental_ynn_fusion_type": "no_such_fusion"})
    with pytest.raises(Exception, match="no_such_fusion"):
        cache.get("bad", mesh, 2)
    cache.precompile("good", step, abstract_args, [mesh], batch_sizes=(2,),
                     compiler_options={"xla_cpu_experimental_ynn_fusion_type": ""})
    params = jax.device_put(host_params(), NamedSharding(mesh, P()))
    out = cache.get("good", mesh, 2)(params, put_x(mesh, X[:2]))
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(step)(host_params(), X[:2])),
                               rtol=1e-5, atol=1e-5)


def test_regroup_8_6_8_with_deleted_buffers_compiles_nothing():
    """Precompile for the groups the node can reach, then lose 2 devices (their buffers deleted for
    real), regroup, move state, run; rejoin, move, run: no compile, results match a fresh jit and
    (within float tolerance, SP degree changed) the single-device result."""
    pool = DevicePool(ONE_NODE)
    cfg = GroupConfig(heads=HEADS, sp_degree=8)
    cache = ExecutableCache()
    (g8,) = form_groups(pool, cfg)
    lost = (2, 5)
    survivors = tuple(d for d in g8.devices if d.id not in lost)
    g6 = form_node_groups("spot0", survivors, cfg, log=False)[0]
    cache.precompile("step", step, abstract_args, [g8, g6])
    reference = np.asarray(jax.jit(step)(host_params(), X))  # single device

    params = jax.device_put(host_params(), NamedSharding(g8.mesh, P()))
    out8 = np.asarray(cache.get("step", g8)(params, put_x(g8.mesh)))
    np.testing.assert_allclose(out8, reference, rtol=1e-5, atol=1e-5)

    with count_backend_compiles() as compiles:
        pool.mark_lost(lost)
        for leaf in jax.tree.leaves(params):  # simulate the loss for real
            for shard in leaf.addressable_shards:
                if shard.device.id in lost:
                    shard.data.delete()
        (group,) = form_groups(pool, cfg, log=False)
        assert group.key == g6.key and group.strategy == "ring"
        params6, rep = move_tree(params, group.mesh, pool)
        out6 = cache.get("step", group)(params6, put_x(group.mesh))
        out6.block_until_ready()
        assert rep.kind == "shrink" and rep.bytes_copied == 0
        assert not rep.source_devices & set(lost)

        pool.mark_joined(lost)
        (group,) = form_groups(pool, cfg, log=False)
        assert group.key == g8.key
        params8, rep = move_tree(params6, group.mesh, pool)
        out8b = cache.get("step", group)(params8, put_x(group.mesh))
        out8b.block_until_ready()
        assert rep.kind == "grow" and rep.bytes_copied > 0
    assert compiles["n"] == 0 and cache.num_misses == 0, compiles
    fresh6 = jax.jit(step)(jax.device_put(host_params(), NamedSharding(g6.mesh, P())),
                           put_x(g6.mesh))
    np.testing.assert_array_equal(np.asarray(out6), np.asarray(fresh6))
    np.testing.assert_allclose(np.asarray(out6), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out8b), out8)


def test_enable_persistent_cache_sets_config(tmp_path):
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {n: getattr(jax.config, n) for n in names}
    try:
        path = enable_persistent_cache(tmp_path / "xla_cache")
        assert path.is_dir()
        assert jax.config.jax_compilation_cache_dir == str(path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
        assert jax.config.jax_persistent_cache_min_entry_size_bytes == -1
    finally:  # no compile happened in between: restoring leaves the cache unopened
        for n, v in before.items():
            jax.config.update(n, v)
