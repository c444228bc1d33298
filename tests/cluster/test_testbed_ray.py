"""Ray across the network test bed with token authentication: a head on h0 bound to its cluster
address, spot nodes on h1 and h2, a driver with the job's token runs tasks on the spot nodes;
a process without the token, or with a wrong one, is refused."""
import json
import os
import stat
import sys

import pytest

from spotlight_jax.cluster import testbed
from spotlight_jax.cluster.testbed_ray import TestBedRay

pytest.importorskip("ray")
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(testbed.unavailable() is not None,
                                 reason=str(testbed.unavailable()))]

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


def test_ray_across_hosts_with_the_jobs_token_and_none_without_it(tmp_path):
    with testbed.TestBed(3, str(tmp_path / "bed")) as bed:
        ray = TestBedRay(bed, str(tmp_path / "logs"), {**os.environ, "JAX_PLATFORMS": "cpu"})
        ray.start()
        token = ray.env["RAY_AUTH_TOKEN_PATH"]
        assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
        out = ray.run("h0", [sys.executable, "-c", DRIVER, ray.address])
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        # every node registered at its own cluster address, the tasks ran on the spot hosts
        assert got["nodes"] == sorted(h.ip for h in bed.hosts)
        assert got["hosts"] == ["h1", "h2"]
        # from another host: no token, or a wrong one, is refused for its token
        assert ray.refused_without_token("h2") == {"no token": True, "wrong token": True}
