"""Benchmark: recovering a spot node's SP group, warm (on-node state + cached executable) vs cold.

    python -m spotlight_jax.bench.reconfig [--configs tiny,small,large] [--repeats 5]
        [--cold_repeats 1] [--steps 2] [--batch 1] [--stand_in 2e6,50e6]

One spot node of 4 emulated CPU devices (devices 4-7 of 8; an on-demand node holds 0-3) runs the
real MMDiT rollout of each config through :class:`spotlight_jax.elastic.node.SpotNode`. Two events:

* **shrink**: the node's first device dies (its buffers are deleted for real); the group is
  re-formed on the 3 survivors (ring attention when the heads do not divide 3);
* **grow**: the device comes back (empty); the group is re-formed on all 4.

Time from the event to "weights on the new group's mesh and an executable for it in hand"
(medians over the repeats):

* **(a) warm**: ``SpotNode.on_change``: regroup + state move (shrink: re-wrap the survivors'
  buffers, zero copy; grow: one device-to-device copy from a live replica on the node) + lookup of
  the executable precompiled ahead of time. XLA compiles during it are counted (must be 0);
* **(b) cold**: Orbax restore of the weights from disk (``checkpoints.load_params``, replicated onto
  the new mesh) + trace, lower and compile the rollout program for the new mesh;
* **(c) restart**: a fresh Python process that imports, restores, compiles and runs the rollout
  once (``--steps`` denoising steps) on the 3 survivors; wall time until its result is printed.

The checkpoint is written just before it is read, so the restore reads from the page cache: that
flatters (b) and (c), as does the absence of any network storage. Warm, cold and restart outputs
on the 3 survivors are compared bitwise (same program, same devices, same weights).

Configs: ``tiny`` and ``small`` are ``configs/tiny.py`` and ``configs/small.py``; ``large`` is
``small`` at width 768, depth 12, 12 heads, 32x32 images and a scan over blocks (~260M parameters).
Weights are random (drawn on the host; no training needed to time a recovery). The last line
extrapolates to the 20B ``configs/qwen_image.py`` from bytes and assumed bandwidths.

``--stand_in`` times the same recovery without a model, for large parameter trees: a replicated
stand-in tree of each size on one node of 8 devices loses devices 2 and 5 (re-formed on 6,
ring attention: 8 heads do not divide 6), then gets them back. Warm = ``move_tree`` (re-wrap, or
a device-to-device copy from a live replica) + ``ExecutableCache.get``; cold compile = the same
move + ``jit(...).lower(...).compile()``; cold reload = the tree put again from host memory (it
leaves out the disk read, so it flatters the cold path) + compile. The step (per-token MLP
layers over a sequence-sharded activation) compiles faster than a real DiT step, a lower bound.
The cost model's regroup constants (``configs/base.py``, ``cost.regroup_*``) come from it.
"""
from __future__ import annotations

import time

_T0 = time.perf_counter()  # the restarted process (c) reports its import time from here

import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from spotlight_jax import config as conf  # noqa: E402
from spotlight_jax import programs  # noqa: E402
from spotlight_jax.elastic import (  # noqa: E402
    DevicePool,
    ExecutableCache,
    GroupConfig,
    PoolConfig,
    count_backend_compiles,
    form_groups,
    form_node_groups,
    move_tree,
    shard_views,
)
from spotlight_jax.elastic.node import (  # noqa: E402
    SpotNode,
    abstract_rollout_args,
    attention_for,
    input_specs,
    rollout_fn,
)
from spotlight_jax.io import checkpoints  # noqa: E402
from spotlight_jax.models.factory import abstract_model  # noqa: E402

_T_IMPORTED = time.perf_counter()

FLAGS = flags.FLAGS
REPO = programs.REPO
LAYOUT = PoolConfig(nodes=(("od0", "on_demand", 4), ("spot0", "spot", 4)))
NODE, LOST = "spot0", 4
CONFIGS = {
    "tiny": ("tiny.py", {}),
    "small": ("small.py", {}),
    "large": ("small.py", dict(width=768, depth=12, num_heads=12, image_size=32,
                               scan_blocks=True)),
}


# ---- model, weights and inputs -----------------------------------------------------------------
def load_config(name: str):
    if name not in CONFIGS:
        raise SystemExit(f"unknown config {name!r}; choose from {sorted(CONFIGS)}")
    path, overrides = CONFIGS[name]
    config = conf.load_config(REPO / "configs" / path)
    return dataclasses.replace(conf.model_config(config), **overrides).validate(), config


def sampler_for(config, steps: int):
    return dataclasses.replace(conf.sampler_config(config), num_steps=steps,
                               sde_window=None).validate()


def host_weights(abstract, seed: int = 0) -> dict:
    """Random weights on the host (kernels ~ N(0, 1/fan_in), norm scales ~ 1, biases ~ 0)."""
    rng = np.random.default_rng(seed)

    def draw(path, a):
        dtype = np.dtype(a.dtype)
        if len(a.shape) >= 2:
            fan_in = a.shape[-2]
            return (rng.standard_normal(a.shape, np.float32) / np.sqrt(fan_in)).astype(dtype)
        base = 1.0 if "scale" in jax.tree_util.keystr(path) else 0.0
        return (base + 0.02 * rng.standard_normal(a.shape, np.float32)).astype(dtype)

    return jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(abstract))


def as_state(abstract, pure):
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, pure)
    return state


def prompt_batch(mcfg, batch: int):
    rng = np.random.default_rng(1)
    t, m, _ = input_specs(mcfg, batch)
    tshape, tdtype, mshape = t.shape, t.dtype, m.shape
    if np.issubdtype(np.dtype(tdtype), np.integer):
        tokens = rng.integers(0, mcfg.vocab_size, tshape).astype(tdtype)
    else:
        tokens = rng.standard_normal(tshape).astype(tdtype)
    return tokens, np.ones(mshape, bool), np.arange(batch, dtype=np.uint32) + 7


def nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def compile_cold(graphdef, mcfg, scfg, abstract_pure, mesh, batch: int):
    """Trace, lower and compile a fresh rollout program for ``mesh`` (what a cold path pays)."""
    image_shape = mcfg.latent_shape
    fn = rollout_fn(graphdef, image_shape, scfg, attention_for(mesh, mcfg.num_heads))
    args = abstract_rollout_args(abstract_pure, mcfg, mesh, batch)
    return jax.jit(fn, in_shardings=jax.tree.map(lambda a: a.sharding, args)).lower(*args).compile()


def restore(ckpt: str, abstract, mesh):
    shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), nnx.to_pure_dict(abstract))
    state = checkpoints.load_params(ckpt, abstract, shardings)
    pure = nnx.to_pure_dict(state)
    jax.block_until_ready(pure)
    return pure


def run(exe, params, mesh, inputs):
    rep = NamedSharding(mesh, P())
    out = exe(params, *[jax.device_put(x, rep) for x in inputs])
    return np.asarray(out["images"]), np.asarray(out["log_probs"])


# ---- (c): a fresh process ----------------------------------------------------------------------
def child(spec: dict) -> None:
    """Runs in the restarted process: restore, compile and run one rollout on the survivors."""
    mcfg, config = load_config(spec["config"])
    scfg = sampler_for(config, spec["steps"])
    graphdef, abstract = abstract_model(mcfg)
    devices = [d for d in jax.devices() if d.id in spec["devices"]]
    (group,) = form_node_groups(NODE, devices, GroupConfig(heads=mcfg.num_heads), log=False)
    t0 = time.perf_counter()
    params = restore(spec["ckpt"], abstract, group.mesh)
    t1 = time.perf_counter()
    exe = compile_cold(graphdef, mcfg, scfg, nnx.to_pure_dict(abstract), group.mesh,
                       spec["batch"])
    t2 = time.perf_counter()
    images, logps = run(exe, params, group.mesh, prompt_batch(mcfg, spec["batch"]))
    t3 = time.perf_counter()
    print("RESULT " + json.dumps(dict(import_s=_T_IMPORTED - _T0, restore_s=t1 - t0,
                                      compile_s=t2 - t1, run_s=t3 - t2,
                                      digest=_digest(images, logps))), flush=True)


def _digest(*arrays) -> str:
    import hashlib

    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def restart(spec: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "spotlight_jax.bench.reconfig", "--child", json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(REPO), env=env)
        result = None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                wall = time.perf_counter() - t0
                result = json.loads(line[len("RESULT "):])
                result["wall_s"] = wall
                break
        proc.stdout.close()
        proc.wait()
        if result is None:
            err.seek(0)
            raise RuntimeError(f"restart child failed (exit {proc.returncode}):\n"
                               f"{err.read()[-3000:]}")
    return result


# ---- one config --------------------------------------------------------------------------------
def run_config(name: str, args, workdir: Path) -> dict:
    mcfg, config = load_config(name)
    scfg = sampler_for(config, args.steps)
    graphdef, abstract = abstract_model(mcfg)
    pure = host_weights(abstract)
    size = nbytes(pure)
    nparams = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(pure))
    ckpt = str(workdir / name)
    checkpoints.save_params(ckpt, as_state(abstract, pure), {"config": name})
    inputs = prompt_batch(mcfg, args.batch)
    abstract_pure = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                 nnx.to_pure_dict(abstract))

    pool = DevicePool(LAYOUT)
    node = SpotNode(NODE, pool, graphdef, pure, mcfg, scfg, batch_sizes=(args.batch,),
                    precompile=False)
    del pure
    (g4,) = node.groups
    survivors = [d for d in g4.devices if d.id != LOST]
    (g3,) = form_node_groups(NODE, survivors, node.group_config, log=False)
    precompile_s = node.precompile([g4, g3])

    warm = {"shrink": [], "grow": []}
    parts = {"shrink": [], "grow": []}
    compiles = 0
    warm_out = None
    for r in range(args.repeats):
        pool.mark_lost([LOST])
        for buf in node.device_buffers([LOST]):  # the loss, for real
            buf.delete()
        rep = node.on_change(pool)
        assert rep.kind == "shrink" and rep.groups_after == (g3.device_ids,), rep.summary()
        warm["shrink"].append(rep.total_s)
        parts["shrink"].append(rep)
        compiles += rep.compiles
        if r == 0:
            o = node.rollout(*inputs)
            warm_out = (np.asarray(o["images"]), np.asarray(o["log_probs"]))
        pool.mark_joined([LOST])
        rep = node.on_change(pool)
        assert rep.kind == "grow" and rep.groups_after == (g4.device_ids,), rep.summary()
        warm["grow"].append(rep.total_s)
        parts["grow"].append(rep)
        compiles += rep.compiles
    warm_digest = _digest(*warm_out)
    del node

    cold = {"shrink": [], "grow": []}
    cold_parts = {"shrink": [], "grow": []}
    cold_out = None
    for r in range(args.cold_repeats):
        for event, group in (("shrink", g3), ("grow", g4)):
            with count_backend_compiles() as c:
                t0 = time.perf_counter()
                (group,) = form_node_groups(NODE, group.devices, GroupConfig(
                    heads=mcfg.num_heads), log=False)
                params = restore(ckpt, abstract, group.mesh)
                t1 = time.perf_counter()
                exe = compile_cold(graphdef, mcfg, scfg, abstract_pure, group.mesh, args.batch)
                t2 = time.perf_counter()
            assert c["n"] >= 1, "the cold path did not compile: an in-memory cache served it"
            cold[event].append(t2 - t0)
            cold_parts[event].append((t1 - t0, t2 - t1))
            if r == 0 and event == "shrink":
                cold_out = run(exe, params, group.mesh, inputs)
            del params, exe

    restarts = [restart(dict(config=name, ckpt=ckpt, devices=list(g3.device_ids),
                             steps=args.steps, batch=args.batch))
                for _ in range(args.cold_repeats)]
    shutil.rmtree(ckpt, ignore_errors=True)
    med = statistics.median
    return dict(
        name=name, params=nparams, nbytes=size, heads=mcfg.num_heads,
        strategy3=g3.strategy, precompile_s=precompile_s, compiles=compiles,
        warm={e: med(v) for e, v in warm.items()},
        warm_parts={e: tuple(med(getattr(p, f) for p in v)
                             for f in ("regroup_s", "move_s", "lookup_s"))
                    for e, v in parts.items()},
        copied={e: v[0].bytes_copied for e, v in parts.items()},
        cold={e: med(v) for e, v in cold.items()},
        cold_parts={e: tuple(med(x[i] for x in v) for i in range(2))
                    for e, v in cold_parts.items()},
        restart=med(x["wall_s"] for x in restarts),
        restart_parts=tuple(med(x[k] for x in restarts)
                            for k in ("import_s", "restore_s", "compile_s", "run_s")),
        same_warm_cold=warm_digest == _digest(*cold_out),
        same_warm_restart=all(x["digest"] == warm_digest for x in restarts),
    )


# ---- report ------------------------------------------------------------------------------------
def print_table(rows, args) -> None:
    print(f"\nSP-group recovery on one spot node of 4 emulated CPU devices, real MMDiT rollout "
          f"(batch {args.batch}, {args.steps} steps); warm: median of {args.repeats}, cold and "
          f"restart: median of {args.cold_repeats}")
    hdr = (f"{'config':<6} {'params':>7} {'MiB':>6} {'event':<6} {'warm ms':>8} "
           f"{'(regroup/move/lookup ms)':>25} {'cold s':>7} {'(restore/compile)':>18} "
           f"{'cold/warm':>10} {'restart s':>10} {'restart/warm':>13}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        for e in ("shrink", "grow"):
            w = r["warm"][e]
            rg, mv, lk = (1e3 * x for x in r["warm_parts"][e])
            rs, cs = r["cold_parts"][e]
            restart = (f"{r['restart']:>10.1f} {r['restart'] / w:>12.0f}x" if e == "shrink"
                       else f"{'':>10} {'':>13}")
            print(f"{r['name']:<6} {r['params'] / 1e6:>6.1f}M {r['nbytes'] / 2**20:>6.0f} "
                  f"{e:<6} {1e3 * w:>8.2f} {f'{rg:.2f}/{mv:.2f}/{lk:.2f}':>25} "
                  f"{r['cold'][e]:>7.2f} {f'{rs:.2f}/{cs:.2f}':>18} "
                  f"{r['cold'][e] / w:>9.0f}x {restart}")
    for r in rows:
        imp, rs, cs, run_s = r["restart_parts"]
        print(f"{r['name']}: precompile {r['precompile_s']:.1f}s for 2 groups off the critical "
              f"path; warm compiles {r['compiles']}; 3-device group runs {r['strategy3']} "
              f"({r['heads']} heads); grow copied {r['copied']['grow'] / 2**20:.1f} MiB; restart "
              f"= import {imp:.1f} + restore {rs:.1f} + compile {cs:.1f} + run {run_s:.1f} s "
              f"(+ interpreter start); outputs warm == cold: {r['same_warm_cold']}, "
              f"warm == restart: {r['same_warm_restart']} (bitwise)")


def extrapolate(rows, args) -> None:
    """Bytes / bandwidth for the 20B config, with the largest measured compile as a floor."""
    mcfg, _ = load_config_path(REPO / "configs" / "qwen_image.py")
    _, abstract = abstract_model(mcfg)
    size = nbytes(nnx.to_pure_dict(abstract))
    nparams = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.to_pure_dict(abstract)))
    big = max(rows, key=lambda r: r["params"])
    copy_bw = big["copied"]["grow"] / max(big["warm_parts"]["grow"][1], 1e-9)
    restore_bw = big["nbytes"] / max(big["cold_parts"]["grow"][0], 1e-9)
    compile_floor = big["cold_parts"]["shrink"][1]
    warm_grow = size / (args.nvlink_gbps * 1e9)
    cold = size / (args.storage_gbps * 1e9) + compile_floor
    print(f"\nextrapolation, 20B (qwen_image: {nparams / 1e9:.1f}B params, "
          f"{size / 1e9:.1f} GB {mcfg.param_dtype}): warm shrink re-wraps 0 bytes (ms); warm "
          f"rejoin copies one replica, {size / 1e9:.1f} GB / {args.nvlink_gbps:.0f} GB/s "
          f"intra-node = {warm_grow:.2f} s; cold = {size / 1e9:.1f} GB / {args.storage_gbps:g} "
          f"GB/s storage + compile (>= {compile_floor:.0f} s, the {big['name']} rollout here) "
          f">= {cold:.0f} s, >= {cold / warm_grow:.0f}x the warm rejoin. Measured on this host "
          f"({big['name']}): device-to-device copy {copy_bw / 1e9:.2f} GB/s, Orbax restore "
          f"(page-cached) {restore_bw / 1e9:.2f} GB/s.")


def load_config_path(path: Path):
    config = conf.load_config(path)
    return conf.model_config(config), config


# ---- stand-in parameter trees (no model): the state move at any size -------------------------
STAND_IN_LAYERS, STAND_IN_SEQ, STAND_IN_BATCH, STAND_IN_HEADS = 4, 24, 1, 8
STAND_IN_LOST = (2, 5)


def stand_in_params(num_params: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``STAND_IN_LAYERS`` square float32 matrices, about ``num_params`` parameters (host)."""
    d = max(8, int(math.sqrt(num_params / STAND_IN_LAYERS)))
    rng = np.random.default_rng(seed)
    return {f"w{i}": (rng.standard_normal((d, d), dtype=np.float32) / math.sqrt(d))
            for i in range(STAND_IN_LAYERS)}


def stand_in_step():
    """A fresh function object each call, so JAX's in-memory caches cannot serve a cold compile."""
    def step(params, x):
        h = x
        for i in range(STAND_IN_LAYERS):
            h = jnp.tanh(h @ params[f"w{i}"])
            h = h - jnp.mean(h, axis=1, keepdims=True)  # mixes over the (sharded) sequence
        return jnp.sum(h, axis=1)
    return step


def stand_in_args(host_params):
    def fn(mesh):
        rep = NamedSharding(mesh, P())
        params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=rep)
                  for k, v in host_params.items()}
        d = next(iter(host_params.values())).shape[0]
        x = jax.ShapeDtypeStruct((STAND_IN_BATCH, STAND_IN_SEQ, d), jnp.float32,
                                 sharding=NamedSharding(mesh, P(None, "sp", None)))
        return params, x
    return fn


def stand_in_cold_compile(host_params, mesh):
    args = stand_in_args(host_params)(mesh)
    shardings = jax.tree.map(lambda a: a.sharding, args)
    return jax.jit(stand_in_step(), in_shardings=shardings).lower(*args).compile()


def _ready(tree):
    for leaf in jax.tree.leaves(tree):
        leaf.block_until_ready()
    return tree


def run_stand_in(num_params: int, repeats: int) -> list[dict]:
    host = stand_in_params(num_params)
    nbytes = sum(v.nbytes for v in host.values())
    cfg = GroupConfig(heads=STAND_IN_HEADS, sp_degree=8)
    pool = DevicePool(PoolConfig(nodes=(("spot0", "spot", 8),)))
    (g8,) = form_groups(pool, cfg)
    pool.mark_lost(STAND_IN_LOST)
    (g6,) = form_groups(pool, cfg, log=False)
    pool.mark_joined(STAND_IN_LOST)
    cache = ExecutableCache()
    pre_s = cache.precompile("step", stand_in_step(), stand_in_args(host), [g8, g6])
    d = next(iter(host.values())).shape[0]
    x_host = np.random.default_rng(1).standard_normal((STAND_IN_BATCH, STAND_IN_SEQ, d),
                                                      dtype=np.float32)
    times: dict[tuple[str, str], list[float]] = {}
    compiles: dict[tuple[str, str], list[int]] = {}

    moves: dict[tuple[str, str], list[float]] = {}

    def record(event, path, seconds, n_compiles, move_s):
        times.setdefault((event, path), []).append(seconds)
        compiles.setdefault((event, path), []).append(n_compiles)
        moves.setdefault((event, path), []).append(move_s)

    def regroup(event, path, mark, source):
        """One timed event: the pool change, the state move (or a reload), the executable;
        then the step on the new group. Returns (params, output)."""
        with count_backend_compiles() as c:
            t0 = time.perf_counter()
            mark(STAND_IN_LOST)
            (group,) = form_groups(pool, cfg, log=False)
            if path == "cold reload":
                params = _ready(jax.device_put(host, NamedSharding(group.mesh, P())))
            else:
                params, _ = move_tree(source, group.mesh, pool, log=False)
            t_move = time.perf_counter() - t0
            exe = (cache.get("step", group) if path == "warm"
                   else stand_in_cold_compile(host, group.mesh))
            record(event, path, time.perf_counter() - t0, c["n"], t_move)
        x = jax.device_put(x_host, NamedSharding(group.mesh, P(None, "sp", None)))
        return params, exe(params, x).block_until_ready()

    for _ in range(repeats):
        for path in ("warm", "cold compile", "cold reload"):
            # --- lose 2 devices of the 8-device group
            params8 = _ready(jax.device_put(host, NamedSharding(g8.mesh, P())))
            views = shard_views(params8)
            for leaf in jax.tree.leaves(params8):  # the loss, for real (before the clock)
                for s in leaf.addressable_shards:
                    if s.device.id in STAND_IN_LOST:
                        s.data.delete()
            params6, out6 = regroup("lose 2", path, pool.mark_lost, views)
            # --- the 2 devices rejoin
            params8b, out8 = regroup("rejoin", path, pool.mark_joined, params6)
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


def print_stand_in(rows, repeats: int) -> None:
    """The stand-in trees' table."""
    print(f"SP-group regroup latency, 8 emulated CPU devices, median of {repeats} runs "
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



def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This benchmark's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("configs", "tiny,small,large",
                        f"Comma separated, from {sorted(CONFIGS)}; empty: none.", **fv)
    flags.DEFINE_string("stand_in", "", "Parameter counts of stand-in trees to time the state "
                        "move with, comma separated (e.g. 2e6,50e6); empty: none.", **fv)
    flags.DEFINE_integer("repeats", 5, "Warm runs per event (median).", **fv)
    flags.DEFINE_integer("cold_repeats", 1, "Cold runs per event and process restarts (median); "
                         "each compiles.", **fv)
    flags.DEFINE_integer("steps", 2, "Denoising steps of the rollout.", **fv)
    flags.DEFINE_integer("batch", 1, "Rollout batch size.", **fv)
    flags.DEFINE_string("workdir", None, "Checkpoint directory (default: a temp dir).", **fv)
    flags.DEFINE_float("nvlink_gbps", 300.0, "Intra-node GPU-to-GPU bandwidth assumed for the "
                       "20B extrapolation.", **fv)
    flags.DEFINE_float("storage_gbps", 2.0, "Storage read bandwidth assumed for the 20B "
                       "extrapolation.", **fv)
    flags.DEFINE_string("child", None, "Internal: the spec of a restarted process (c), as JSON.",
                        **fv)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    programs.emulate_devices(8)
    if FLAGS.child:
        child(json.loads(FLAGS.child))
        return
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("absl").setLevel(logging.ERROR)
    assert len(jax.devices()) >= 8, jax.devices()
    workdir = Path(FLAGS.workdir or tempfile.mkdtemp(prefix="reconfig_"))
    rows = []
    for name in filter(None, FLAGS.configs.split(",")):
        t0 = time.perf_counter()
        rows.append(run_config(name.strip(), FLAGS, workdir))
        print(f"[{name}: {time.perf_counter() - t0:.0f}s]", file=sys.stderr, flush=True)
    if rows:
        print_table(rows, FLAGS)
        extrapolate(rows, FLAGS)
    sizes = [int(float(s)) for s in filter(None, FLAGS.stand_in.split(","))]
    if sizes:
        print_stand_in([r for s in sizes for r in run_stand_in(s, FLAGS.repeats)], FLAGS.repeats)
    if FLAGS.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
