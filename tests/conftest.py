"""Test set-up: 8 emulated CPU devices, set before any JAX backend use.

Multi-device tests must run (never silently skip) on CPU CI, so the device count is forced here,
at the very top, before anything imports jax.
"""
import os
import sys

# Test modules live in folders mirroring the package; they share tests/helpers.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def base():
    """``(graphdef, state)`` of the micro model of the micro run config (tests/helpers.py)."""
    from helpers import micro_config  # noqa: PLC0415 - after the device count is set

    from spotlight_jax.builders import create_model, model_config  # noqa: PLC0415
    return create_model(model_config(micro_config(1)))


def pytest_configure(config):
    assert len(jax.devices()) == 8, f"expected 8 emulated CPU devices, got {jax.devices()}"
