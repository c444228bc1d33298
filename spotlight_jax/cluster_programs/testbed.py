"""Spotlight across hosts on a real network, with the faults a network makes, in one command.

    python -m spotlight_jax.cluster_programs.testbed --hosts=4 --mode=spotlight --iterations=4 \\
        --faults=partition,kill [--scheduler=slurm] --workdir=W

Builds the network test bed (``cluster.testbed``: Linux, root; N hosts as network namespaces on
a bridge, each with its own address, ``/tmp`` and hostname, ``W/bed/shared`` standing for the
cluster's shared file system), starts Ray on it (the head on h0 bound to its cluster address,
token authentication on, a spot node on every other host; ``--scheduler=slurm``: a local SLURM
over the hosts runs the users' ``launch/slurm/spotlight.sbatch`` and a ``spot_hosts.sbatch``
array instead), checks that a driver without the job's token is refused, post-trains with the
trainer on h0, injects ``--faults`` one after another on the spot hosts in turn (the first once
the run has finished its first iteration, each next once the one before is over and the run has
finished one more iteration; ``cluster.testbed_faults`` lists them), tears everything down and
writes ``W/testbed.json``: ``hosts`` (name, ip, role), ``iterations``,
``requests_completed_twice``, ``short_batches``, ``faults`` (kind, host, at_s, noticed_s,
recovered_s, ...), ``unauthenticated_refused`` and, under SLURM, ``slurm.jobs`` (id, name,
state). The run's own folder (``rl.jsonl``, checkpoints) is ``W/bed/shared/job``.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import sys
import time

from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS
CHECKOUT = str(programs.REPO)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This program's flags (defined only when it runs; see ``spotlight_jax.programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_integer("hosts", 4, "Hosts: h0 runs the trainer and the Ray head, the others "
                         "are spot hosts.", **fv)
    flags.DEFINE_enum("mode", "spotlight", ["spot_rollout", "spotlight", "spotlight_pipelined"],
                      "Spot mode to run.", **fv)
    flags.DEFINE_integer("iterations", 4, "RL iterations.", **fv)
    flags.DEFINE_list("faults", ["partition", "kill"], "Faults, injected in this order: "
                      "partition, gone, kill, new_address, head_unreachable, preempt (SLURM).",
                      **fv)
    flags.DEFINE_enum("scheduler", "ray", ["ray", "slurm"], "ray: the command starts the Ray "
                      "nodes; slurm: the SLURM launchers do.", **fv)
    flags.DEFINE_string("workdir", None, "Output folder (the test bed is built under it).",
                        **fv)
    flags.DEFINE_string("config", programs.TINY_CONFIG, "Config file of the post-training.",
                        **fv)
    flags.DEFINE_multi_string("set", [], "Extra config overrides key=value.", **fv)
    flags.DEFINE_integer("spot_devices", 2, "Emulated devices per spot host.", **fv)
    flags.DEFINE_float("partition_s", 30.0, "How long a partition lasts.", **fv)
    flags.DEFINE_float("brief_s", 5.0, "How long the head stays unreachable from a host.", **fv)
    flags.DEFINE_float("timeout_s", 1800.0, "Give up on the post-training after this.", **fv)


def _overrides(address: str, spot_hosts: int) -> dict:
    """The run's config overrides: the mode and iterations, Ray spot hosts at ``address`` (a
    SLURM job's head writes its own), the emulated trace's preemptions off (the faults are
    real here), then ``--set``'s."""
    out = {"mode": FLAGS.mode, "rl.iterations": FLAGS.iterations, "rl.max_minutes": 0,
           "deployment.transport": "ray", "deployment.ray_spot_resource": "spot_node",
           "deployment.spot_nodes": spot_hosts,
           "deployment.spot_devices_per_node": FLAGS.spot_devices,
           "trace.rate_per_node_hour": 0.0}
    if address:
        out["deployment.ray_address"] = address
    for kv in FLAGS.set:
        key, sep, value = kv.partition("=")
        if not sep:
            raise app.UsageError(f"--set={kv!r}: give key=value (e.g. --set=rl.lr=1e-3)")
        out[key] = value
    return out


def _planned_batch(overrides: dict) -> int:
    """The batch an iteration trains on: prompts per iteration x group size, from the config
    with the run's overrides."""
    from spotlight_jax.config import load_config  # noqa: PLC0415

    def literal(v):
        try:
            return ast.literal_eval(v) if isinstance(v, str) else v
        except (ValueError, SyntaxError):
            return v

    cfg = load_config(FLAGS.config, {k: literal(v) for k, v in overrides.items()
                                     if k.startswith("rl.")})
    return int(cfg.rl.prompts_per_iter) * int(cfg.rl.group_size)


def _flags(overrides: dict) -> list[str]:
    return [f"--config.{k}={v}" for k, v in overrides.items()]


def _rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "rl.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass                    # a line being written
    return out


def _trained(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("step", 0) > 0 and "loss" in r]


def _child_env() -> dict:
    """A child JAX process's environment: CPU, without a parent's forced device count."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "force_host_platform_device_count" not in f)
    return env


def _start_ray(bed, logs: str, env: dict):
    from spotlight_jax.cluster.testbed_ray import TestBedRay  # noqa: PLC0415
    return TestBedRay(bed, logs, env).start()


def _start_slurm(bed, run_dir: str, env: dict, overrides: dict):
    """A local SLURM on the hosts; the trainer job and the spot array submitted as a user
    would; returns (slurm, trainer id, the head's address, the Ray environment)."""
    from spotlight_jax.cluster import ray_auth, testbed, testbed_slurm  # noqa: PLC0415
    slurm = testbed_slurm.LocalSlurm(bed).start()
    trainer, _ = slurm.submit_spotlight(run_dir, _flags(overrides), len(bed.hosts) - 1,
                                        FLAGS.config, CHECKOUT, env)
    address_file = os.path.join(run_dir, "ray_head_address.txt")
    address = testbed.wait_until(
        lambda: os.path.exists(address_file) and open(address_file).read().strip(), 120,
        "the trainer job wrote the Ray head's address")
    return slurm, trainer, address, {**env, **ray_auth.token_env(ray_auth.job_token(run_dir))}


def _refused(bed, address: str, env: dict) -> bool:
    """Whether drivers on the last host without the job's token, or with a wrong one, are
    refused for it."""
    from spotlight_jax.cluster.testbed_ray import token_refusals  # noqa: PLC0415
    return all(token_refusals(bed, bed.hosts[-1].name, address, env).values())


def _inject(inj, faults: list[str], targets: list[str], run_dir: str, done, t0: float) -> None:
    """The faults one after another on the spot hosts in turn: the first once the run has
    finished an iteration, each next once the one before is over and the run has finished one
    more; meanwhile every host whose Ray node stopped gets a new one (``inj.supervise``).
    Returns when the run is done."""
    pending, need = list(faults), 1
    deadline = time.time() + FLAGS.timeout_s
    while not done():
        if time.time() > deadline:
            raise RuntimeError(f"the post-training did not finish within {FLAGS.timeout_s:.0f} s")
        inj.supervise()
        if pending and not inj.busy and targets and len(_trained(_rows(run_dir))) >= need:
            kind, host = pending.pop(0), targets[(len(faults) - len(pending) - 1) % len(targets)]
            print(f"[{time.time() - t0:6.1f} s] {kind} on {host}", flush=True)
            inj.start(kind, host)
            if kind == "gone":               # it answers no more: no later fault goes there
                targets.remove(host)
            need = len(_trained(_rows(run_dir))) + 1
        time.sleep(0.5)
    inj.busy                                 # noqa: B018 - raises what a fault raised


def run(workdir: str) -> dict:
    """The whole command; returns what it writes to ``testbed.json``."""
    from spotlight_jax.cluster import testbed, testbed_faults  # noqa: PLC0415

    faults = testbed_faults.check_faults(FLAGS.faults, FLAGS.scheduler)
    if FLAGS.hosts < 2:
        raise app.UsageError(f"--hosts={FLAGS.hosts}: give at least 2 (h0 trainer, spot hosts)")
    if FLAGS.iterations <= len(faults):
        raise app.UsageError(f"--iterations={FLAGS.iterations}: give more than the "
                             f"{len(faults)} fault(s), each waits for an iteration")
    why = testbed.unavailable()
    if why:
        raise app.UsageError(why)
    env = _child_env()
    bed_root = os.path.join(workdir, "bed")
    shutil.rmtree(bed_root, ignore_errors=True)
    logs = os.path.join(workdir, "logs")
    os.makedirs(logs, exist_ok=True)
    out: dict = {"command": " ".join(sys.argv), "scheduler": FLAGS.scheduler}
    slurm = None
    # what the run reads from this machine's folders (a base checkpoint, a config) every host
    # sees, as it would on the cluster's file system
    share = [v for v in (*_overrides("", 0).values(), FLAGS.config)
             if isinstance(v, str) and os.path.isabs(v) and os.path.exists(v)]
    with testbed.TestBed(FLAGS.hosts, bed_root, share=share) as bed:
        out["hosts"] = [{**h, "role": "trainer" if i == 0 else "spot"}
                        for i, h in enumerate(bed.describe())]
        run_dir = os.path.join(bed.shared, "job")
        spot_hosts = [h.name for h in bed.hosts[1:]]
        try:
            if FLAGS.scheduler == "ray":
                ray = _start_ray(bed, logs, env)
                overrides = _overrides(ray.address, len(spot_hosts))
                address, ray_env = ray.address, ray.env
                out["unauthenticated_refused"] = _refused(bed, address, ray_env)
                watch = testbed_faults.NodeWatch.start(bed, "h0", address, ray_env,
                                                 os.path.join(logs, "nodes.jsonl"))
                run_log = os.path.join(logs, "run.log")
                t0 = time.time()
                proc = bed.spawn("h0", [sys.executable, "-m", "spotlight_jax.main",
                                        f"--config={FLAGS.config}", f"--workdir={run_dir}",
                                        *_flags(overrides)],
                                 env=ray_env, log=run_log, cwd=CHECKOUT)
                done = lambda: proc.poll() is not None       # noqa: E731
            else:
                ray = None
                overrides = _overrides("", len(spot_hosts))
                t0 = time.time()
                slurm, trainer, address, ray_env = _start_slurm(bed, run_dir, env, overrides)
                run_log = os.path.join(bed.shared, f"trainer-{trainer}.log")
                done = lambda: slurm.job(trainer).get("JobState") in (   # noqa: E731
                    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "")
                out["unauthenticated_refused"] = _refused(bed, address, ray_env)
                watch = testbed_faults.NodeWatch.start(bed, "h0", address, ray_env,
                                                 os.path.join(logs, "nodes.jsonl"))
            planned = _planned_batch(overrides)
            inj = testbed_faults.Injector(bed, watch, t0, ray=ray, slurm=slurm,
                                          partition_s=FLAGS.partition_s, brief_s=FLAGS.brief_s)
            _inject(inj, faults, list(spot_hosts), run_dir, done, t0)
            testbed.wait_until(done, FLAGS.timeout_s, "the post-training finished")
            end = time.time()
            time.sleep(2.0)                  # the node watch's last samples
            rows = _rows(run_dir)
            trained = _trained(rows)
            out["faults"] = inj.settle(rows, end)
            out["faults_not_injected"] = faults[len(inj.faults):]
            if slurm is not None:
                out["slurm"] = {"jobs": slurm.job_records()}
                state = slurm.job(trainer).get("JobState", "")
                ok = state == "COMPLETED"
            else:
                ok = proc.returncode == 0
            if not ok:
                with open(run_log, errors="replace") as f:
                    tail = f.read()[-3000:]
                raise RuntimeError(f"the post-training failed; {run_log} ends:\n{tail}")
        finally:
            if slurm is not None:
                slurm.close()

    def total(key):
        return int(sum(r.get(key, 0) for r in trained))

    out.update({
        "iterations": len(trained), "wall_s": round(end - t0, 1),
        "requests_completed_twice": total("ray_duplicates") + total("explore_duplicates"),
        "short_batches": sum(r.get("train_samples", 0) != planned for r in trained),
        "batch": planned,
        "candidates_rejected_wrong_version": total("explore_rejected"),
        "hosts_lost": total("ray_hosts_lost") + total("explore_lost")
        + total("explore_hosts_dead"),
        "rollout_steps_redone": total("ray_redone_steps"),
        "held_out": [(r["step"], r["val_reward"]) for r in rows if "val_reward" in r],
        "leftovers": bed.leftovers(),
    })
    return out


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS.workdir:
        raise app.UsageError("--workdir=W is required (the test bed and testbed.json go there)")
    workdir = os.path.abspath(FLAGS.workdir)
    os.makedirs(workdir, exist_ok=True)
    # a SIGTERM to this program still tears the test bed down (the with and finally blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = run(workdir)
    with open(os.path.join(workdir, "testbed.json"), "w") as f:
        json.dump(out, f, indent=1)
    for key in ("hosts", "iterations", "requests_completed_twice", "short_batches",
                "unauthenticated_refused", "faults", "faults_not_injected", "leftovers"):
        print(f"{key}: {json.dumps(out.get(key))}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
