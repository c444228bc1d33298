"""Which code produced a result: the git commit of this checkout, and whether it had changes.

Recorded in every run's ``phases.json`` so that a comparison can refuse to divide runs made by
different code (``studies.compare_grid``)."""
from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code_version() -> dict:
    """``{"commit": sha or None, "dirty": bool or None}``: the checkout's HEAD and whether a
    tracked file under ``spotlight_jax/`` or ``configs/`` differs from it (None outside git,
    e.g. an installed wheel)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no", "--", "spotlight_jax",
                  "configs")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}
