"""Ray across the network test bed with token authentication: a head on h0 bound to its cluster
address, spot nodes on h1 and h2, a driver with the job's token runs tasks on the spot nodes;
a process without the token, or with a wrong one, is refused."""
import json
import os
import stat
import sys
import time

import pytest

from spotlight_jax.cluster import ray_auth, testbed

pytest.importorskip("ray")
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(testbed.unavailable() is not None,
                                 reason=str(testbed.unavailable()))]

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
PORT = 6379
DRIVER = """
import json, socket, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(resources={"spot_node": 1}, num_cpus=0)
def where():
    time.sleep(1.0)
    return socket.gethostname()

print(json.dumps({"nodes": sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]),
                  "hosts": sorted(set(ray.get([where.remote() for _ in range(6)])))}))
"""


def _wait_for(path, text, within=120.0):
    deadline = time.time() + within
    while time.time() < deadline:
        if os.path.exists(path) and text in open(path, errors="replace").read():
            return True
        time.sleep(0.5)
    return False


def test_ray_across_hosts_with_the_jobs_token_and_none_without_it(tmp_path):
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed:
        token = ray_auth.job_token(os.path.join(bed.shared, "job"))
        assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
        env = {**os.environ, **ray_auth.token_env(token), "JAX_PLATFORMS": "cpu"}
        h0 = bed.hosts[0]
        head = f"{h0.ip}:{PORT}"
        logs = {h.name: str(tmp_path / f"{h.name}.log") for h in bed.hosts}
        bed.spawn("h0", ray_auth.node_command(RAY, h0.ip, "--head", f"--port={PORT}",
                                              "--num-cpus=1"), env=env, log=logs["h0"])
        assert _wait_for(logs["h0"], "Ray runtime started"), open(logs["h0"]).read()[-2000:]
        for h in bed.hosts[1:]:
            bed.spawn(h.name, ray_auth.node_command(RAY, h.ip, f"--address={head}",
                                                    "--num-cpus=1",
                                                    '--resources={"spot_node": 1}'),
                      env=env, log=logs[h.name])
            assert _wait_for(logs[h.name], "Ray runtime started"), open(logs[h.name]).read()
        out = bed.run("h0", [sys.executable, "-c", DRIVER, head], env=env, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        # every node registered at its own cluster address, the tasks ran on the spot hosts
        assert got["nodes"] == sorted(h.ip for h in bed.hosts)
        assert got["hosts"] == ["h1", "h2"]
        # from another host: no token, or a wrong one, is refused
        no_token = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
        wrong = {**no_token, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
        for name, e in (("no token", {**no_token, "RAY_AUTH_MODE": "disabled"}),
                        ("wrong token", wrong)):
            out = bed.run("h2", [sys.executable, "-c", DRIVER, head], env=e, timeout=180)
            assert out.returncode != 0, name
            assert "token" in out.stderr.lower(), (name, out.stderr[-2000:])
