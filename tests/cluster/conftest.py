"""The local Ray instance the Ray spot host tests share per module (JAX on the CPU in every
actor; each actor sets its own device count)."""
import pytest


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="cluster tests need: pip install -e '.[cluster]'")
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONUNBUFFERED": "1"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env})
    yield
    ray.shutdown()
