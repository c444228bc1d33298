"""Every Ray instance the project starts itself listens on 127.0.0.1 only (an unauthenticated
Ray head is code execution for whoever reaches its ports): the listening sockets of all the
processes of such an instance, read with psutil, are on the loopback address. Both ways the
project starts one: ``ray start`` node processes (the chaos harness's head and a worker node, as
launch/local_cluster.sh starts its head) joined by a driver, and ``ray.init`` in this process
(``connect``'s local instance, the cluster tests' fixture)."""
import socket

import pytest

ray = pytest.importorskip("ray", reason="cluster tests need: pip install -e '.[cluster]'")
psutil = pytest.importorskip("psutil", reason="cluster tests need: pip install -e '.[cluster]'")
from spotlight_jax.cluster import ray_hosts  # noqa: E402
from spotlight_jax.studies.ray_chaos import LocalCluster  # noqa: E402

pytestmark = pytest.mark.cluster

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def _sockets() -> list[tuple[str, int, str, int]]:
    """(address, port, process name, pid) of every listening TCP and bound UDP socket of this
    process and its descendants (the Ray processes a test starts, none of another run's)."""
    root = psutil.Process()
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            name, conns = p.name(), p.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for c in conns:
            if (c.status == psutil.CONN_LISTEN if c.type == socket.SOCK_STREAM else c.laddr):
                out.append((c.laddr.ip, c.laddr.port, name, p.pid))
    return out


def _check(socks, gcs_port: int, raylets: int):
    """The check can fail: it must find the GCS and every raylet listening, and every socket
    on the loopback address."""
    assert (gcs_port, "gcs_server") in {(port, name) for _, port, name, _ in socks}, socks
    assert len({pid for _, _, name, pid in socks if name == "raylet"}) == raylets, socks
    outside = [s for s in socks if s[0] not in LOOPBACK]
    assert not outside, f"listening beyond this machine: {outside}"


@ray.remote(resources={"spot_node": 1}, num_cpus=0)
def _node_ip():
    return ray.util.get_node_ip_address()


def test_local_instance_started_in_process_listens_on_loopback_only():
    # first in the file: the next test's `ray start` processes are gone only some time after
    # it stops them, and an in-process instance started then may not get its GCS up
    ray_hosts.start_local(num_cpus=1, resources={"spot_node": 1}, log_to_driver=False)
    try:
        assert ray.get(_node_ip.remote(), timeout=300) == ray_hosts.LOOPBACK
        gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
        socks = _sockets()
    finally:
        ray.shutdown()
    _check(socks, gcs_port, raylets=1)


def test_ray_start_head_node_and_driver_listen_on_loopback_only(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")       # as the harness's nodes
    cluster = LocalCluster(str(tmp_path))
    try:
        cluster.add_node("spot0")
        ray_hosts.join(cluster.address, log_to_driver=False)
        try:
            assert ray.get(_node_ip.remote(), timeout=300) == ray_hosts.LOOPBACK
            assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {
                ray_hosts.LOOPBACK}
            socks = _sockets()
        finally:
            ray.shutdown()
    finally:
        cluster.close()
    _check(socks, cluster.port, raylets=2)


def test_ray_start_command_decides_the_node_ip_and_the_dashboard():
    head = ray_hosts.ray_start_command(["--head", "--node-ip-address=10.0.0.1"])
    assert head[-4:] == ["--node-ip-address=127.0.0.1", "--disable-usage-stats",
                         "--include-dashboard=false", "--dashboard-host=127.0.0.1"]
    node = ray_hosts.ray_start_command(["--address=127.0.0.1:6379"])
    assert node[-2:] == ["--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    assert not any("dashboard" in a for a in node[3:])
