"""The faults a spot cluster's network and provider make, injected into a Ray cluster on the
network test bed, and what each cost: when Ray noticed, when the host was back.

=================  ===========================================================================
``partition``      the host's link down for ``partition_s`` (its processes keep running, nothing
                   answers), then up; a node Ray declared dead meanwhile stops once it hears so,
                   and its host starts a new one (as a requeued spot job does)
``gone``           the host's link down for good: a host that stops answering without dying
``kill``           every process of the host SIGKILLed (the VM reclaimed without notice); a new
                   node starts there after ``rejoin_s``
``new_address``    the link down for ``partition_s``, the host's processes gone, back with a new
                   address and a new node
``head_unreachable``  the host and the head cannot reach each other for ``brief_s`` while both
                   reach every other host
``preempt``        (SLURM) a higher-priority job takes the host: SLURM's notice (SIGTERM), then
                   its kill, then the spot job requeued
=================  ===========================================================================

Under SLURM the spot host's own batch script starts its node again (``spot_hosts.sbatch`` rejoins
whenever its node stops); the injector only breaks things. :class:`NodeWatch` is a driver on the
head's host that records Ray's node table every second: a fault's ``noticed_s`` is when Ray first
listed the host's node dead, ``rejoined_s`` when a new node of that host was alive.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time

from spotlight_jax.cluster.testbed import TestBed

FAULTS = ("partition", "gone", "kill", "new_address", "head_unreachable", "preempt")
SLURM_ONLY = ("preempt",)
RAY_ONLY = ("new_address",)        # under SLURM a node's address is the scheduler's to give
# what a ``kill`` spares under SLURM: its daemons and the job's batch script, which starts the
# host's Ray node again (only the node's processes die, as when a VM's workload is killed)
SLURM_PROCESSES = ("slurmd", "slurmstepd", "slurm_script", "sbatch")

_WATCH = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
while True:
    nodes = [[n["NodeID"], n["NodeManagerAddress"], bool(n["Alive"])] for n in ray.nodes()]
    print(json.dumps({"t": time.time(), "nodes": nodes}), flush=True)
    time.sleep(float(sys.argv[2]))
"""


def check_faults(faults, scheduler: str) -> list[str]:
    """``faults`` (names) checked against the scheduler; a ValueError names the bad one."""
    out = [f for f in faults if f]
    for f in out:
        if f not in FAULTS:
            raise ValueError(f"--faults: unknown fault {f!r}; the faults are {', '.join(FAULTS)}")
        if scheduler != "slurm" and f in SLURM_ONLY:
            raise ValueError(f"--faults={f} needs --scheduler=slurm (a SLURM preemption)")
        if scheduler == "slurm" and f in RAY_ONLY:
            raise ValueError(f"--faults={f} needs --scheduler=ray (under SLURM a node's address "
                             "is the scheduler's)")
    return out


class NodeWatch:
    """Ray's node table as a driver saw it, one JSON line per look in ``log`` (``{"t": time,
    "nodes": [[node id, address, alive], ...]}``); :meth:`start` starts the driver."""

    def __init__(self, log: str):
        self.log = log

    @classmethod
    def start(cls, bed: TestBed, host: str, address: str, env: dict, log: str,
              period_s: float = 1.0) -> NodeWatch:
        """A driver on ``host`` (with the job's environment ``env``) that looks at the node
        table of the head at ``address`` every ``period_s`` seconds (stopped by the test
        bed's close)."""
        bed.spawn(host, [sys.executable, "-c", _WATCH, address, str(period_s)], env=env,
                  log=log)
        return cls(log)

    def samples(self) -> list[dict]:
        if not os.path.exists(self.log):
            return []
        out = []
        with open(self.log, errors="replace") as f:
            for line in f:
                if line.startswith('{"t"'):
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass         # the last line, half written
        return out

    def nodes_at(self, ip: str, before: float) -> set[str]:
        """Node ids listed at ``ip`` up to time ``before``."""
        return {n for s in self.samples() if s["t"] <= before
                for n, a, _ in s["nodes"] if a == ip}

    def dead_at(self, ip: str, after: float) -> float | None:
        """When a node at ``ip`` alive before ``after`` was first listed dead after it."""
        known = self.nodes_at(ip, after)
        for s in self.samples():
            if s["t"] > after and any(n in known and not alive for n, _, alive in s["nodes"]):
                return s["t"]
        return None

    def new_node_alive(self, ips, after: float, exclude=frozenset()) -> float | None:
        """When a node at one of ``ips`` not in ``exclude`` was first listed alive after
        ``after``."""
        for s in self.samples():
            if s["t"] > after and any(a in ips and alive and n not in exclude
                                      for n, a, alive in s["nodes"]):
                return s["t"]
        return None

    def wait_dead(self, ip: str, after: float, within: float) -> float | None:
        deadline = time.time() + within
        while time.time() < deadline:
            got = self.dead_at(ip, after)
            if got is not None:
                return got
            time.sleep(0.5)
        return None


@dataclasses.dataclass
class Fault:
    """One injected fault; times in seconds since the run began (``None``: did not happen)."""

    kind: str
    host: str
    ip: str
    at_s: float
    healed_s: float | None = None        # the network fault ended
    noticed_s: float | None = None       # Ray listed the host's node dead
    rejoined_s: float | None = None      # a new node of the host alive again
    recovered_s: float | None = None     # the host working for the run again (see settle)
    next_iteration_s: float | None = None    # the run finished an iteration after the fault
    iteration_s: float | None = None     # wall time of the iteration the fault fell in
    new_ip: str | None = None

    def record(self) -> dict:
        return {k: (round(v, 2) if isinstance(v, float) else v)
                for k, v in dataclasses.asdict(self).items()}


class Injector:
    """Injects faults into the Ray cluster ``ray`` (a
    :class:`~spotlight_jax.cluster.testbed_ray.TestBedRay`, or None under SLURM, where
    ``slurm`` is the :class:`~spotlight_jax.cluster.testbed_slurm.LocalSlurm`); times are
    relative to ``t0``.

    A spot host's node comes back whenever it stops, as a requeued spot job's does
    (``spot_hosts.sbatch`` loops on ``ray start``): :meth:`supervise`, called by the program's
    loop, starts a new node on every host whose node has stopped, unless a fault holds the host
    (its link is down, it was just killed) or it is gone for good. Under SLURM the spot jobs do
    it themselves."""

    def __init__(self, bed: TestBed, watch: NodeWatch, t0: float, ray=None, slurm=None,
                 partition_s: float = 30.0, brief_s: float = 5.0, rejoin_s: float = 5.0):
        self.bed, self.watch, self.t0, self.ray, self.slurm = bed, watch, t0, ray, slurm
        self.partition_s, self.brief_s, self.rejoin_s = partition_s, brief_s, rejoin_s
        self.faults: list[Fault] = []
        self.held: set[str] = set()        # hosts a fault holds down
        self.gone: set[str] = set()
        self._next_ip = 100
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        """Whether a fault is being injected."""
        if self._error is not None:
            raise RuntimeError(f"injecting {self.faults[-1].kind} failed") from self._error
        return self._thread is not None and self._thread.is_alive()

    def start(self, kind: str, host: str) -> None:
        """Injects ``kind`` on ``host`` in the background (:attr:`busy` until it is over)."""
        def run():
            try:
                self.inject(kind, host)
            except BaseException as e:          # noqa: BLE001 - raised by busy
                self._error = e
        self._thread = threading.Thread(target=run, name=f"fault-{kind}", daemon=True)
        self._thread.start()

    def inject(self, kind: str, host: str) -> Fault:
        """Injects one fault and returns once it is over (the network healed, the host's
        processes gone; for ``gone``, at once)."""
        h = self.bed.host(host)
        f = Fault(kind=kind, host=host, ip=h.ip, at_s=time.time() - self.t0)
        self.faults.append(f)
        self.held.add(host)
        try:
            if kind in ("partition", "new_address", "gone"):
                self.bed.link_down(host)
                if kind == "gone":
                    self.gone.add(host)
                    return f
                time.sleep(self.partition_s)
                if kind == "new_address":        # the VM back with a new address
                    self.bed.kill_processes(host)
                    f.new_ip = self._fresh_ip()
                    self.bed.readdress(host, f.new_ip)
                f.healed_s = self.bed.link_up(host) - self.t0
            elif kind == "kill":
                self.bed.kill_processes(host, spare=SLURM_PROCESSES if self.slurm else ())
                time.sleep(self.rejoin_s)
            elif kind == "head_unreachable":
                self.bed.cut(host, self.bed.hosts[0].name)
                time.sleep(self.brief_s)
                f.healed_s = self.bed.heal(host, self.bed.hosts[0].name) - self.t0
            elif kind == "preempt":
                self.slurm.sbatch("--partition=urgent", f"--nodelist={host}", "--exclusive",
                                  "--time=5", f"--output={self.bed.shared}/urgent-%j.log",
                                  "--wrap", "sleep 20", cwd=self.bed.shared)
            else:
                raise ValueError(f"unknown fault {kind!r}; the faults are {', '.join(FAULTS)}")
        finally:
            self.held.discard(host)
        return f

    def supervise(self) -> list[str]:
        """Starts a new node on every spot host whose node stopped (not held by a fault, not
        gone); returns those hosts."""
        if self.ray is None:
            return []
        out = []
        for host in self.ray.spot_hosts:
            if host in self.held or host in self.gone or self.ray.alive(host):
                continue
            self.ray.add_node(host, wait=False)
            out.append(host)
        return out

    def _fresh_ip(self) -> str:
        taken = {h.ip for h in self.bed.hosts}
        while True:
            ip = str(self.bed.subnet.network_address + self._next_ip)
            self._next_ip += 1
            if ip not in taken:
                return ip

    def settle(self, rows: list[dict], until: float) -> list[dict]:
        """Fills each fault's noticed / rejoined / recovered / iteration times from the node
        watch and the run's rows (``rl.jsonl``, each with its wall ``time``), each read up to
        the next fault on the same host; returns the faults' records. ``recovered_s``: a host
        Ray declared dead is back when a new node of it is alive; one it never declared dead
        when the network healed; a host gone for good never."""
        trained = sorted(r["time"] for r in rows if "loss" in r or r.get("step") == 0)
        for i, f in enumerate(self.faults):
            at = self.t0 + f.at_s
            end = min([self.t0 + g.at_s for g in self.faults[i + 1:] if g.host == f.host]
                      + [until])
            dead = self.watch.dead_at(f.ip, at)
            f.noticed_s = None if dead is None or dead > end else dead - self.t0
            before = self.watch.nodes_at(f.ip, at)
            back = self.watch.new_node_alive({f.ip, f.new_ip}, at, exclude=before)
            f.rejoined_s = None if back is None or back > end else back - self.t0
            if f.kind == "gone":
                f.recovered_s = None
            elif f.noticed_s is not None or f.kind in ("kill", "new_address", "preempt"):
                f.recovered_s = f.rejoined_s
            else:
                f.recovered_s = f.healed_s
            after = [t for t in trained if t > at]
            f.next_iteration_s = (after[0] - self.t0) if after else None
            before_at = [t for t in trained if t <= at]
            f.iteration_s = (after[0] - before_at[-1]) if after and before_at else None
        return [f.record() for f in self.faults]
