"""SpotNode / SpotFleet with the real (micro) MMDiT rollout on 8 emulated devices.

Layout: on-demand node od0 (devices 0-3, the trainer's) + spot nodes spot0 (4, 5) and spot1 (6, 7).
The micro model has 4 heads, so a group of 2 runs Ulysses and a group of 1 runs dense attention.
Every reachable group's rollout is compiled once (module fixture); after that no device loss or join
may compile anything.

Equality contract, checked against a single-device ``Sampler.rollout`` on the trainer's device:
a dense group of 1 is bitwise equal to it; a Ulysses group of 2 is within rtol 1e-4 / atol 1e-5
(measured: ~4e-7 absolute) and bitwise equal to every other degree-2 Ulysses result, whichever
devices ran it and however its weights got there (re-wrap, intra-node copy, peer pull).
"""
import dataclasses
import logging
import random

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import MICRO

from spotlight_jax.diffusion import Sampler, SamplerConfig
from spotlight_jax.elastic import DevicePool, PoolConfig, StateLostError, count_backend_compiles
from spotlight_jax.elastic.node import SpotFleet, SpotNode, StaleGroupsError
from spotlight_jax.models.factory import abstract_model

LAYOUT = PoolConfig(nodes=(("od0", "on_demand", 4), ("spot0", "spot", 2), ("spot1", "spot", 2)))
SPOT = (4, 5, 6, 7)
B = 2
RTOL, ATOL = 1e-4, 1e-5
SAMPLER = SamplerConfig(num_steps=2, shift=3.0, noise_level=0.7)


def prompts():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (B, 12)).astype(np.int32)
    mask = np.ones((B, 12), bool)
    mask[1, 7:] = False
    return tokens, mask, np.array([3, 11], np.uint32)


def small_micro_model(seed=0):
    """helpers.MICRO cut to one block, no conv and no prompt-encoder layers, with random weights
    drawn on the host (no XLA compile: jitted init would cost seconds of compile per test run).
    Kernels ~ N(0, 1/fan_in), biases ~ N(0, 0.05^2), norm scales ~ 1 + N(0, 0.05^2): adaLN-Zero's
    zero init would make the model output exactly 0, as ``helpers.micro_model`` notes."""
    cfg = dataclasses.replace(MICRO, depth=1, conv_stem=0, conv_head=False, text_layers=0)
    graphdef, abstract = abstract_model(cfg, seed)
    rng = np.random.default_rng(seed)

    def draw(path, a):
        name = jax.tree_util.keystr(path)
        x = rng.standard_normal(a.shape).astype(a.dtype)
        if len(a.shape) >= 2:
            return x / np.sqrt(a.shape[0]).astype(a.dtype)
        return (1.0 if "scale" in name else 0.0) + np.float32(0.05) * x

    pure = jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(abstract))
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, pure)
    return cfg, graphdef, state


@pytest.fixture(scope="module")
def world():
    cfg, graphdef, state = small_micro_model()
    pool = DevicePool(LAYOUT)
    fleet = SpotFleet(pool, graphdef, state, cfg, SAMPLER, batch_sizes=(B,))
    trainer_dev = pool.devices(node="od0")[0]
    trainer = jax.device_put(nnx.to_pure_dict(state), trainer_dev)  # the trainer's copy
    ref = Sampler(graphdef, (cfg.image_size, cfg.image_size, cfg.channels), SAMPLER).rollout(
        jax.device_put(state, trainer_dev), *prompts())
    ref = jax.tree.map(np.asarray, ref)
    return dict(pool=pool, fleet=fleet, trainer=trainer, ref=ref, cfg=cfg)


def heal(w):
    """Every spot device alive again (the memory of those that were lost is gone), groups
    rebuilt."""
    pool, fleet = w["pool"], w["fleet"]
    pool.mark_joined(SPOT)
    fleet.on_change(pool, trainer=w["trainer"])


def lose(w, devices):
    """A loss for real: the pool marks the devices dead and their buffers are deleted."""
    pool, fleet = w["pool"], w["fleet"]
    pool.mark_lost(devices)
    bufs = [b for n in fleet.nodes.values() for b in n.device_buffers(devices)]
    for b in bufs:
        b.delete()
    return bufs


def check_groups(pool, fleet):
    groups = [g for _, _, g in fleet.groups]
    covered = sorted(i for g in groups for i in g.device_ids)
    assert covered == sorted(d.id for d in pool.devices(role="spot")), (covered, pool)
    for g in groups:
        assert {pool.node_of(d) for d in g.devices} == {g.node}, g  # never spans nodes
        assert pool.role(g.node) == "spot"
        assert g.strategy == {1: "dense", 2: "ulysses"}[g.degree]


def run_all(fleet, ref, by_config):
    """Runs every group's rollout and checks it against the single-device reference."""
    for node, i, g in fleet.groups:
        out = jax.tree.map(np.asarray, node.rollout(*prompts(), group=i))
        assert out["latents"].shape == ref["latents"].shape
        for k in ref:
            if g.degree == 1:
                np.testing.assert_array_equal(out[k], ref[k], err_msg=f"{k} on {g.device_ids}")
            else:
                np.testing.assert_allclose(out[k], ref[k], rtol=RTOL, atol=ATOL,
                                           err_msg=f"{k} on {g.device_ids}")
        first = by_config.setdefault((g.degree, g.strategy), out)
        for k in ref:  # same SP degree and strategy: bitwise, on any devices
            np.testing.assert_array_equal(out[k], first[k], err_msg=f"{k} on {g.device_ids}")


def test_precompiled_every_reachable_group(world):
    fleet = world["fleet"]
    # spot0 and spot1 each reach {a, b}, {a}, {b}: 6 programs, one batch size
    assert len(fleet.cache) == 6 and fleet.cache.num_misses == 0
    assert {n: [g.device_ids for g in node.reachable_groups()] for n, node in
            fleet.nodes.items()} == {"spot0": [(4, 5), (4,), (5,)],
                                     "spot1": [(6, 7), (6,), (7,)]}


def test_random_losses_and_joins_keep_groups_and_rollouts(world):
    """A seeded sequence of device/node losses and joins (losses delete the buffers for real):
    groups always cover exactly the live spot devices inside nodes, state only comes from live
    devices, every group's rollout matches the single-device one, and nothing compiles."""
    pool, fleet, ref = world["pool"], world["fleet"], world["ref"]
    heal(world)
    rng = random.Random(5)
    by_config: dict = {}
    kinds: set = set()
    with count_backend_compiles() as compiles:
        run_all(fleet, ref, by_config)
        for step in range(16):
            unsafe = set()  # devices whose memory is gone since the last on_change
            for _ in range(2 if rng.random() < 0.25 else 1):  # sometimes two events at once
                alive = [d for d in SPOT if pool.is_alive(d)]
                dead = [d for d in SPOT if not pool.is_alive(d)]
                r = rng.random()
                if alive and (r < 0.45 or not dead):
                    node = pool.node_of(rng.choice(alive))
                    victims = (pool.alive_devices(node) if rng.random() < 0.3
                               else [rng.choice(alive)])
                    ids = [d if isinstance(d, int) else d.id for d in victims]
                    unsafe.update(ids)
                    lose(world, ids)
                else:
                    node = pool.node_of(rng.choice(dead))
                    joiners = ([d.id for d in pool.devices(node=node, alive=False)]
                               if rng.random() < 0.5 else [rng.choice(dead)])
                    pool.mark_joined(joiners)
            for rep in fleet.on_change(pool, trainer=world["trainer"]):
                kinds.add(rep.kind)
                assert rep.compiles == 0 and not rep.misses, rep.summary()
                assert not rep.source_devices & unsafe, (step, rep.summary())
                assert all(pool.is_alive(d) or pool.role(pool.node_of(d)) == "on_demand"
                           for d in rep.source_devices), rep.summary()
                if rep.kind == "shrink":
                    assert rep.bytes_copied == 0  # re-wrapped, zero copy
            check_groups(pool, fleet)
            run_all(fleet, ref, by_config)
    assert compiles["n"] == 0, compiles
    assert fleet.cache.num_misses == 0
    assert {"shrink", "grow", "lost", "peer_pull"} <= kinds, kinds
    assert set(by_config) == {(1, "dense"), (2, "ulysses")}


def test_lost_first_device_is_deleted_and_next_rollout_succeeds(world):
    """Device 4 (the first of spot0's group, whose loss hides the other shards from JAX's array
    wrapper) dies with its buffers deleted; the survivor's buffers are re-wrapped (same pointers)
    and the rollout runs; then it rejoins (intra-node copy) and runs again."""
    pool, fleet, ref = world["pool"], world["fleet"], world["ref"]
    heal(world)
    node = fleet.nodes["spot0"]
    old_ptrs = [{s.device.id: s.data.unsafe_buffer_pointer() for s in leaf.addressable_shards}
                for leaf in jax.tree.leaves(node.group_params())]
    with count_backend_compiles() as compiles:
        deleted = lose(world, [4])
        assert deleted and all(b.is_deleted() for b in deleted)
        with pytest.raises(StaleGroupsError, match="call it before running"):
            node.rollout(*prompts())  # refuses instead of dispatching on a deleted buffer
        rep = node.on_change(pool)
        assert rep.kind == "shrink" and rep.groups_after == ((5,),) and rep.bytes_copied == 0
        assert rep.source_devices == {5} and rep.compiles == 0
        assert rep.regroup_s + rep.move_s + rep.lookup_s <= rep.total_s
        for leaf, old in zip(jax.tree.leaves(node.group_params()), old_ptrs):
            (shard,) = leaf.addressable_shards  # zero copy: the survivor's own buffer
            assert shard.device.id == 5 and shard.data.unsafe_buffer_pointer() == old[5]
        out = jax.tree.map(np.asarray, node.rollout(*prompts()))
        np.testing.assert_array_equal(out["images"], ref["images"])
        pool.mark_joined([4])
        rep = node.on_change(pool)
        assert rep.kind == "grow" and rep.groups_after == ((4, 5),) and rep.bytes_copied > 0
        assert rep.source_devices == {5}
        out = jax.tree.map(np.asarray, node.rollout(*prompts()))
        np.testing.assert_allclose(out["images"], ref["images"], rtol=RTOL, atol=ATOL)
    assert compiles["n"] == 0


def test_rejoining_node_pulls_from_peer_or_trainer_never_storage(world):
    pool, fleet, ref = world["pool"], world["fleet"], world["ref"]
    heal(world)
    lose(world, [6, 7])
    fleet.on_change(pool)
    pool.mark_node_joined("spot1")
    reps = {r.node: r for r in fleet.on_change(pool)}  # no trainer: spot0 is the peer
    assert reps["spot1"].kind == "peer_pull" and reps["spot1"].source_devices <= {4, 5}
    assert reps["spot0"].kind == "unchanged"
    run_all(fleet, ref, {})
    # every spot device gone: with no trainer copy the state is lost (never read from storage)
    lose(world, list(SPOT))
    fleet.on_change(pool)
    pool.mark_node_joined("spot0")
    with pytest.raises(StateLostError, match="never reloaded from storage"):
        fleet.on_change(pool)
    reps = {r.node: r for r in fleet.on_change(pool, trainer=world["trainer"])}
    assert reps["spot0"].kind == "peer_pull" and reps["spot0"].source_devices == {0}
    run_all(fleet, ref, {})


def test_cache_miss_compiles_and_warns_naming_the_group(world, caplog):
    pool, fleet, ref = world["pool"], world["fleet"], world["ref"]
    heal(world)
    lose(world, [7])
    fleet.on_change(pool)
    node = fleet.nodes["spot1"]
    tokens, mask, seeds = prompts()
    with caplog.at_level(logging.WARNING), count_backend_compiles() as compiles:
        out = node.rollout(tokens[:1], mask[:1], seeds[:1])  # batch 1 was never precompiled
    assert compiles["n"] == 1 and fleet.cache.num_misses == 1
    msgs = [r.getMessage() for r in caplog.records if r.name == "spotlight_jax.elastic.node"]
    assert any("group [6]" in m and "cache miss" in m for m in msgs), msgs
    np.testing.assert_allclose(np.asarray(out["images"]), ref["images"][:1], rtol=RTOL, atol=ATOL)


def test_node_validates_its_inputs(world):
    cfg = world["cfg"]
    with pytest.raises(KeyError, match="unknown node"):
        SpotNode("nope", world["pool"], None, {}, cfg, SAMPLER, precompile=False)
    with pytest.raises(ValueError, match="another DevicePool"):
        world["fleet"].nodes["spot0"].on_change(DevicePool(LAYOUT))
