"""Benchmark: sequence-parallel attention strategies vs dense attention on one device.

    python -m spotlight_jax.bench.attention [--seqs 1024,2048,4096,8192] [--repeats 3]
        [--budget_s 15] [--usp_ulysses 2]

For each sequence length (batch 1, 8 heads, head_dim 64, float32) it jits forward + backward
(``grad`` of ``sum(attention(q, k, v) * cotangent)`` w.r.t. q, k, v) and reports:

* the median wall time of ``--repeats`` runs (after one warm-up), and its ratio to dense attention
  on a single device. A configuration whose runs would exceed ``--budget_s`` is timed once (the
  executable is compiled ahead, so that run has no compile in it). The default run (all four
  lengths) used 2.5 min of CPU and 6 min of wall time on a 2-core machine shared with other jobs;
* per-device peak memory from ``jit(...).lower(...).compile().memory_analysis()``
  (temp + argument + output bytes), and its ratio to dense;
* the largest absolute difference of the strategy's q/k/v gradients from dense attention's.

SP strategies run on an 8-device ``sp`` mesh of emulated CPU devices. With 8 heads, ``usp`` on a
single 8-wide axis would be pure Ulysses, so it runs on the same 8 devices viewed as a
``(ulysses, ring)`` mesh of ``--usp_ulysses`` x ``8 / --usp_ulysses`` (default 2 x 4).

The 8 emulated devices share the host's cores, so times measure the overhead of each strategy
(collectives, extra passes), not a speed-up; per-device memory is the meaningful scaling number.
Dense runs whose compiled footprint would not fit in the host's available memory are reported
as skipped.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spotlight_jax import programs

FLAGS = flags.FLAGS

NUM_DEVICES = 8
HEADS, HEAD_DIM, BATCH = 8, 64, 1


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _footprint(compiled) -> int:
    ma = compiled.memory_analysis()
    return ma.temp_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes


def _time(fn, args, repeats: int, budget_s: float) -> tuple[float, int]:
    """Median of ``repeats`` runs after a warm-up; (seconds, runs).

    The executable is already compiled, so when ``repeats`` runs would exceed ``budget_s`` the
    timed warm-up run is the measurement (keeps the 8192-token dense case to one run).
    """
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    if first * repeats > budget_s:
        return first, 1
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), repeats


def configs(devices, usp_ulysses: int = 2):
    """(label, mesh, strategy, axis, in_spec) for dense (the first device) and each SP strategy
    over ``devices`` (``usp`` views them as a ``(ring, ulysses)`` mesh)."""
    from spotlight_jax.parallel import MeshConfig, make_mesh

    n = len(devices)
    if n < 2 or n % usp_ulysses or HEADS % usp_ulysses or HEADS % n and n % HEADS:
        raise ValueError(f"{n} devices with usp_ulysses={usp_ulysses} and {HEADS} heads: need "
                         f">= 2 devices, usp_ulysses dividing both, and heads and devices "
                         f"dividing one another")
    sp_mesh = make_mesh(devices, MeshConfig(data=1, fsdp=1, sp=n))
    ring = n // usp_ulysses
    usp_mesh = Mesh(np.asarray(devices).reshape(ring, usp_ulysses), ("ring", "uly"),
                    axis_types=(AxisType.Auto,) * 2)
    return [
        ("dense (1 device)", None, "dense", "sp", None),
        (f"ulysses (sp={n})", sp_mesh, "ulysses", "sp", P(None, "sp")),
        (f"ring (sp={n})", sp_mesh, "ring", "sp", P(None, "sp")),
        (f"usp ({usp_ulysses}x{ring})", usp_mesh, "usp", ("uly", "ring"),
         P(None, ("ring", "uly"))),
    ]


def run(seqs, repeats: int, usp_ulysses: int, budget_s: float, devices=None,
        show: bool = True):
    """Times forward + backward of every strategy at each length; returns one dict per
    (length, strategy) with ``seq, strategy, seconds, x_dense, runs, bytes, mem_x_dense,
    max_err`` (largest absolute difference of the q/k/v gradients from dense) and ``note``."""
    from spotlight_jax.parallel import attention

    devices = list(jax.devices()[:NUM_DEVICES] if devices is None else devices)
    rows = []
    for seq in seqs:
        keys = jax.random.split(jax.random.key(seq), 4)
        host = [np.asarray(jax.random.normal(kk, (BATCH, seq, HEADS, HEAD_DIM), jnp.float32))
                for kk in keys]
        base_time = base_mem = reference = None
        for label, mesh, strategy, axis, spec in configs(devices, usp_ulysses):
            def loss(q, k, v, ct, mesh=mesh, strategy=strategy, axis=axis):
                return jnp.sum(attention(q, k, v, mesh=mesh, strategy=strategy, axis=axis) * ct)

            step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
            if mesh is None:
                args = [jax.device_put(x, devices[0]) for x in host]
            else:
                args = [jax.device_put(x, NamedSharding(mesh, spec)) for x in host]
            compiled = step.lower(*args).compile()
            mem = _footprint(compiled)
            avail = _available_bytes() if devices[0].platform == "cpu" else None
            # Dense footprint is per host; SP footprints are per device, all on this host (CPU).
            total = mem * (1 if mesh is None else len(devices))
            row = dict(seq=seq, strategy=label, seconds=None, x_dense=None, runs=0, bytes=mem,
                       mem_x_dense=None, max_err=None, note="")
            if avail is not None and total > 0.8 * avail:
                row["note"] = (f"skipped: needs {total / 2**30:.1f} GiB, "
                               f"{avail / 2**30:.1f} GiB available")
                rows.append(row)
                continue
            secs, runs = _time(compiled, args, repeats, budget_s)
            grads = [np.asarray(g) for g in compiled(*args)]
            if mesh is None:
                base_time, base_mem, reference = secs, mem, grads
            else:
                row["x_dense"] = None if base_time is None else secs / base_time
                row["mem_x_dense"] = None if base_mem is None else mem / base_mem
                if reference is not None:
                    row["max_err"] = max(float(np.abs(g - r).max())
                                         for g, r in zip(grads, reference))
            row.update(seconds=secs, runs=runs)
            rows.append(row)
            del compiled, args
        if show:
            print_table([r for r in rows if r["seq"] == seq], header=seq == seqs[0])
    return rows


def print_table(rows, header=True):
    if header:
        print(f"{'seq':>6}  {'strategy':<18} {'fwd+bwd ms':>11} {'x dense':>8} {'runs':>5} "
              f"{'MiB/device':>11} {'x dense':>8} {'max |dgrad|':>12}")
    fmt = lambda x, f: ("-" if x is None else format(x, f)).rjust(int(f.split(".")[0]))
    for r in rows:
        print(f"{r['seq']:>6}  {r['strategy']:<18} "
              f"{fmt(r['seconds'] and r['seconds'] * 1e3, '11.1f')} {fmt(r['x_dense'], '8.2f')} "
              f"{r['runs']:>5} {r['bytes'] / 2**20:11.1f} {fmt(r['mem_x_dense'], '8.3f')} "
              f"{fmt(r['max_err'], '12.1e')}  {r['note']}".rstrip(), flush=True)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This benchmark's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("seqs", "1024,2048,4096,8192", "Comma-separated sequence lengths.", **fv)
    flags.DEFINE_integer("repeats", 3, "Timed runs per configuration.", **fv)
    flags.DEFINE_float("budget_s", 15.0, "If --repeats runs of a configuration would take longer "
                       "than this, time a single run instead.", **fv)
    flags.DEFINE_integer("usp_ulysses", 2, "Ulysses degree of the usp mesh (ring degree = 8 / "
                         "this).", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    programs.emulate_devices(NUM_DEVICES, cpu=False)
    if len(jax.devices()) < NUM_DEVICES:
        raise SystemExit(f"need {NUM_DEVICES} devices, found {len(jax.devices())}; run with "
                         f"JAX_PLATFORMS=cpu before anything initialises a JAX backend")
    if NUM_DEVICES % FLAGS.usp_ulysses or HEADS % FLAGS.usp_ulysses:
        raise app.UsageError(f"--usp_ulysses={FLAGS.usp_ulysses} must divide {NUM_DEVICES} "
                             f"devices and {HEADS} heads")
    seqs = [int(s) for s in FLAGS.seqs.split(",") if s]
    print(f"batch {BATCH}, heads {HEADS}, head_dim {HEAD_DIM}, float32, backend "
          f"{jax.default_backend()}, {len(jax.devices())} devices; median of {FLAGS.repeats}")
    run(seqs, FLAGS.repeats, FLAGS.usp_ulysses, FLAGS.budget_s)


if __name__ == "__main__":
    define_flags()
    app.run(main)
