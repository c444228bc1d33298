"""Benchmark of the preemption-aware scheduler.

    python -m spotlight_jax.bench.scheduler [--quick] [--model micro|tiny] [--repeats 3]

Sets 8 emulated CPU devices: an on-demand node of 4 + two spot nodes of 2, one SP group per node
(SP degrees 4, 2, 2). Three parts:

(a) **Idle tail** (virtual clock, no preemption). N rollouts of T steps on the 4/2/2 groups under
    a step-cost model with a per-call overhead (so batching pays): a static round-robin *push*
    scheduler (equal shares handed out up front, run in fixed batches), pull with fixed equal
    batches, and pull with capacity-sized batches (with and without guided tail shrinking).
    Idle tail = device-seconds between a group's last work and the end of the run, as a share of
    all device-seconds.
(b) **Preemptions** (virtual clock). Synthetic spot traces (Poisson preemptions of the two spot
    nodes, exponential outages, ``emulation.traces``) replayed with 30 s notices (GCP) or without
    notice, for several ``commit_every``: completed rollouts per alive device-second, steps lost
    per abrupt loss (per request, bound = commit_every), the work thrown away as a share of the
    work needed (target with notice: 0 steps), and the commit share of busy device time. Medians
    over trace seeds. The toy stepper runs the math (the numbers are the cost model's).
(c) **Commit overhead** (wall clock, real model). The micro MMDiT (or the tiny config) on one
    group of one CPU device through ``Sampler.segment``: time to complete a batch of rollouts
    with commits every k steps (device-to-host copy of the chunk's latents + validation +
    queue) vs committing only at the end; once with one step per call for every k (isolates the
    commits) and once with one call per chunk (the default). Medians of ``--repeats``, compile
    excluded (a warm-up run first).
"""
from __future__ import annotations

import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from spotlight_jax import programs
from spotlight_jax.diffusion import SamplerConfig
from spotlight_jax.elastic import DevicePool, GroupConfig, PoolConfig, form_groups
from spotlight_jax.emulation import ReplayConfig, replay, synthetic_trace
from spotlight_jax.models import MMDiT, MMDiTConfig
from spotlight_jax.sched import (
    Commit,
    InProcessWorker,
    QueueConfig,
    RequestQueue,
    SamplerCache,
    SamplerStepper,
    SimConfig,
    Simulation,
    StepCost,
    ToyStepper,
    WorkerConfig,
    capacity_of,
    events_from_replay,
    make_requests,
)

FLAGS = flags.FLAGS
POOL = PoolConfig()   # od0 (on-demand, 4), spot0 (2), spot1 (2)
SPS = {"od0": 4, "spot0": 2, "spot1": 2}
# Seconds of one denoising step: 0.25 s per call (weights read, launches, collectives) + 1 s per
# sample on one device, 90% SP efficiency per doubling; 20 ms to commit a request's chunk.
COST = StepCost(sample_step_s=1.0, call_overhead_s=0.25, sp_efficiency=0.9, commit_s=0.02)
PROMPTS = ["a red bar", "two blue squares", 'the text "37"', "a green square"]
MICRO = MMDiTConfig(image_size=16, patch_size=4, width=32, depth=2, num_heads=4, mlp_ratio=2.0,
                    vocab_size=64, text_len=12, text_width=16, text_layers=1, text_heads=2,
                    conv_stem=4, conv_head=True)


def _sim(n, steps, queue_cfg, worker_cfg, events=(), seed0=0, heartbeat_s=None,
         use_notice_lead=False, down_at_start=()):
    q = RequestQueue((4, 4, 3), queue_cfg)
    q.submit(make_requests(n, num_steps=steps, prompts=PROMPTS, seed0=seed0))
    sim = Simulation(q, lambda g: ToyStepper((4, 4, 3), steps), events,
                     SimConfig(pool=POOL, groups=GroupConfig(heads=4), worker=worker_cfg,
                               cost=COST, heartbeat_s=heartbeat_s,
                               use_notice_lead=use_notice_lead, check_invariants=False),
                     down_at_start=down_at_start)
    rep = sim.run()
    if not q.all_done:
        raise RuntimeError(f"simulation did not finish: {q.summary()}")
    return q, rep


def _static_push(n, steps, batch):
    """Round-robin push: request i goes to group i % 3 up front; each group runs its share in
    batches of ``batch`` (one call of ``steps`` steps, one commit each). Returns makespan and
    idle tail device-seconds."""
    finish = {}
    for gi, (name, sp) in enumerate(SPS.items()):
        share = len(range(gi, n, len(SPS)))
        t = 0.0
        for b0 in range(0, share, batch):
            b = min(batch, share - b0)
            t += steps * COST.rollout_step(b, sp) + b * COST.commit_s
        finish[name] = t
    makespan = max(finish.values())
    return makespan, sum(SPS[g] * (makespan - f) for g, f in finish.items())


def part_a(ns, steps):
    print("\n(a) idle tail, groups of 4/2/2 devices, no preemption "
          f"(T={steps}, cost: {COST}; capacities "
          + ", ".join(f"sp{s}={capacity_of(COST, s):.2f}" for s in (4, 2))
          + "; capacity-sized batches average 8 like the fixed ones)")
    # capacity-sized pulls with the same mean batch as the fixed ones (8): a fair comparison
    # of the sizing rule, not of the batch size
    bpc = 8 / statistics.mean(capacity_of(COST, sp) for sp in SPS.values())
    modes = {
        "push round-robin, batch 8": None,
        "pull, fixed batch 4": QueueConfig(sizing="fixed", fixed_batch=4, guided=False),
        "pull, fixed batch 8": QueueConfig(sizing="fixed", fixed_batch=8, guided=False),
        "pull, capacity-sized": QueueConfig(batch_per_capacity=bpc, guided=False),
        "pull, capacity-sized + guided": QueueConfig(batch_per_capacity=bpc, guided=True),
    }
    wc = WorkerConfig(commit_every=None)
    print(f"{'N':>5} {'scheduler':<31}{'makespan s':>11}{'idle tail':>10}{'rollouts/dev-s':>15}"
          f"{'makespan / guided':>19}")
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    tails: dict[str, list[float]] = {m: [] for m in modes}
    for n in ns:
        rows = {}
        for name, qc in modes.items():
            if qc is None:
                makespan, tail = _static_push(n, steps, 8)
            else:
                _, rep = _sim(n, steps, qc, wc)
                makespan, tail = rep.makespan, rep.idle_tail_device_s
            rows[name] = (makespan, tail / (8 * makespan), n / (8 * makespan))
        base = rows["pull, capacity-sized + guided"][0]
        for name, (mk, tail, thr) in rows.items():
            ratios[name].append(mk / base)
            tails[name].append(tail)
            print(f"{n:>5} {name:<31}{mk:>11.1f}{tail:>10.1%}{thr:>15.4f}{mk / base:>19.3f}")
    print("median over N: " + "; ".join(
        f"{name}: idle tail {statistics.median(tails[name]):.1%}, makespan x"
        f"{statistics.median(ratios[name]):.3f}" for name in modes))


def part_b(n, steps, seeds, ks, rate, outage, heartbeat_s=5.0):
    duration = 4 * 3600.0
    print(f"\n(b) preemptions: synthetic traces of the 2 spot nodes (Poisson {rate:g}/node-hour, "
          f"mean outage {outage:g} s, 10 s ticks), {n} rollouts of T={steps}, capacity-sized "
          f"pulls, heartbeat every {heartbeat_s:g} s, lease {3 * heartbeat_s:g} s; medians over "
          f"{len(seeds)} trace seeds")
    rows = ([("notice 30s", 0.0, WorkerConfig(commit_every=k), False) for k in ks]
            + [("notice 30s", 0.0, WorkerConfig(commit_every=None, steps_per_call=1), False),
               ("notice+lead", 0.0, WorkerConfig(commit_every=2), True),
               ("notice+lead", 0.0, WorkerConfig(commit_every=5), True)]
            + [("abrupt", 1.0, WorkerConfig(commit_every=k), False) for k in ks])
    print(f"{'preemptions':<12}{'commit_every':>13}{'call':>6}{'events':>7}{'rollouts/dev-s':>15}"
          f"{'lost/loss/req':>14}{'max':>6}{'bound':>6}{'wasted/needed':>14}"
          f"{'commit share':>13}{'flushed/notice':>15}{'makespan s':>11}")
    for label, abrupt, wc, lead in rows:
        stats = {key: [] for key in ("events", "thr", "lost", "maxlost", "waste", "commit",
                                     "flushed", "mk")}
        for seed in seeds:
            trace = synthetic_trace(2, duration, rate_per_node_hour=rate,
                                    mean_outage_s=outage, gap_seconds=10.0, seed=seed)
            rcfg = ReplayConfig.preset("gcp", abrupt_fraction=abrupt, seed=seed)
            rp = replay(trace, ["spot0", "spot1"], rcfg)
            down = [node for node in rp.nodes if node not in rp.initial_alive]
            _, rep = _sim(n, steps, QueueConfig(), wc, events_from_replay(rp),
                          heartbeat_s=heartbeat_s, use_notice_lead=lead, down_at_start=down)
            rep.check_accounting()
            per_loss = [x["max_lost_per_request"] for x in rep.losses if x["requests"]]
            stats["events"].append(rep.num_events)
            stats["thr"].append(n / rep.alive_device_s)
            stats["lost"].append(statistics.median(per_loss) if per_loss else 0.0)
            stats["maxlost"].append(max(per_loss, default=0.0))
            stats["waste"].append((rep.wasted_steps + rep.partial_steps) / rep.required_steps)
            stats["commit"].append(rep.commit_device_s / rep.busy_device_s)
            stats["flushed"].append(statistics.median([x["committed"] for x in rep.notices])
                                    if rep.notices else 0.0)
            stats["mk"].append(rep.makespan)
        med = {key: statistics.median(v) for key, v in stats.items()}
        med["maxlost"] = max(stats["maxlost"])
        k = "none" if wc.commit_every is None else str(wc.commit_every)
        call = "step" if wc.steps_per_call == 1 else "chunk"
        print(f"{label:<12}{k:>13}{call:>6}{med['events']:>7.0f}{med['thr']:>15.5f}"
              f"{med['lost']:>14.2f}{med['maxlost']:>6.2f}{(wc.commit_every or steps):>6}"
              f"{med['waste']:>14.2%}{med['commit']:>13.2%}{med['flushed']:>15.1f}"
              f"{med['mk']:>11.1f}")
    print("lost/loss/req: steps thrown away per request per loss of a working group (median over "
          "losses, then seeds; includes the part of the call in progress; with notice only an "
          "overrun loses work); max: worst over all runs. call: one segment call per chunk or "
          "per step. notice+lead: keep working while the next call + commit fits before the "
          "deadline. wasted/needed: request-steps thrown away / request-steps needed.")


def random_params(cfg: MMDiTConfig, seed: int = 0):
    """The model graph with random parameters filled from numpy (no init program to compile):
    kernels ~ N(0, 1/fan_in), norm scales ~ 1, the rest small."""
    graphdef, shapes = nnx.split(nnx.eval_shape(lambda: MMDiT(cfg, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def fill(path, a):
        x = rng.standard_normal(a.shape)
        if "scale" in jax.tree_util.keystr(path):
            x = 1.0 + 0.05 * x
        elif a.ndim > 1:
            x = x / math.sqrt(math.prod(a.shape[:-1]))
        else:
            x = 0.05 * x
        return jnp.asarray(x.astype(a.dtype))
    return graphdef, jax.tree_util.tree_map_with_path(fill, shapes)


def part_c(model: str, n: int, steps: int, repeats: int, ks):
    if model == "micro":
        mcfg = MICRO
    else:
        from spotlight_jax.config import load_config, model_config
        config = load_config(model)
        mcfg = model_config(config)
    shape = mcfg.latent_shape
    graphdef, state = random_params(mcfg)
    cache = SamplerCache(graphdef, shape, SamplerConfig(num_steps=steps, shift=3.0))
    pool = DevicePool(PoolConfig(nodes=(("node", "on_demand", 1),)))
    (group,) = form_groups(pool, GroupConfig(heads=mcfg.num_heads), role=None, log=False)
    stepper = SamplerStepper(cache.get(group), mcfg.text_len, group)
    worker = InProcessWorker("g", stepper, params=state, capacity=1.0)

    def run_once(wc):
        worker.config = wc
        q = RequestQueue(shape, QueueConfig(lease_s=1e9, sizing="fixed", fixed_batch=n))
        q.submit(make_requests(n, num_steps=steps, prompts=PROMPTS))
        t0 = time.perf_counter()
        worker.run(q, now=time.perf_counter)
        dt = time.perf_counter() - t0
        assert q.all_done
        return dt, q.stats["commits"]

    print(f"\n(c) commit overhead, real model ({model}: image {shape}, width {mcfg.width}, depth "
          f"{mcfg.depth}), {n} rollouts x T={steps} in one batch on 1 CPU device; medians of "
          f"{repeats} runs, configurations interleaved (the machine may be shared)")
    configs = [(variant, k) for variant in ("1 step/call", "1 call/chunk") for k in ks]

    def wc_of(variant, k):
        return WorkerConfig(commit_every=k, microbatch=n,
                            steps_per_call=1 if variant == "1 step/call" else None)
    for variant, k in configs:
        run_once(wc_of(variant, k))                                # compile + warm up
    runs = {c: [] for c in configs}
    for _ in range(repeats):
        for c in configs:
            runs[c].append(run_once(wc_of(*c)))
    print(f"{'calls':<16}{'commit_every':>13}{'commits':>8}{'time s':>9}{'vs none':>9}"
          f"{'ms/extra commit':>16}")
    for variant, k in configs:
        t = statistics.median(x for x, _ in runs[(variant, k)])
        commits = runs[(variant, k)][0][1]
        none_t = statistics.median(x for x, _ in runs[(variant, None)])
        extra = commits - runs[(variant, None)][0][1]
        per = f"{(t - none_t) / extra * 1e3:.2f}" if extra else "-"
        print(f"{variant:<16}{('none' if k is None else k):>13}{commits:>8}{t:>9.3f}"
              f"{t / none_t:>9.3f}{per:>16}")
    print("commits: one per request per chunk (none = only the final state). '1 step/call' runs "
          "the same calls for every k, so its ratio is the cost of the commits alone; '1 "
          "call/chunk' also merges k steps into one call.")
    commit_path(shape, n, steps, ks, group)


def commit_path(shape, n, steps, ks, group, reps=30):
    """Direct timing of the commit path of one chunk of ``k`` steps for a batch of ``n``
    requests, on ready arrays (no compute to wait for): the device-to-host copy of the chunk's
    outputs and the queue's validation + append."""
    from jax.sharding import NamedSharding, PartitionSpec
    rep = NamedSharding(group.mesh, PartitionSpec())
    print(f"commit path alone (ready arrays, {n} requests, latent {shape}; medians of {reps}):")
    print(f"{'chunk steps':>12}{'copy ms/batch':>15}{'queue ms/commit':>17}{'ms/commit':>11}")
    for k in [k for k in ks if k is not None]:
        lat = jax.device_put(np.zeros((n, k, *shape), np.float32), rep)
        lps = jax.device_put(np.zeros((n, k), np.float32), rep)
        jax.block_until_ready((lat, lps))
        copy, queue_t = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            host_lat, host_lp = np.asarray(lat), np.asarray(lps)
            copy.append(time.perf_counter() - t0)
            q = RequestQueue(shape, QueueConfig(lease_s=1e9, sizing="fixed", fixed_batch=n))
            q.submit(make_requests(n, num_steps=steps, prompts=PROMPTS))
            lease = q.pull("g", 1.0, 0, 0.0)
            commits = [Commit(r.rid, 0, k, host_lat[j, -1].copy(), 0, latents=host_lat[j],
                              log_probs=host_lp[j], initial=host_lat[j, 0].copy())
                       for j, r in enumerate(lease.requests)]
            t0 = time.perf_counter()
            for c in commits:
                q.commit(lease.lease_id, c, 0.0)
            queue_t.append((time.perf_counter() - t0) / n)
        cm, qm = statistics.median(copy) * 1e3, statistics.median(queue_t) * 1e3
        print(f"{k:>12}{cm:>15.3f}{qm:>17.3f}{cm / n + qm:>11.3f}")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This benchmark's flags (defined only when it runs as the program; see ``programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_bool("quick", False, "Smaller sizes (a smoke run).", **fv)
    flags.DEFINE_enum("model", "micro", ["micro", "tiny"], "(c) the model.", **fv)
    flags.DEFINE_integer("repeats", 7, "(c) timed runs per configuration (median).", **fv)
    flags.DEFINE_string("parts", "abc", "Which of the parts a, b, c to run.", **fv)
    flags.DEFINE_float("rate", 30.0, "(b) preemptions per node-hour.", **fv)
    flags.DEFINE_float("outage", 60.0, "(b) mean outage seconds.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    programs.emulate_devices(8)
    steps = 10
    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}; pool {POOL.nodes}")
    if "a" in FLAGS.parts:
        part_a((48, 96) if FLAGS.quick else (48, 96, 192, 384), steps)
    if "b" in FLAGS.parts:
        part_b(96 if FLAGS.quick else 480, steps, range(2 if FLAGS.quick else 5),
               (1, 2, 5, None), FLAGS.rate, FLAGS.outage)
    if "c" in FLAGS.parts:
        part_c(FLAGS.model, 16, steps, 1 if FLAGS.quick else FLAGS.repeats, (1, 2, 5, None))


if __name__ == "__main__":
    define_flags()
    app.run(main)
