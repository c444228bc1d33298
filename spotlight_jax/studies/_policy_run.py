"""The run a study samples a policy with: the base, or a finished run's newest checkpoint."""
from __future__ import annotations

import tempfile


def policy_run(spec, graphdef, base, workdir: str | None = None):
    """``runner.build_run`` of ``spec`` over ``(graphdef, base)``; with ``workdir`` (a run's
    workdir) restored to its newest checkpoint, a FileNotFoundError naming the fix when there
    is none. Without it the run lives in a temporary directory."""
    from spotlight_jax.runner import build_run, checkpointing  # noqa: PLC0415 - JAX late

    run = build_run(spec, workdir or tempfile.mkdtemp(), graphdef, base)
    if workdir and not checkpointing.restore(run):
        raise FileNotFoundError(f"--workdir={workdir}: no checkpoint to restore; give a run's "
                                "workdir")
    return run
