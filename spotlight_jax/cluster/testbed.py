"""Hosts on a real network on one Linux machine: network namespaces on a bridge.

Every multi-host check on one loopback shares one address, one ``/tmp`` and one port space, so
it cannot find what assumes one machine. A :class:`TestBed` gives each of N hosts

* its own network namespace with one interface (``eth0``, a veth pair into a bridge in the root
  namespace) and its own address on a private subnet, its own loopback and port space;
* its own ``/tmp`` and hostname (each command runs in a private mount and UTS namespace with the
  host's folder bound over ``/tmp``), and the other hosts' names resolvable, as a cluster's
  DNS would have them (the test bed's hosts file bound over ``/etc/hosts``);
* a shared folder standing for the cluster's network file system (what real clusters share: the
  job folder, checkpoints); the software (this Python's environment, the checkout) and the home
  folder stay visible on every host where they lie under ``/tmp``.

Faults a network makes: :meth:`TestBed.link_down` / :meth:`TestBed.link_up` (a partition that
heals, or one that does not: a host that stops answering without dying), :meth:`TestBed.cut` /
:meth:`TestBed.heal` (two hosts that cannot reach each other while both reach the rest: the
head unreachable from one host only), :meth:`TestBed.readdress` (a host back with a new
address) and :meth:`TestBed.kill_processes` (every process of a host SIGKILLed: the VM is
gone). The bridge has no address of its own: the root namespace is not on the test bed's
network, so its traffic goes only between the namespaces it made.

Needs root and iproute2 on Linux (:func:`unavailable` says why not, in one line). Creation and
teardown are idempotent; :meth:`TestBed.close` stops every process it started and removes every
namespace and link, also after a failure (use it as a context manager), and :func:`sweep` removes
what a killed earlier run left behind.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time

SUBNET = "10.213.0.0/24"


@dataclasses.dataclass
class Host:
    """One host of the test bed: its name (also its hostname), address, namespace, the folder
    that is its private ``/tmp``, and the root-side end of its link."""

    name: str
    ip: str
    netns: str
    tmp: str
    link: str


def unavailable() -> str | None:
    """Why this machine cannot build a test bed (None when it can)."""
    if not sys.platform.startswith("linux"):
        return f"the network test bed needs Linux network namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "the network test bed needs root (network namespaces, veth pairs, a bridge)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"the network test bed needs '{tool}' (iproute2, util-linux) on PATH"
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True)
    if check and out.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): "
                           f"{(out.stderr or out.stdout).strip()}")
    return out


def _exists(kind: str, name: str) -> bool:
    if kind == "netns":
        return name in _run("ip", "netns", "list", check=False).stdout.split()
    return _run("ip", "link", "show", name, check=False).returncode == 0


def sweep(prefix: str) -> list[str]:
    """Removes every namespace and link whose name starts with ``prefix`` (what a killed run
    left behind), killing the processes still in those namespaces; returns what it removed."""
    removed = []
    for ns in _run("ip", "netns", "list", check=False).stdout.split():
        if ns.startswith(prefix):
            _kill_namespace(ns)
            _run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(prefix):
            _run("ip", "link", "del", name, check=False)
            removed.append(name)
    return removed


def wait_until(cond, within: float, what: str, every: float = 0.5):
    """``cond()``'s first true value, polled every ``every`` seconds; a TimeoutError naming
    ``what`` when none comes within ``within`` seconds."""
    deadline = time.time() + within
    while True:
        got = cond()
        if got:
            return got
        if time.time() > deadline:
            raise TimeoutError(f"gave up waiting: {what} (not within {within:.0f} s)")
        time.sleep(every)


def _kill_namespace(ns: str) -> None:
    pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _checkout() -> str:
    """The folder this package is imported from (the checkout of an editable install)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _under_tmp(paths) -> list[str]:
    """The real paths among ``paths`` that lie under /tmp, without one inside another."""
    real = sorted({os.path.realpath(p) for p in paths})
    tmp = [p for p in real if p.startswith("/tmp/")]
    return [p for p in tmp if not any(p != q and p.startswith(q + os.sep) for q in tmp)]


def _cgroup_mounts() -> str:
    """Shell commands that mount, under the fresh ``/sys`` a network namespace's commands get,
    the machine's cgroup file systems again (a daemon such as slurmd needs them), each
    allowed to fail (the host then runs without)."""
    cmds = []
    with open("/proc/self/mounts") as f:
        for line in f:
            _, path, fstype, opts = line.split()[:4]
            if not path.startswith("/sys/fs/cgroup"):
                continue
            if fstype == "tmpfs" and path == "/sys/fs/cgroup":
                cmds.append("mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup")
            elif fstype == "cgroup2":
                cmds.append(f"mkdir -p {path} && mount -t cgroup2 cgroup2 {path}")
            elif fstype == "cgroup":
                keep = [o for o in opts.split(",") if o not in ("rw", "ro", "relatime",
                                                                "nosuid", "nodev", "noexec")]
                if any(o.startswith("name=") for o in keep):
                    keep.insert(0, "none")
                cmds.append(f"mkdir -p {path} && mount -t cgroup -o {','.join(keep)} cgroup "
                            f"{path}")
    return "".join(f"{{ {c} ; }} 2>/dev/null ; " for c in cmds)


class TestBed:
    """``hosts`` hosts named ``h0 ..`` on ``subnet`` (addresses .1, .2, ..), their folders under
    ``root`` (``root/<host>/tmp``) and the shared folder ``root/shared``. Namespaces and links
    are named ``prefix`` + host (at most 15 characters, the kernel's limit); the default prefix
    carries this process's id, so concurrent test beds do not collide. ``share``: more folders
    every host sees (e.g. a base checkpoint the run reads), as the cluster's file system would
    hold them."""

    __test__ = False        # not a pytest test class

    def __init__(self, hosts: int, root: str, prefix: str | None = None,
                 subnet: str = SUBNET, share=()):
        why = unavailable()
        if why:
            raise RuntimeError(why)
        if hosts < 1:
            raise ValueError(f"hosts={hosts}: a test bed needs at least one host")
        self.prefix = prefix or f"tb{os.getpid() % 100000}"
        if len(self.prefix) > 9:
            raise ValueError(f"prefix {self.prefix!r}: at most 9 characters (interface names "
                             "are at most 15)")
        net = ipaddress.ip_network(subnet)
        if hosts > net.num_addresses - 2:
            raise ValueError(f"subnet {subnet} has room for {net.num_addresses - 2} hosts, "
                             f"not {hosts}")
        self.subnet, self.root = net, os.path.abspath(root)
        self.shared = os.path.join(self.root, "shared")
        self.hosts_file = os.path.join(self.root, "hosts")
        # what a cluster's hosts share besides the job folder: the software (this Python's
        # environment, the checkout) and the home folder; those under /tmp stay visible on
        # every host (each host's own /tmp would hide them)
        self.visible = _under_tmp([self.shared, sys.prefix, os.getcwd(), _checkout(),
                                   os.path.expanduser("~"), *share])
        self.bridge = f"{self.prefix}br"
        self.hosts = [Host(name=f"h{i}", ip=str(net.network_address + i + 1),
                           netns=f"{self.prefix}h{i}",
                           tmp=os.path.join(self.root, f"h{i}", "tmp"),
                           link=f"{self.prefix}v{i}") for i in range(hosts)]
        self._procs: list[subprocess.Popen] = []
        self._cuts: set[tuple[str, str]] = set()     # (host, address it cannot reach)
        self._up = False

    # -- lifetime ---------------------------------------------------------------------------
    def __enter__(self) -> TestBed:
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self) -> TestBed:
        """Makes the bridge, the namespaces and their links (idempotent: what exists stays)."""
        os.makedirs(self.shared, exist_ok=True)
        self._write_hosts_file()
        try:
            if not _exists("link", self.bridge):
                _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "link", "set", self.bridge, "up")
            for h in self.hosts:
                self._make_host(h)
        except Exception:
            self.close()
            raise
        self._up = True
        return self

    def _make_host(self, h: Host) -> None:
        os.makedirs(h.tmp, exist_ok=True)
        if not _exists("netns", h.netns):
            _run("ip", "netns", "add", h.netns)
        if not _exists("link", h.link):
            _run("ip", "link", "add", h.link, "type", "veth", "peer", "name", "eth0",
                 "netns", h.netns)
        _run("ip", "link", "set", h.link, "master", self.bridge)
        _run("ip", "link", "set", h.link, "up")
        ns = ("ip", "netns", "exec", h.netns)
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run(*ns, "ip", "addr", "flush", "dev", "eth0")
        _run(*ns, "ip", "addr", "add", f"{h.ip}/{self.subnet.prefixlen}", "dev", "eth0")
        _run(*ns, "ip", "link", "set", "eth0", "up")

    def close(self) -> None:
        """Stops every process started on the hosts and removes every namespace and link
        (idempotent; safe after a failed :meth:`create`)."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        for h in self.hosts:
            if _exists("netns", h.netns):
                _kill_namespace(h.netns)
                _run("ip", "netns", "del", h.netns, check=False)
            if _exists("link", h.link):
                _run("ip", "link", "del", h.link, check=False)
        if _exists("link", self.bridge):
            _run("ip", "link", "del", self.bridge, check=False)
        self._cuts.clear()
        self._up = False

    def leftovers(self) -> list[str]:
        """Namespaces and links of this test bed that exist (empty after :meth:`close`)."""
        return ([h.netns for h in self.hosts if _exists("netns", h.netns)]
                + [h.link for h in self.hosts if _exists("link", h.link)]
                + ([self.bridge] if _exists("link", self.bridge) else []))

    # -- processes --------------------------------------------------------------------------
    def host(self, name_or_index) -> Host:
        if isinstance(name_or_index, int):
            return self.hosts[name_or_index]
        for h in self.hosts:
            if h.name == name_or_index:
                return h
        raise KeyError(f"no host {name_or_index!r}; the hosts are "
                       f"{', '.join(h.name for h in self.hosts)}")

    def command(self, host, argv: list[str]) -> list[str]:
        """``argv`` as it runs on ``host``: in its network namespace, with its own mount and
        UTS namespaces, its folder bound over ``/tmp`` and its hostname set."""
        h = self.host(host)
        setup = (f"{_cgroup_mounts()}mount --bind {self.hosts_file} /etc/hosts && "
                 f"mount --rbind {h.tmp} /tmp && hostname {h.name} && exec \"$@\"")
        for path in self.visible:           # under /tmp: bound into the host's /tmp as well
            inner = os.path.join(h.tmp, os.path.relpath(path, "/tmp"))
            os.makedirs(inner, exist_ok=True)
            setup = f"mount --bind {path} {inner} && " + setup
        return ["ip", "netns", "exec", h.netns, "unshare", "--mount", "--uts",
                "--propagation", "private", "sh", "-c", setup, "sh", *argv]

    def spawn(self, host, argv: list[str], env: dict | None = None, log: str | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        """Starts ``argv`` on ``host`` in its own process group (stopped by :meth:`close`);
        stdout and stderr go to ``log`` (default: discarded)."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            p = subprocess.Popen(self.command(host, argv), env=env, cwd=cwd, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log:
                out.close()
        self._procs.append(p)
        return p

    def run(self, host, argv: list[str], env: dict | None = None, timeout: float = 60.0,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        """Runs ``argv`` on ``host`` to completion; returns its output."""
        return subprocess.run(self.command(host, argv), env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)

    # -- faults -----------------------------------------------------------------------------
    def link_down(self, host) -> float:
        """Cuts ``host`` off the network (its processes keep running); returns the time."""
        _run("ip", "link", "set", self.host(host).link, "down")
        return time.time()

    def link_up(self, host) -> float:
        """Reconnects ``host`` (the partition heals); returns the time."""
        _run("ip", "link", "set", self.host(host).link, "up")
        return time.time()

    def cut(self, a, b) -> float:
        """Hosts ``a`` and ``b`` stop reaching each other (packets between them are dropped:
        a blackhole route for the other's address in each namespace) while both still reach
        every other host; returns the time."""
        ha, hb = self.host(a), self.host(b)
        if ha is hb:
            raise ValueError(f"cut({ha.name!r}, {hb.name!r}): a host cannot be cut from itself")
        for h, other in ((ha, hb), (hb, ha)):
            if (h.name, other.ip) not in self._cuts:
                _run("ip", "netns", "exec", h.netns, "ip", "route", "add", "blackhole",
                     f"{other.ip}/32")
                self._cuts.add((h.name, other.ip))
        return time.time()

    def heal(self, a, b) -> float:
        """Undoes :meth:`cut` between ``a`` and ``b`` (idempotent); returns the time."""
        ha, hb = self.host(a), self.host(b)
        for h, other in ((ha, hb), (hb, ha)):
            if (h.name, other.ip) in self._cuts:
                _run("ip", "netns", "exec", h.netns, "ip", "route", "del", "blackhole",
                     f"{other.ip}/32", check=False)
                self._cuts.discard((h.name, other.ip))
        return time.time()

    def kill_processes(self, host, spare: tuple[str, ...] = ()) -> int:
        """SIGKILLs every process on ``host`` (the VM is gone; its namespace and link stay, so
        a new node can start there) but those whose command line contains one of ``spare``
        (e.g. a scheduler's daemons); returns how many it killed."""
        return self.signal(host, signal.SIGKILL, spare=spare)

    def signal(self, host, sig: int, only: tuple[str, ...] = (), spare: tuple[str, ...] = ()
               ) -> int:
        """Sends ``sig`` to the processes on ``host`` whose command line contains one of
        ``only`` (every process when empty) and none of ``spare``; returns how many."""
        pids = _run("ip", "netns", "pids", self.host(host).netns, check=False).stdout.split()
        hit = 0
        for pid in pids:
            try:
                if only or spare:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                    if (only and not any(s in cmdline for s in only)) or any(
                            s in cmdline for s in spare):
                        continue
                os.kill(int(pid), sig)
                hit += 1
            except (OSError, ValueError):
                pass                    # gone meanwhile
        return hit

    def readdress(self, host, ip: str) -> None:
        """Gives ``host`` a new address on the subnet (a node back with a new address)."""
        h = self.host(host)
        if ipaddress.ip_address(ip) not in self.subnet:
            raise ValueError(f"{ip} is not on the test bed's subnet {self.subnet}")
        if any(o.ip == ip for o in self.hosts if o is not h):
            raise ValueError(f"{ip} is already {next(o.name for o in self.hosts if o.ip == ip)}'s")
        ns = ("ip", "netns", "exec", h.netns)
        _run(*ns, "ip", "addr", "flush", "dev", "eth0")
        _run(*ns, "ip", "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
        h.ip = ip
        self._write_hosts_file()

    def _write_hosts_file(self) -> None:
        """The hosts' names and addresses, rewritten in place (a bound file keeps its inode)."""
        with open(self.hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n"
                    + "".join(f"{h.ip} {h.name}\n" for h in self.hosts))

    def describe(self) -> list[dict]:
        """Each host's name and address (for a run's record)."""
        return [{"name": h.name, "ip": h.ip} for h in self.hosts]
