"""What the benchmarks, studies and cluster programs share: the emulated-device set-up, the
repository's paths, the ``--config`` flag and printing a result (``emit``).

A benchmark, study or cluster program is a program (``python -m spotlight_jax.bench.<name>``,
``python -m spotlight_jax.studies.<name>``, ``python -m spotlight_jax.cluster_programs.<name>``),
so unlike library code it may set JAX's global configuration, but only from its ``main``:
importing one (tests read their tables and helpers) changes nothing. Each one's flags are
defined by its ``define_flags()``, which runs only when the module is the program
(``if __name__ == "__main__"``), so programs that share flag names (``--out``, ``--seeds``,
``--config``) can be imported together, and with ``spotlight_jax.main``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY_CONFIG = str(REPO / "configs" / "tiny.py")


def emulate_devices(n: int, *, cpu: bool = True) -> None:
    """Give JAX ``n`` emulated host devices; call first in ``main``, before any JAX computation.

    With ``cpu`` (the default) JAX runs on the CPU unless ``JAX_PLATFORMS`` already says
    otherwise. The settings go to the environment too (``JAX_PLATFORMS``, ``XLA_FLAGS``), so a
    child process the benchmark starts sees the same devices. Without ``cpu`` only the CPU
    backend's device count is set (an accelerator, if any, stays the default backend). When a
    backend is already running (e.g. under pytest) its devices are left as they are: callers
    check the device count they need.
    """
    import jax  # noqa: PLC0415 - reads JAX_PLATFORMS at import; jax.config below covers that

    if cpu and "JAX_PLATFORMS" not in os.environ:
        os.environ["JAX_PLATFORMS"] = "cpu"
        jax.config.update("jax_platforms", "cpu")
    flag = "--xla_force_host_platform_device_count"
    if cpu and flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}={n}".strip()
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # a backend is already initialised: its device count stays
        pass


def define_config_flag(flag_values):
    """``--config`` (a config file, the tiny one by default) with ``--config.x=y`` overrides, as
    ``spotlight_jax.main`` has it; returns absl's holder of the loaded config."""
    from ml_collections import config_flags  # noqa: PLC0415 - only programs that take a config

    return config_flags.DEFINE_config_file(
        "config", TINY_CONFIG, "Config file (configs/*.py); --config.x=y overrides.",
        lock_config=True, flag_values=flag_values)


def emit(result: dict, text: str, out: str | None) -> None:
    """Print a program's ``text`` report and, when ``out`` names a file, write ``result`` there
    as JSON (its folder made if missing)."""
    print(text)
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
