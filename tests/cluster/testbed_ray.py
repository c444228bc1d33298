"""A Ray cluster on the network test bed, for the tests: the head on h0 at its cluster address,
a `spot_node` node on every other host, every process with the job's token."""
import os
import sys
import time

from spotlight_jax.cluster import ray_auth

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
PORT = 6379


def wait_for(path, text, within=120.0):
    """Whether ``text`` appears in the file ``path`` within ``within`` seconds."""
    deadline = time.time() + within
    while time.time() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        time.sleep(0.5)
    return False


def start_ray(bed, tmp_path, env):
    """The head and the spot nodes; returns ``(head address, the environment with the job's
    token, node processes by host)``."""
    token = ray_auth.job_token(os.path.join(bed.shared, "job"))
    ray_env = {**env, **ray_auth.token_env(token)}
    h0 = bed.hosts[0]
    head = f"{h0.ip}:{PORT}"
    log = str(tmp_path / "ray_h0.log")
    bed.spawn("h0", ray_auth.node_command(RAY, h0.ip, "--head", f"--port={PORT}",
                                          "--num-cpus=1"), env=ray_env, log=log)
    assert wait_for(log, "Ray runtime started"), open(log).read()[-2000:]
    nodes = {h.name: start_node(bed, h, head, ray_env, str(tmp_path / f"ray_{h.name}.log"))
             for h in bed.hosts[1:]}
    return head, ray_env, nodes


def start_node(bed, h, head, ray_env, log):
    """A `spot_node` node on host ``h`` joining ``head``; returns its process."""
    proc = bed.spawn(h.name, ray_auth.node_command(RAY, h.ip, f"--address={head}",
                                                   "--num-cpus=1",
                                                   '--resources={"spot_node": 1}'),
                     env=ray_env, log=log)
    assert wait_for(log, "Ray runtime started"), open(log).read()
    return proc
