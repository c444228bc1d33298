"""The network test bed: hosts with their own addresses, port spaces, /tmp and hostnames, TCP
between them over a bridge, the faults a network makes (a partition that heals, a new address),
and nothing left behind, also after a failure."""
import os
import sys
import time

import pytest

from spotlight_jax.cluster import testbed

pytestmark = pytest.mark.skipif(testbed.unavailable() is not None,
                                reason=str(testbed.unavailable()))

PORT = 7811
SERVER = f"""
import socket, socket as s
srv = s.socket(); srv.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", {PORT})); srv.listen()
while True:
    c, _ = srv.accept(); c.sendall(socket.gethostname().encode()); c.close()
"""
CLIENT = """
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    print("reply", c.recv(64).decode())
except OSError as e:
    print("failed", type(e).__name__)
"""


def _ask(bed, host, ip, timeout=2.0):
    out = bed.run(host, [sys.executable, "-c", CLIENT, ip, str(PORT), str(timeout)],
                  timeout=timeout + 20)
    return out.stdout.strip()


def _wait_reply(bed, host, ip, want, within=10.0):
    deadline = time.time() + within
    while True:
        got = _ask(bed, host, ip)
        if got == want or time.time() > deadline:
            return got
        time.sleep(0.2)


def test_hosts_talk_over_the_network_each_with_its_own_ports_tmp_and_name(tmp_path):
    with testbed.TestBed(3, str(tmp_path)) as bed:
        h0, h1, h2 = bed.hosts
        assert [h.ip for h in bed.hosts] == ["10.213.0.1", "10.213.0.2", "10.213.0.3"]
        bed.spawn("h1", [sys.executable, "-c", SERVER])
        assert _wait_reply(bed, "h0", h1.ip, "reply h1") == "reply h1"
        assert _ask(bed, "h2", h1.ip) == "reply h1"
        # h1's port is not on h0's loopback: every host has its own port space
        assert _ask(bed, "h0", "127.0.0.1").startswith("failed")
        # a file in one host's /tmp is not in another's; the shared folder is everyone's
        bed.run("h0", ["sh", "-c", f"echo x > /tmp/only_h0 && echo y > {bed.shared}/both"])
        assert bed.run("h0", ["cat", "/tmp/only_h0"]).stdout == "x\n"
        assert bed.run("h1", ["cat", "/tmp/only_h0"]).returncode != 0
        assert bed.run("h1", ["cat", f"{bed.shared}/both"]).stdout == "y\n"
        assert not os.path.exists("/tmp/only_h0")            # not the machine's /tmp either
        assert bed.run("h2", ["hostname"]).stdout.strip() == "h2"
        # the hosts' names resolve on every host, as a cluster's DNS has them
        resolve = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"
        assert bed.run("h0", [sys.executable, "-c", resolve, "h2"]).stdout.strip() == h2.ip
        assert bed.run("h2", [sys.executable, "-c", resolve, "h2"]).stdout.strip() == h2.ip


def test_a_partition_heals_and_a_host_comes_back_with_a_new_address(tmp_path):
    with testbed.TestBed(2, str(tmp_path)) as bed:
        bed.spawn("h1", [sys.executable, "-c", SERVER])
        assert _wait_reply(bed, "h0", bed.hosts[1].ip, "reply h1") == "reply h1"
        bed.link_down("h1")
        assert _ask(bed, "h0", bed.hosts[1].ip, timeout=1.0).startswith("failed")
        bed.link_up("h1")
        assert _wait_reply(bed, "h0", bed.hosts[1].ip, "reply h1") == "reply h1"
        old = bed.hosts[1].ip
        bed.readdress("h1", "10.213.0.77")
        resolve = "import socket; print(socket.gethostbyname('h1'))"
        assert bed.run("h0", [sys.executable, "-c", resolve]).stdout.strip() == "10.213.0.77"
        assert _wait_reply(bed, "h0", "10.213.0.77", "reply h1") == "reply h1"
        assert _ask(bed, "h0", old, timeout=1.0).startswith("failed")
        with pytest.raises(ValueError, match="not on the test bed's subnet"):
            bed.readdress("h1", "192.168.1.5")
        with pytest.raises(KeyError, match="the hosts are h0, h1"):
            bed.host("h7")


def test_a_cut_between_two_hosts_leaves_the_rest_of_the_network_and_a_kill_empties_a_host(
        tmp_path):
    """cut(h2, h0): the head's host unreachable from h2 only (both still reach h1, h1 both);
    heal restores it. kill_processes stops every process of a host but those it spares."""
    with testbed.TestBed(3, str(tmp_path)) as bed:
        h0, h1, h2 = bed.hosts
        for h in ("h0", "h1"):
            bed.spawn(h, [sys.executable, "-c", SERVER])
        assert _wait_reply(bed, "h2", h0.ip, "reply h0") == "reply h0"
        assert _wait_reply(bed, "h2", h1.ip, "reply h1") == "reply h1"
        bed.cut("h2", "h0")
        assert _ask(bed, "h2", h0.ip, timeout=1.0).startswith("failed")
        assert _ask(bed, "h2", h1.ip) == "reply h1"
        assert _ask(bed, "h1", h0.ip) == "reply h0"
        bed.cut("h2", "h0")                                   # idempotent
        bed.heal("h2", "h0")
        assert _wait_reply(bed, "h2", h0.ip, "reply h0") == "reply h0"
        with pytest.raises(ValueError, match="cannot be cut from itself"):
            bed.cut("h1", "h1")
        spared = bed.spawn("h1", ["sleep", "600"])
        assert bed.kill_processes("h1", spare=("sleep 600",)) >= 1
        assert _ask(bed, "h2", h1.ip, timeout=1.0).startswith("failed")   # its server is gone
        assert spared.poll() is None
        assert bed.kill_processes("h1") >= 1
        assert spared.wait(timeout=10) is not None


def test_nothing_is_left_behind_after_close_a_failure_or_a_killed_run(tmp_path):
    bed = testbed.TestBed(2, str(tmp_path), prefix="tbleft")
    bed.create()
    server = bed.spawn("h0", [sys.executable, "-c", SERVER])
    assert bed.leftovers()
    bed.close()
    assert bed.leftovers() == [] and server.poll() is not None
    bed.close()                                              # idempotent
    with pytest.raises(RuntimeError, match="boom"), testbed.TestBed(2, str(tmp_path)) as failing:
        raise RuntimeError("boom")
    assert failing.leftovers() == []
    # a run killed before it could close: sweep finds what it left by its prefix
    crashed = testbed.TestBed(2, str(tmp_path), prefix="tbcrash").create()
    crashed.spawn("h1", [sys.executable, "-c", SERVER])
    removed = testbed.sweep("tbcrash")
    assert {"tbcrashh0", "tbcrashh1", "tbcrashbr"} <= set(removed)
    assert crashed.leftovers() == []
    crashed.close()
