"""A Ray cluster on the network test bed: the head on ``h0`` bound to its cluster address, a
spot node (the ``spot_node`` resource) on every other host, every process with the job's token.

What a spot cluster does to its nodes, as operations on it: :meth:`TestBedRay.notice` (the
provider's preemption notice: SIGTERM to the spot host actor), :meth:`TestBedRay.kill` (the VM
gone: every process of its host SIGKILLed), :meth:`TestBedRay.add_node` (a host joining, or
coming back), and through the test bed itself the network's faults (a link down, a cut between
two hosts, a new address). :meth:`TestBedRay.refused_without_token` checks from a host that a
driver without the job's token, or with a wrong one, is refused.

The test bed's :meth:`~spotlight_jax.cluster.testbed.TestBed.close` stops every process this
starts.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from spotlight_jax.cluster import ray_auth
from spotlight_jax.cluster.testbed import TestBed

PORT = 6379
RAY_STARTED = "Ray runtime started"        # what ``ray start`` prints once a node is up
SPOT_RESOURCE = "spot_node"

# a driver that connects and lists the cluster's nodes (the token check)
_PROBE = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
          "print(len(ray.nodes()))")


def ray_cli() -> str:
    """The ``ray`` command of this Python's environment."""
    return os.path.join(os.path.dirname(sys.executable), "ray")


def wait_for_text(path: str, text: str, within: float,
                  proc: subprocess.Popen | None = None) -> bool:
    """Whether ``text`` appears in the file ``path`` within ``within`` seconds (False at once
    when ``proc`` exits first)."""
    deadline = time.time() + within
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                if text in f.read():
                    return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.5)
    return False


class TestBedRay:
    """Ray on ``bed``: :meth:`start` writes the job's token into ``job_dir`` (the shared
    folder's ``job`` by default), starts the head on h0 and a spot node on every other host;
    node logs go to ``logdir``. ``env`` is the base environment of every Ray process."""

    __test__ = False        # not a pytest test class

    def __init__(self, bed: TestBed, logdir: str, env: dict | None = None,
                 job_dir: str | None = None, port: int = PORT, cpus_per_node: int = 1):
        self.bed, self.logdir, self.port, self.cpus = bed, logdir, int(port), int(cpus_per_node)
        self.job_dir = job_dir or os.path.join(bed.shared, "job")
        self.token = ray_auth.job_token(self.job_dir)
        self.env = {**(env if env is not None else os.environ),
                    **ray_auth.token_env(self.token)}
        self.nodes: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = {}
        os.makedirs(logdir, exist_ok=True)

    @property
    def head_host(self):
        return self.bed.hosts[0]

    @property
    def address(self) -> str:
        return f"{self.head_host.ip}:{self.port}"

    @property
    def spot_hosts(self) -> list[str]:
        return [h.name for h in self.bed.hosts[1:]]

    def start(self, timeout_s: float = 120.0) -> TestBedRay:
        """The head, then a spot node on every other host (each waited for)."""
        self.start_head(timeout_s)
        for name in self.spot_hosts:
            self.add_node(name, timeout_s=timeout_s)
        return self

    def start_head(self, timeout_s: float = 120.0) -> None:
        """The head alone, on h0 (no spot resource: the trainer's host)."""
        self._start(self.head_host.name, ["--head", f"--port={self.port}", "--num-cpus=1"],
                    timeout_s)

    def add_node(self, host: str, wait: bool = True, timeout_s: float = 120.0) -> None:
        """A spot node on ``host`` joining the head (at the host's current address)."""
        self._start(host, [f"--address={self.address}", f"--num-cpus={self.cpus}",
                           f'--resources={{"{SPOT_RESOURCE}": 1}}'], timeout_s if wait else 0)

    def _start(self, host: str, args: list[str], timeout_s: float) -> None:
        h = self.bed.host(host)
        self.starts[host] = self.starts.get(host, 0) + 1
        log = self.log(host)
        proc = self.bed.spawn(host, ray_auth.node_command(ray_cli(), h.ip, *args),
                              env=self.env, log=log)
        self.nodes[host] = proc
        if timeout_s and not wait_for_text(log, RAY_STARTED, timeout_s, proc):
            with open(log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"the Ray node on {host} ({h.ip}) did not start within "
                               f"{timeout_s:.0f} s; {log} ends:\n{tail}")

    def log(self, host: str) -> str:
        """The log of ``host``'s latest ``ray start``."""
        return os.path.join(self.logdir, f"ray_{host}_{self.starts.get(host, 1)}.log")

    def alive(self, host: str) -> bool:
        """Whether ``host``'s latest ``ray start`` still runs (Ray stops a node it declared
        dead once the node hears of it)."""
        proc = self.nodes.get(host)
        return proc is not None and proc.poll() is None

    def notice(self, host: str) -> int:
        """The preemption notice: SIGTERM to the spot host actor process(es) on ``host``;
        returns how many."""
        return self.bed.signal(host, signal.SIGTERM, only=("SpotHostImpl",))

    def kill(self, host: str) -> None:
        """The VM gone: every process on ``host`` SIGKILLed."""
        self.bed.kill_processes(host)
        proc = self.nodes.pop(host, None)
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def run(self, host: str, argv: list[str], timeout: float = 180.0,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """``argv`` on ``host`` with the job's token (or ``env``)."""
        return self.bed.run(host, argv, env=self.env if env is None else env, timeout=timeout,
                            cwd=os.getcwd())

    def refused_without_token(self, host: str, timeout: float = 180.0) -> dict[str, bool]:
        """:func:`token_refusals` from ``host`` against this cluster."""
        return token_refusals(self.bed, host, self.address, self.env, timeout)


def token_refusals(bed: TestBed, host: str, address: str, env: dict,
                   timeout: float = 180.0) -> dict[str, bool]:
    """From ``host``, a driver with no token and one with a wrong token dial the head at
    ``address`` (``env``: the job's environment): whether each was refused for its token (not
    merely failed)."""
    bare = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    tries = {"no token": {**bare, "RAY_AUTH_MODE": "disabled"},
             "wrong token": {**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}}
    out = {}
    for name, e in tries.items():
        got = bed.run(host, [sys.executable, "-c", _PROBE, address], env=e, timeout=timeout,
                      cwd=os.getcwd())
        out[name] = got.returncode != 0 and "token" in got.stderr.lower()
    return out
