"""A local SLURM over the network test bed: slurmctld on h0, one slurmd per host, munge.

What the SLURM launchers (``launch/slurm/*.sbatch``) meet on a real cluster, on one machine:
partitions ``ondemand`` (h0, the trainer's) and ``spot`` (the other hosts; preemptible:
``PreemptMode=REQUEUE``) and ``urgent`` (the spot hosts again, at a higher priority tier: a job
there preempts a spot job, the way a cloud reclaims a spot VM). Jobs run inside their node's
namespace (its address, its ``/tmp``, the test bed's hosts file), so ``scontrol show
hostnames``, ``getent hosts`` and ``srun`` behave as on a cluster. It is started by the steps
of the users' recipe, ``launch/slurm/local_slurm.sh``.

Needs root and Debian's ``slurm-wlm`` and ``munge`` packages (:func:`unavailable` says what is
missing, in one line). Its own munge daemon (socket, key, logs in the state folder) leaves the
machine's alone; :meth:`LocalSlurm.close` stops every daemon it started.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from spotlight_jax.cluster.testbed import TestBed

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol")
# the users' recipe for a small SLURM cluster, which this runs step by step
RECIPE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "launch", "slurm", "local_slurm.sh")


def unavailable() -> str | None:
    """Why this machine cannot run the local SLURM (None when it can)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (f"the local SLURM needs {', '.join(missing)}: apt-get install slurm-wlm munge "
                "(Debian, SLURM 22.05)")
    return None


class LocalSlurm:
    """SLURM daemons on ``bed``'s hosts; state, configuration and logs in the test bed's shared
    folder (``slurm/``: every host reads the same ``slurm.conf``, as on a cluster). Every host
    gets ``cpus`` CPUs (they share the machine's cores)."""

    def __init__(self, bed: TestBed, cpus: int = 2):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        if len(bed.hosts) < 2:
            raise ValueError("the local SLURM needs at least 2 hosts: h0 on-demand, the rest "
                             "spot")
        self.bed, self.cpus = bed, int(cpus)
        self.state = os.path.join(bed.shared, "slurm")
        self.conf = os.path.join(self.state, "slurm.conf")
        self._munged: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment of a SLURM command on the test bed (``sbatch``, ``squeue``, ...)."""
        return {**os.environ, "SLURM_CONF": self.conf}

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- lifetime ---------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> LocalSlurm:
        """The users' recipe, ``launch/slurm/local_slurm.sh``, step by step: ``config`` (from
        the hosts' names and addresses), ``munge`` (one daemon on this machine serves every
        host: its socket is in the shared folder), ``controller`` on h0, ``node`` on every
        host (each in its host's namespaces)."""
        env = {**os.environ, "STATE": self.state, "CPUS": str(self.cpus)}
        try:
            self._recipe("config", *(f"{h.name}={h.ip}" for h in self.bed.hosts), env=env)
            self._recipe("munge", env=env)
            self._munged = int(open(os.path.join(self.state, "munge", "munged.pid")).read())
            self.bed.spawn(self.bed.hosts[0].name, ["bash", RECIPE, "controller"], env=env,
                           log=os.path.join(self.state, "slurmctld.out"))
            for h in self.bed.hosts:
                self.bed.spawn(h.name, ["bash", RECIPE, "node", h.name], env=env,
                               log=os.path.join(self.state, f"slurmd-{h.name}.out"))
            self._wait_idle(timeout_s)
        except Exception:
            self.close()
            raise
        return self

    @staticmethod
    def _recipe(*args: str, env: dict) -> None:
        out = subprocess.run(["bash", RECIPE, *args], env=env, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"{RECIPE} {args[0]} failed ({out.returncode}): "
                               f"{(out.stderr or out.stdout).strip()}")

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        want = {h.name for h in self.bed.hosts}
        states = ""
        while time.time() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
            states = out.stdout
            idle = {line.split()[0] for line in states.splitlines()
                    if len(line.split()) == 2 and line.split()[1] == "idle"}
            if want <= idle:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the local SLURM's nodes are not idle after {timeout_s:.0f} s: "
                           f"{states.strip() or 'sinfo answered nothing'}; logs in {self.state}")

    def close(self) -> None:
        """Stops the daemons (the test bed's close stops what runs on its hosts)."""
        for name in ("slurmctld", "slurmd"):
            subprocess.run(["pkill", "-f", f"{name} -D -f {self.conf}"], capture_output=True)
        if self._munged is not None:
            try:
                os.kill(self._munged, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self._munged = None

    # -- commands ---------------------------------------------------------------------------
    def run(self, *argv: str, host: str = "h0", cwd: str | None = None,
            env: dict | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """A SLURM command on ``host`` (default h0, where jobs are submitted)."""
        return self.bed.run(host, list(argv), env={**self.env, **(env or {})}, cwd=cwd,
                            timeout=timeout)

    def sbatch(self, *args: str, cwd: str | None = None, env: dict | None = None) -> int:
        """Submits a batch job; returns its id."""
        out = self.run("sbatch", "--parsable", *args, cwd=cwd, env=env)
        if out.returncode:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def submit_spotlight(self, job_dir: str, run_flags: list[str], spot_hosts: int,
                         config: str, checkout: str, env: dict | None = None,
                         trainer_devices: int = 4) -> tuple[int, int]:
        """The users' launchers submitted as a user does: ``launch/slurm/spotlight.sbatch``
        on the on-demand partition (``run_flags``: the run's extra flags), then, once its head
        has written its address into ``job_dir``, ``spot_hosts.sbatch`` as an array of
        ``spot_hosts`` jobs on the spot partition; returns (trainer id, spot array id)."""
        base = env if env is not None else os.environ
        env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + base["PATH"],
               "WORKDIR": job_dir, "CONFIG": config, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
        shared = self.bed.shared
        trainer = self.sbatch(
            "--partition=ondemand", "--gpus-per-node=0", f"--cpus-per-task={self.cpus}",
            "--time=60", f"--output={shared}/trainer-%j.log", "launch/slurm/spotlight.sbatch",
            f"--cpu_devices={trainer_devices}", *run_flags, cwd=checkout, env=env)
        address = os.path.join(job_dir, "ray_head_address.txt")
        deadline = time.time() + 120
        while not os.path.exists(address):
            if time.time() > deadline:
                raise RuntimeError(f"the trainer job {trainer} wrote no {address} within 120 s; "
                                   f"see {shared}/trainer-{trainer}.log")
            time.sleep(0.5)
        spot = self.sbatch(
            f"--array=0-{spot_hosts - 1}", "--partition=spot", "--gpus-per-node=0",
            "--cpus-per-task=1", "--time=60", f"--output={shared}/spot-%A_%a.log",
            "launch/slurm/spot_hosts.sbatch", cwd=checkout, env=env)
        return trainer, spot

    def job_records(self) -> list[dict]:
        """Every job of the cluster's history: id, name, state, node and restarts (``scontrol
        show job`` of each job id SLURM still remembers)."""
        out = self.run("scontrol", "-o", "show", "job")
        records = []
        for line in out.stdout.splitlines():
            f = dict(tok.partition("=")[::2] for tok in line.split() if "=" in tok)
            if "JobId" in f:
                jid = f["JobId"] + (f"_{f['ArrayTaskId']}" if f.get("ArrayTaskId") else "")
                records.append({"id": jid, "name": f.get("JobName", ""),
                                "state": f.get("JobState", ""), "nodes": f.get("NodeList", ""),
                                "restarts": int(f.get("Restarts", "0") or 0)})
        return records

    def jobs(self) -> list[dict]:
        """Every job SLURM still knows (id, name, state, nodes)."""
        out = self.run("squeue", "-h", "-o", "%i|%j|%T|%N")
        return [dict(zip(("id", "name", "state", "nodes"), line.split("|")))
                for line in out.stdout.splitlines() if line.strip()]

    def job(self, job_id: int) -> dict:
        """``scontrol show job``'s fields of one job (empty once SLURM has forgotten it)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id))
        fields = {}
        for tok in out.stdout.split():
            k, _, v = tok.partition("=")
            fields[k] = v
        return fields
