"""One update of the objective's trainer by a multi-process ``jax.distributed`` job, on a saved
batch: the check that a job of several processes updates exactly as one process does.

    python -m spotlight_jax.cluster_programs.update_check --coordinator=127.0.0.1:12355 \\
        --num_processes=2 --process_id=0 --cpu_devices=2 --config=configs/tiny.py \\
        --base=BASE_DIR --batch=batch.npz --out=params.npz

Every process runs the same command with its own ``--process_id``. Process 0 reads the batch and
broadcasts it; it writes the updated trainable parameters to ``--out`` and every process prints
one JSON line ``{"process": i, ...metrics}``.
"""
from __future__ import annotations

import json
import logging

from absl import app, flags

from spotlight_jax import programs
from spotlight_jax.config import RunSpec

FLAGS = flags.FLAGS
_CONFIG = None


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """This program's flags (defined only when it runs; see ``spotlight_jax.programs``)."""
    global _CONFIG
    fv = dict(flag_values=flag_values)
    _CONFIG = programs.define_config_flag(flag_values)
    flags.DEFINE_string("coordinator", None, "host:port of process 0 (default: auto-detect).",
                        **fv)
    flags.DEFINE_integer("num_processes", None, "Processes in the job.", **fv)
    flags.DEFINE_integer("process_id", None, "This process's index.", **fv)
    flags.DEFINE_integer("cpu_devices", 0, "Emulated CPU devices per process (0 = as is).", **fv)
    flags.DEFINE_string("base", None, "Base checkpoint directory.", required=True, **fv)
    flags.DEFINE_string("batch", None, ".npz rollout batch (read by process 0).", required=True,
                        **fv)
    flags.DEFINE_string("out", None, ".npz of the updated trainable parameters.", **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax  # noqa: PLC0415 - the job is joined before any backend use

    from spotlight_jax.cluster.distributed import initialize  # noqa: PLC0415
    from spotlight_jax.cluster.job import update_from_files  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO)
    initialize(FLAGS.coordinator, FLAGS.num_processes, FLAGS.process_id,
               cpu_devices=FLAGS.cpu_devices)
    spec = RunSpec.from_config(_CONFIG.value)
    metrics = update_from_files(spec, FLAGS.base, FLAGS.batch, FLAGS.out)
    print(json.dumps({"process": jax.process_index(), **metrics}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    define_flags()
    app.run(main)
