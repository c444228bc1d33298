"""Benchmark: SP-group recovery with on-node state and cached executables vs cold paths.

    python -m spotlight_jax.bench.regroup [--sizes 2e6,50e6] [--repeats 5]

For a replicated params pytree of each size on one emulated node of 8 CPU devices, two events:

* **lose 2**: devices 2 and 5 of the 8-device group die (their buffers are deleted); the group is
  re-formed on the 6 survivors (ring attention: 8 heads do not divide 6);
* **rejoin**: the 2 devices come back; the group is re-formed on 8.

Three ways to get the new group ready to run its rollout step, each timed from the event to
"params on the new mesh and an executable for it in hand" (median of ``--repeats`` runs):

* **warm**: ``move_tree`` (re-wrap survivors' buffers, or device-to-device copy from a live
  replica on the node) + ``ExecutableCache.get`` (precompiled: a dict lookup);
* **cold compile**: the same state move, then ``jit(...).lower(...).compile()`` on the critical path
  (what happens without the executable cache);
* **cold reload**: params reloaded from host memory (a stand-in for storage that leaves out the disk
  read, so it flatters the cold path) + compile.

The step is a small stand-in (per-token MLP layers over a sequence-sharded activation): its compile
time is a lower bound on a real DiT step's (3-4 s on CPU for a 4-layer d=256 model, measured).
Emulated devices share the host's cores and memory, so copies are memcpy-speed.
"""
from __future__ import annotations

import logging
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spotlight_jax.bench import _setup
from spotlight_jax.elastic import (
    DevicePool,
    ExecutableCache,
    GroupConfig,
    PoolConfig,
    count_backend_compiles,
    form_groups,
    move_tree,
    shard_views,
)

FLAGS = flags.FLAGS
LAYERS, SEQ, BATCH, HEADS = 4, 24, 1, 8
LOST = (2, 5)


def make_params(num_params: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``LAYERS`` square float32 matrices with about ``num_params`` parameters in all (host)."""
    d = max(8, int(math.sqrt(num_params / LAYERS)))
    rng = np.random.default_rng(seed)
    return {f"w{i}": (rng.standard_normal((d, d), dtype=np.float32) / math.sqrt(d))
            for i in range(LAYERS)}


def make_step():
    """A fresh function object each call, so JAX's in-memory caches cannot serve a cold compile."""
    def step(params, x):
        h = x
        for i in range(LAYERS):
            h = jnp.tanh(h @ params[f"w{i}"])
            h = h - jnp.mean(h, axis=1, keepdims=True)  # mixes over the (sharded) sequence
        return jnp.sum(h, axis=1)
    return step


def abstract_args(host_params):
    def fn(mesh):
        rep = NamedSharding(mesh, P())
        params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rep)
                  for k, v in host_params.items()}
        d = next(iter(host_params.values())).shape[0]
        x = jax.ShapeDtypeStruct((BATCH, SEQ, d), jnp.float32,
                                 sharding=NamedSharding(mesh, P(None, "sp", None)))
        return params, x
    return fn


def cold_compile(host_params, mesh):
    args = abstract_args(host_params)(mesh)
    shardings = jax.tree.map(lambda a: a.sharding, args)
    return jax.jit(make_step(), in_shardings=shardings).lower(*args).compile()


def _ready(tree):
    for leaf in jax.tree.leaves(tree):
        leaf.block_until_ready()
    return tree


def run_size(num_params: int, repeats: int) -> list[dict]:
    host = make_params(num_params)
    nbytes = sum(v.nbytes for v in host.values())
    cfg = GroupConfig(heads=HEADS, sp_degree=8)
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 8),)))
    (g8,) = form_groups(pool, cfg)
    pool.mark_lost(LOST)
    (g6,) = form_groups(pool, cfg, log=False)
    pool.mark_joined(LOST)
    cache = ExecutableCache()
    pre_s = cache.precompile("step", make_step(), abstract_args(host), [g8, g6])
    d = next(iter(host.values())).shape[0]
    x_host = np.random.default_rng(1).standard_normal((BATCH, SEQ, d), dtype=np.float32)
    times: dict[tuple[str, str], list[float]] = {}
    compiles: dict[tuple[str, str], list[int]] = {}

    moves: dict[tuple[str, str], list[float]] = {}

    def record(event, path, seconds, n_compiles, move_s):
        times.setdefault((event, path), []).append(seconds)
        compiles.setdefault((event, path), []).append(n_compiles)
        moves.setdefault((event, path), []).append(move_s)

    for _ in range(repeats):
        for path in ("warm", "cold compile", "cold reload"):
            # --- lose 2 devices of the 8-device group
            params8 = _ready(jax.device_put(host, NamedSharding(g8.mesh, P())))
            views = shard_views(params8)
            for leaf in jax.tree.leaves(params8):  # the loss, for real (before the clock)
                for s in leaf.addressable_shards:
                    if s.device.id in LOST:
                        s.data.delete()
            with count_backend_compiles() as c:
                t0 = time.perf_counter()
                pool.mark_lost(LOST)
                (group,) = form_groups(pool, cfg, log=False)
                if path == "cold reload":
                    params6 = _ready(jax.device_put(host, NamedSharding(group.mesh, P())))
                else:
                    params6, _ = move_tree(views, group.mesh, pool, log=False)
                t_move = time.perf_counter() - t0
                exe = (cache.get("step", group) if path == "warm"
                       else cold_compile(host, group.mesh))
                record("lose 2", path, time.perf_counter() - t0, c["n"], t_move)
            out6 = exe(params6, jax.device_put(x_host, NamedSharding(group.mesh,
                                                                     P(None, "sp", None))))
            out6.block_until_ready()
            # --- the 2 devices rejoin
            with count_backend_compiles() as c:
                t0 = time.perf_counter()
                pool.mark_joined(LOST)
                (group,) = form_groups(pool, cfg, log=False)
                if path == "cold reload":
                    params8b = _ready(jax.device_put(host, NamedSharding(group.mesh, P())))
                else:
                    params8b, _ = move_tree(params6, group.mesh, pool, log=False)
                t_move = time.perf_counter() - t0
                exe = (cache.get("step", group) if path == "warm"
                       else cold_compile(host, group.mesh))
                record("rejoin", path, time.perf_counter() - t0, c["n"], t_move)
            out8 = exe(params8b, jax.device_put(x_host, NamedSharding(group.mesh,
                                                                      P(None, "sp", None))))
            np.testing.assert_allclose(np.asarray(out8), np.asarray(out6), rtol=1e-4, atol=1e-4)
            del params8, views, params6, params8b
    assert cache.num_misses == 0
    rows = []
    for event in ("lose 2", "rejoin"):
        med = {p: statistics.median(times[(event, p)]) for p in
               ("warm", "cold compile", "cold reload")}
        rows.append(dict(params=num_params, nbytes=nbytes, event=event, precompile_s=pre_s,
                         warm_move=statistics.median(moves[(event, "warm")]),
                         compiles={p: max(compiles[(event, p)]) for p in med}, **med))
    return rows


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This benchmark's flags (defined only when it runs as the program; see ``_setup``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("sizes", "2e6,50e6", "Parameter counts, comma separated.", **fv)
    flags.DEFINE_integer("repeats", 5, "Runs per path (median reported).", **fv)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    _setup.emulate_devices(8)
    logging.basicConfig(level=logging.WARNING)
    assert len(jax.devices()) >= 8, jax.devices()
    rows = []
    for s in FLAGS.sizes.split(","):
        rows.extend(run_size(int(float(s)), FLAGS.repeats))
    print(f"SP-group regroup latency, 8 emulated CPU devices, median of {FLAGS.repeats} runs "
          f"(ms; ratios = cold / warm; compiles = XLA compiles on the critical path)")
    hdr = (f"{'params':>8} {'MiB':>6} {'event':<7} {'warm':>8} {'(move)':>8} {'cold compile':>13} "
           f"{'cold reload':>12} {'compile/warm':>13} {'reload/warm':>12} {'compiles w/c/r':>15}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        c = r["compiles"]
        print(f"{r['params'] / 1e6:>7.1f}M {r['nbytes'] / 2**20:>6.0f} {r['event']:<7} "
              f"{1e3 * r['warm']:>8.2f} {1e3 * r['warm_move']:>8.2f} "
              f"{1e3 * r['cold compile']:>13.1f} {1e3 * r['cold reload']:>12.1f} "
              f"{r['cold compile'] / r['warm']:>12.0f}x "
              f"{r['cold reload'] / r['warm']:>11.0f}x "
              f"{c['warm']:>7}/{c['cold compile']}/{c['cold reload']}")
    pre = ", ".join(f"{r['precompile_s']:.2f}s" for r in rows[::2])
    print(f"(precompile ahead of time, off the critical path, 2 groups per size: {pre}; "
          "warm (move) = the state move alone: re-wrap on lose 2, device-to-device copy on rejoin)")


if __name__ == "__main__":
    define_flags()
    app.run(main)
