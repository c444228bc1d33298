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
    _flags += " --xla_force_host_platform_device_count=8"
# The tests' programs are small and run once or twice: compiling them is most of the suite's
# time, and LLVM's optimisation passes most of that. Unoptimised machine code computes the same
# HLO program (the XLA passes still run), equal to rounding; a run that sets the level keeps it.
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def base():
    """``(graphdef, state)`` of the micro model of the micro run config (tests/helpers.py)."""
    from helpers import micro_config  # noqa: PLC0415 - after the device count is set

    from spotlight_jax.config import model_config  # noqa: PLC0415
    from spotlight_jax.models.factory import create_model
    return create_model(model_config(micro_config(1)))


def pytest_configure(config):
    assert len(jax.devices()) == 8, f"expected 8 emulated CPU devices, got {jax.devices()}"


@pytest.fixture(scope="session", autouse=True)
def _shared_compilation_cache(tmp_path_factory):
    """One persistent compilation cache for the session: a program that several tests compile
    (every run of the micro config builds its own jitted closures of the same computations)
    compiles once and loads from the cache after (same HLO, same executable)."""
    if os.environ.get("SPOTLIGHT_TEST_COMPILE_CACHE", "1") == "0" or \
            jax.config.jax_compilation_cache_dir:
        yield
        return
    from spotlight_jax.elastic.exec_cache import enable_persistent_cache  # noqa: PLC0415
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):       # the workers' base temps share a parent
        root = root.parent
    path = enable_persistent_cache(root / "xla_cache")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)     # child processes share it
    yield


# -- the tests that skip, for .ci/run to run again once the extras are installed ------------------
def _log_skipped(nodeid: str) -> None:
    path = os.environ.get("SPOTLIGHT_SKIPPED_LOG")
    if path:
        with open(path, "a") as f:
            f.write(nodeid + "\n")


def pytest_runtest_logreport(report):
    """With ``SPOTLIGHT_SKIPPED_LOG`` set, each test that skips is appended to that file."""
    if report.skipped:
        _log_skipped(report.nodeid)


def pytest_collectreport(report):
    """A test module skipped whole at collection (``pytest.importorskip`` at its top) too."""
    if report.skipped:
        _log_skipped(report.nodeid)
