"""The job's Ray token file (``cluster.ray_auth.job_token``): written on first use, mode 0600.

    export RAY_AUTH_MODE=token
    export RAY_AUTH_TOKEN_PATH=$(python -m spotlight_jax.cluster_programs.ray_token --job_dir=DIR)

Prints the file's path; what the SLURM launchers run before any ``ray start`` or driver.
"""
from __future__ import annotations

from absl import app, flags

from spotlight_jax.cluster import ray_auth

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This program's flags (defined only when it runs; see ``spotlight_jax.programs``)."""
    flags.DEFINE_string("job_dir", None, "The job's folder, shared by its hosts.",
                        flag_values=flag_values)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS.job_dir:
        raise app.UsageError("--job_dir=DIR is required (the folder the job's hosts share)")
    try:
        print(ray_auth.job_token(FLAGS.job_dir))
    except (PermissionError, ValueError) as e:
        raise app.UsageError(str(e)) from None


if __name__ == "__main__":
    define_flags()
    app.run(main)
