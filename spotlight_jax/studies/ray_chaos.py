"""A real-process chaos run: post-training against a local Ray cluster whose spot nodes are
really preempted on the wall clock by a spot trace.

    python -m spotlight_jax.studies.ray_chaos --config=configs/tiny.py --mode=spotlight \\
        --hosts=3 --trace=synthetic --speedup=20 --iterations=40 --workdir=/tmp/chaos
    python -m spotlight_jax.studies.ray_chaos ... --cluster=testbed --partition_fraction=0.5

Starts a Ray head and one worker node process per spot host (``ray start --address ...
--resources='{"spot_node": 1}'``), runs the command-line post-training against it
(``deployment.transport=ray``) and replays the trace (a SkyPilot file, or ``synthetic``: the
config's Poisson trace), its times divided by ``--speedup``: a notice is a SIGTERM to the spot
host actor on that node, then SIGKILL of the node's processes after the provider's notice lead
(also divided by the speed-up); an abrupt loss is a SIGKILL of the node's processes; a join
starts a new node process. ``--cluster=testbed``: the cluster is hosts on a real network (the
network test bed, ``cluster.testbed``: Linux, root), the head on h0 bound to its cluster address
with token authentication, the trainer on h0, one spot host per trace node; a share
(``--partition_fraction``) of the abrupt losses are partitions instead of kills: the host's link
goes down and its processes keep running, unanswered, until the trace's join for that node, when
its processes are killed, the link comes back and a new node starts. Then it runs the emulated
transport's post-training of the same seed (``--compare``) and prints, and writes to
``W/chaos.json``: iterations, candidates scored and dropped per iteration, hosts lost during
exploration, rollout steps redone, requests completed twice and iterations trained on a short or
mixed-version batch (both must be 0), hosts started and nodes joined, and the held-out curve of
both runs. Needs the cluster extra and ``psutil``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from absl import app, flags

from spotlight_jax import programs

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This program's flags (defined only when it runs; see ``spotlight_jax.programs``)."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("config", programs.TINY_CONFIG, "Config file of the post-training.", **fv)
    flags.DEFINE_enum("mode", "spotlight", ["spot_rollout", "spotlight", "spotlight_pipelined"],
                      "Spot mode to run.", **fv)
    flags.DEFINE_integer("hosts", 3, "Spot nodes (one host actor each).", **fv)
    flags.DEFINE_enum("cluster", "local", ["local", "testbed"], "local: processes on this "
                      "machine's loopback; testbed: hosts on the network test bed.", **fv)
    flags.DEFINE_float("partition_fraction", 0.5, "testbed: share of the abrupt losses that "
                       "are partitions (the host unanswered until its join) rather than kills.",
                       **fv)
    flags.DEFINE_integer("cpu_devices", 2, "Emulated devices per spot host.", **fv)
    flags.DEFINE_string("trace", "synthetic", "SkyPilot trace file, or 'synthetic'.", **fv)
    flags.DEFINE_float("trace_start_s", 0.0, "Replay the trace file from this time on.", **fv)
    flags.DEFINE_float("rate_per_node_hour", 2.0, "Synthetic trace: preemptions per node-hour.",
                       **fv)
    flags.DEFINE_float("mean_outage_s", 600.0, "Synthetic trace: mean outage seconds.", **fv)
    flags.DEFINE_float("abrupt_fraction", 0.3, "Share of losses without a notice.", **fv)
    flags.DEFINE_string("cloud", "aws", "Notice lead time preset (aws 120 s, gcp 30 s).", **fv)
    flags.DEFINE_float("speedup", 20.0, "Trace seconds per wall second.", **fv)
    flags.DEFINE_integer("iterations", 40, "RL iterations.", **fv)
    flags.DEFINE_integer("eval_every", 10, "Held-out evaluation cadence.", **fv)
    flags.DEFINE_string("workdir", "/tmp/spotlight_chaos", "Output folder.", **fv)
    flags.DEFINE_multi_string("set", [], "Extra config overrides key=value.", **fv)
    flags.DEFINE_bool("compare", True, "Also run the emulated transport with the same seed.",
                      **fv)
    flags.DEFINE_float("timeout_s", 3600.0, "Give up on the post-training after this.", **fv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# a throw-away cluster on this machine, on 127.0.0.1 only (LocalCluster._ray):
# no token authentication between its processes; a node whose raylet starves on a loaded
# machine survives 20 missed health checks (only the replayed kills should lose nodes)
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "JAX_PLATFORMS": "cpu",
       "RAY_health_check_failure_threshold": "20"}


# what ``ray start`` prints once a node's processes are up and registered with the head
RAY_STARTED = "Ray runtime started."


class LocalCluster:
    """A Ray head (no spot resource) and spot node processes on this machine."""

    def __init__(self, workdir: str, cpus_per_node: int = 1):
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.cpus = cpus_per_node
        self.logdir = os.path.join(workdir, "ray_nodes")
        os.makedirs(self.logdir, exist_ok=True)
        self.nodes: dict[str, subprocess.Popen] = {}
        self.joins = 0
        self.nodes["head"] = self._ray("head", ["--head", f"--port={self.port}", "--num-cpus=1"])
        # up once its GCS (which the nodes and drivers dial) and raylet are
        self._wait_started("head", 120.0)

    def _ray(self, name: str, args) -> subprocess.Popen:
        """``ray start ... --block`` as its own process group (killed as a whole), listening on
        127.0.0.1 only (``ray_hosts.ray_start_command``)."""
        from spotlight_jax.cluster.ray_hosts import ray_start_command  # noqa: PLC0415

        log = open(self._log(name), "w")  # noqa: SIM115
        cmd = ray_start_command([*args, "--block"])
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=ENV)

    def add_node(self, name: str, wait: bool = True, timeout_s: float = 120.0) -> None:
        """Starts spot node ``name``; with ``wait``, returns once its ``ray start`` says the
        node's runtime is up (two nodes started back to back on one machine would otherwise
        race for the same socket names and one of them die)."""
        self.nodes[name] = self._ray(name, [f"--address={self.address}",
                                            f"--num-cpus={self.cpus}",
                                            '--resources={"spot_node": 1}'])
        if wait:
            self._wait_started(name, timeout_s)
        self.joins += 1

    def _log(self, name: str) -> str:
        """The log of node ``name``'s current ``ray start`` (one per join)."""
        return os.path.join(self.logdir, f"{name}_{self.joins}.log")

    def _wait_started(self, name: str, timeout_s: float) -> None:
        log = self._log(name)
        deadline = time.monotonic() + timeout_s
        while True:
            with open(log) as f:
                text = f.read()
            if RAY_STARTED in text:
                return
            if self.nodes[name].poll() is not None or time.monotonic() > deadline:
                why = "exited" if self.nodes[name].poll() is not None else \
                    f"not up after {timeout_s:.0f} s"
                raise RuntimeError(f"Ray node {name!r} {why}; its log {log} ends:\n"
                                   f"{text[-2000:]}")
            time.sleep(0.2)

    def _tree(self, name: str):
        import psutil  # noqa: PLC0415 - the chaos run's own dependency
        proc = self.nodes.get(name)
        if proc is None or proc.poll() is not None:
            return []
        try:
            root = psutil.Process(proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def notice(self, name: str) -> int:
        """SIGTERM to the spot host actor process(es) on node ``name``; returns how many."""
        hit = 0
        for p in self._tree(name):
            try:
                if "SpotHostImpl" in " ".join(p.cmdline()) or "SpotHostImpl" in p.name():
                    p.send_signal(signal.SIGTERM)
                    hit += 1
            except Exception:  # noqa: BLE001 - it may be gone already
                pass
        return hit

    def kill(self, name: str) -> None:
        """SIGKILL every process of node ``name`` (the VM is gone)."""
        for p in reversed(self._tree(name)):
            try:
                p.kill()
            except Exception:  # noqa: BLE001
                pass
        proc = self.nodes.pop(name, None)
        if proc is not None:
            proc.wait(timeout=30)

    def launch(self, argv: list[str], log: str) -> subprocess.Popen:
        """``argv`` (the post-training) as a driver of this cluster."""
        with open(log, "w") as f:
            return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=ENV)

    def close(self) -> None:
        """Kills every node, the head last (only this cluster's processes)."""
        for name in [n for n in self.nodes if n != "head"] + ["head"]:
            self.kill(name)
        # the head's address file would send a later ray.init() to this dead cluster
        current = "/tmp/ray/ray_current_cluster"
        try:
            with open(current) as f:
                if f.read().strip().endswith(f":{self.port}"):
                    os.remove(current)
        except OSError:
            pass


class TestBedCluster:
    """The same cluster on the network test bed: the head on h0 (token authentication), trace
    node ``nodes[i]`` on host ``h{i+1}``; the post-training runs on h0 (:meth:`launch`).
    Besides notices and kills it partitions a host (:meth:`partition`): its link down, its
    processes running unanswered, until :meth:`kill` takes the host down and reconnects it."""

    def __init__(self, workdir: str, nodes, env: dict):
        from spotlight_jax.cluster import testbed  # noqa: PLC0415
        from spotlight_jax.cluster.testbed_ray import TestBedRay  # noqa: PLC0415
        why = testbed.unavailable()
        if why:
            raise app.UsageError(f"--cluster=testbed: {why}")
        self.host = {n: f"h{i + 1}" for i, n in enumerate(nodes)}
        self.bed = testbed.TestBed(len(nodes) + 1, os.path.join(workdir, "bed"),
                                   share=[os.path.abspath(workdir)]).create()
        try:
            self.ray = TestBedRay(self.bed, os.path.join(workdir, "ray_nodes"), env)
            self.ray.start_head()
        except Exception:
            self.bed.close()
            raise
        self.address, self.env = self.ray.address, self.ray.env
        self.joins, self.partitioned = 0, set()

    def add_node(self, name: str, wait: bool = True, timeout_s: float = 120.0) -> None:
        self.ray.add_node(self.host[name], wait=wait, timeout_s=timeout_s)
        self.joins += 1

    def notice(self, name: str) -> int:
        return self.ray.notice(self.host[name])

    def partition(self, name: str) -> None:
        self.bed.link_down(self.host[name])
        self.partitioned.add(name)

    def kill(self, name: str) -> None:
        self.ray.kill(self.host[name])
        if name in self.partitioned:
            self.bed.link_up(self.host[name])
            self.partitioned.discard(name)

    def launch(self, argv: list[str], log: str) -> subprocess.Popen:
        return self.bed.spawn("h0", argv, env=self.env, log=log, cwd=os.getcwd())

    def close(self) -> None:
        self.bed.close()


def _events(num_hosts: int, horizon_s: float):
    from spotlight_jax.emulation.traces import (  # noqa: PLC0415
        ReplayConfig,
        TraceConfig,
        replay,
    )
    path = "" if FLAGS.trace == "synthetic" else FLAGS.trace
    tc = TraceConfig(path=path, start_s=FLAGS.trace_start_s,
                     rate_per_node_hour=FLAGS.rate_per_node_hour,
                     mean_outage_s=FLAGS.mean_outage_s, cloud=FLAGS.cloud,
                     abrupt_fraction=FLAGS.abrupt_fraction)
    rc = ReplayConfig.preset(FLAGS.cloud, abrupt_fraction=FLAGS.abrupt_fraction)
    rep = replay(tc.load(num_hosts, horizon_s), num_hosts, rc)
    return rep, [e for e in rep.events if e.time < horizon_s]


def _post_train(workdir: str, transport: str, cluster=None) -> subprocess.Popen:
    """The command-line post-training, against ``cluster`` (its driver) or, without one, on
    the emulated transport."""
    over = {"mode": FLAGS.mode, "deployment.transport": transport,
            "deployment.spot_nodes": FLAGS.hosts,
            "deployment.spot_devices_per_node": FLAGS.cpu_devices,
            "rl.iterations": FLAGS.iterations, "rl.max_minutes": 0,
            "rl.eval_every": FLAGS.eval_every}
    if cluster is not None:
        over.update({"deployment.ray_address": cluster.address,
                     "deployment.ray_spot_resource": "spot_node"})
    args = [f"--config.{k}={v}" for k, v in over.items()] + [f"--config.{kv}" for kv in
                                                             FLAGS.set]
    argv = [sys.executable, "-m", "spotlight_jax.main", f"--config={FLAGS.config}",
            f"--workdir={workdir}", *args]
    if cluster is not None:
        return cluster.launch(argv, workdir + ".log")
    with open(workdir + ".log", "w") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=ENV)


def _rows(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "rl.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _replay(cluster, events, proc, speedup: float, lead_s: float,
            partition_fraction: float = 0.0) -> dict:
    """Applies the events on the wall clock while ``proc`` runs; returns what was applied. A
    share ``partition_fraction`` of the abrupt losses (every one whose running share falls
    short of it: deterministic) partitions the host instead of killing it (a
    :class:`TestBedCluster`)."""
    applied = {"notice": 0, "loss": 0, "abrupt": 0, "partition": 0, "join": 0,
               "actor_signalled": 0}
    kills: list[tuple[float, str]] = []        # (wall time, node) due after a notice
    t0 = time.monotonic()
    queue = list(events)
    while proc.poll() is None:
        now = (time.monotonic() - t0) * speedup
        while queue and queue[0].time <= now:
            e = queue.pop(0)
            if e.kind == "notice":
                applied["notice"] += 1
                applied["actor_signalled"] += cluster.notice(e.node)
                kills.append((time.monotonic() + lead_s / speedup, e.node))
            elif e.kind == "loss":
                applied["loss"] += 1
                if e.abrupt:
                    applied["abrupt"] += 1
                    if applied["partition"] < partition_fraction * applied["abrupt"]:
                        applied["partition"] += 1
                        cluster.partition(e.node)
                    else:
                        cluster.kill(e.node)
            elif e.kind == "join":
                applied["join"] += 1
                cluster.kill(e.node)        # a node lost with notice may still be running
                cluster.add_node(e.node, wait=False)    # joins as the trace says, mid-run
        for due, node in [k for k in kills if k[0] <= time.monotonic()]:
            kills.remove((due, node))
            cluster.kill(node)
        time.sleep(0.05)
    return applied


def _summary(rows: list[dict], emu_rows: list[dict], applied: dict, wall_s: float) -> dict:
    it = [r for r in rows if r.get("step", 0) > 0 and "loss" in r]

    def total(key):
        return int(sum(r.get(key, 0) for r in it))

    scored = [r.get("explore_candidates", 0) - r.get("explore_dropped", 0)
              - r.get("explore_rejected", 0) for r in it]
    return {
        "iterations": len(it), "wall_s": wall_s, "events": applied,
        "candidates_scored_per_iteration": (sum(scored) / len(it)) if it else 0.0,
        "candidates_dropped": total("explore_dropped"),
        "candidates_rejected_wrong_version": total("explore_rejected"),
        "hosts_left_during_exploration": total("explore_lost"),
        "hosts_left_during_rollouts": total("ray_hosts_noticed") + total("ray_hosts_lost_busy"),
        "hosts_found_dead_between_phases": total("ray_hosts_lost") - total("ray_hosts_lost_busy")
        + total("explore_hosts_dead"),
        "rollout_steps_redone": total("ray_redone_steps"),
        "requests_completed_twice": total("ray_duplicates") + total("explore_duplicates"),
        # the runner refuses a short or mixed-version rollout batch (the run stops with an
        # error) and rejects wrong-version candidates: a run that finished trained on none
        "explore_steps_wasted": total("explore_wasted_steps"),
        "hosts_started": total("ray_hosts_started") + total("explore_hosts_started"),
        "hosts_joined_mid_phase": total("ray_hosts_joined") + total("explore_hosts_joined"),
        # over the iterations in which some host explored
        "explore_overlap_median": _median([r["explore_overlap"] for r in it
                                           if r.get("explore_hosts", 0) > 0]),
        "iterations_with_exploring_hosts": sum(r.get("explore_hosts", 0) > 0 for r in it),
        # wall seconds of an iteration's rollout + train phases (the Ray transport's overhead
        # against the emulated one on the same cores)
        "iteration_wall_s_median_ray": _median([r["time_rollout"] + r["time_train"]
                                                for r in it]),
        "iteration_wall_s_median_emulated": _median([
            r["time_rollout"] + r["time_train"] for r in emu_rows
            if r.get("step", 0) > 0 and "loss" in r]),
        "held_out_ray": [(r["step"], r["val_reward"], r["val_reward_ci95"]) for r in rows
                         if "val_reward" in r],
        "held_out_emulated": [(r["step"], r["val_reward"], r["val_reward_ci95"])
                              for r in emu_rows if "val_reward" in r],
    }


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from spotlight_jax.emulation.traces import LEAD_TIME_PRESETS  # noqa: PLC0415
    # a SIGTERM to this program still takes its cluster down (the finally blocks below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(FLAGS.workdir, exist_ok=True)
    ray_dir = os.path.join(FLAGS.workdir, "ray")
    rep, events = _events(FLAGS.hosts, FLAGS.timeout_s * FLAGS.speedup)
    if FLAGS.cluster == "testbed":
        # the job's token instead of no authentication, and Ray's own health checks (a
        # partition must be noticed as on a cluster)
        cluster = TestBedCluster(FLAGS.workdir, rep.nodes, {
            k: v for k, v in ENV.items()
            if k not in ("RAY_AUTH_MODE", "RAY_health_check_failure_threshold")})
        partitions = FLAGS.partition_fraction
    else:
        cluster, partitions = LocalCluster(FLAGS.workdir), 0.0
    t0 = time.monotonic()
    try:
        for node in rep.initial_alive:
            cluster.add_node(node)
        proc = _post_train(ray_dir, "ray", cluster)
        try:
            applied = _replay(cluster, events, proc, FLAGS.speedup,
                              LEAD_TIME_PRESETS[FLAGS.cloud], partitions)
            proc.wait(timeout=FLAGS.timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        cluster.close()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the post-training failed (exit {proc.returncode}); see "
                         f"{ray_dir}.log")
    emu_rows = []
    if FLAGS.compare:
        emu_dir = os.path.join(FLAGS.workdir, "emulated")
        emu = _post_train(emu_dir, "emulated")
        emu.wait(timeout=FLAGS.timeout_s)
        emu_rows = _rows(emu_dir)
    out = _summary(_rows(ray_dir), emu_rows, applied, wall)
    out["command"] = " ".join(sys.argv)
    with open(os.path.join(FLAGS.workdir, "chaos.json"), "w") as f:
        json.dump(out, f, indent=1)
    for key, v in out.items():
        print(f"{key}: {v}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
