"""The local Ray instance the Ray spot host tests share per module (JAX on the CPU in every
actor; each actor sets its own device count)."""
import pytest


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="cluster tests need: pip install -e '.[cluster]'")
    from helpers import child_env  # noqa: PLC0415

    # the actors compile as the test process does (its optimisation level: results compared
    # bit for bit), each with its own device count
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": child_env()["XLA_FLAGS"],
           "PYTHONUNBUFFERED": "1"}
    from spotlight_jax.cluster.ray_hosts import start_local  # 127.0.0.1 only

    start_local(num_cpus=4, log_to_driver=False, runtime_env={"env_vars": env})
    yield
    ray.shutdown()
