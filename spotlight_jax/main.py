"""The command line (an entry point: flags live only in entry points).

  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/spotlight
  python -m spotlight_jax.main --config=configs/qwen_image.py --workdir=/tmp/q --dry_run
  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/s --config.mode=spotlight

One process of a multi-process trainer job (``jax.distributed``; every process runs the same
command with its own ``--process_id``; process 0 runs the runner, the others follow it):

  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/job \\
      --coordinator=127.0.0.1:12355 --num_processes=2 --process_id=0 --cpu_devices=2
"""
import contextlib
import logging as pylogging
import sys

from absl import app, flags, logging
from ml_collections import config_flags

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The command line's flags (defined only when it runs as the program, so a test can parse a
    documented command with a fresh ``FlagValues``; ``--config`` and ``--workdir`` are marked
    required there)."""
    fv = {"flag_values": flag_values}
    config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                    lock_config=True, **fv)
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and plots.", **fv)
    flags.DEFINE_bool("dry_run", False, "Print sizes and shardings; allocate nothing.", **fv)
    flags.DEFINE_bool("distributed", False, "Run as one process of a jax.distributed trainer "
                      "job (auto-detected on SLURM / Kubernetes / MPI unless --coordinator, "
                      "--num_processes, --process_id say).", **fv)
    flags.DEFINE_string("coordinator", None, "Trainer job: host:port of process 0.", **fv)
    flags.DEFINE_integer("num_processes", None, "Trainer job: processes in it.", **fv)
    flags.DEFINE_integer("process_id", None, "Trainer job: this process's index.", **fv)
    flags.DEFINE_integer("cpu_devices", 0, "Trainer job: emulated CPU devices per process (0 = "
                         "as the backend has them).", **fv)
    flags.DEFINE_bool("debug", False, "Show the traceback of a config error (otherwise one "
                      "line 'error: ...' and exit code 2).", **fv)


def _fail(message) -> None:
    """One line ``error: ...`` on stderr and exit code 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    sys.exit(2)


def _message(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


@contextlib.contextmanager
def _config_errors():
    """A bad config value ends the command with one line on stderr and exit code 2, before any
    work (``--debug`` shows the traceback instead)."""
    from spotlight_jax.config import ConfigError  # noqa: PLC0415
    try:
        yield
    except (ConfigError, KeyError, FileNotFoundError) as e:
        if FLAGS.debug:
            raise
        _fail(_message(e))


def _parse_flags(argv):
    """absl's flag parsing, except that a ``--config.*`` override of a field the config does not
    have is one line and exit code 2 (absl reports bad flag values itself)."""
    try:
        return app.parse_flags_with_usage(argv)
    except (AttributeError, KeyError) as e:
        if "--debug" in argv:
            raise
        while e.args and isinstance(e.args[0], Exception):     # ml_collections wraps KeyErrors
            e = e.args[0]
        key, *hint = _message(e).split("\n")
        key = key.strip("'\"")
        given = [a.split("=")[0] for a in argv
                 if a.startswith("--config.") and key in a.split("=")[0].split(".")]
        flag = given[0] if given else "a --config.* override"
        _fail(f"{flag}: the config has no field {key!r}" + (f" ({' '.join(hint)})" if hint
                                                              else ""))


def _loaded_config():
    """``--config``'s ConfigDict; a file that does not load is one line naming the cause."""
    config = FLAGS.config
    try:
        config.get("mode")              # a file that failed to load raises on first use
    except OSError as e:
        if FLAGS.debug:
            raise
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        last = [line.strip() for line in str(cause).splitlines() if line.strip()][-1]
        _fail(f"--config: {last} (give a config file such as --config=configs/tiny.py)")
    return config


class _ProjectInfoOnly(pylogging.Filter):
    """At the default verbosity, INFO lines come from this project only (Orbax and friends log
    every checkpoint step at INFO); warnings and errors always pass. ``--verbosity=1`` shows all."""

    def filter(self, record):
        return (record.levelno >= pylogging.WARNING or "spotlight_jax" in record.pathname
                or logging.get_verbosity() > logging.INFO)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.get_absl_handler().addFilter(_ProjectInfoOnly())
    config = _loaded_config()
    from spotlight_jax.config import RunSpec  # noqa: PLC0415
    with _config_errors():
        # the one place the ConfigDict is read: every section validated and built, before any
        # backend use
        spec = RunSpec.from_config(config)
    if FLAGS.distributed or FLAGS.num_processes is not None or FLAGS.coordinator:
        return _trainer_job(spec)      # its rewards load once jax.distributed has started
    import jax  # noqa: PLC0415 - the device count must be set before any backend use

    with _config_errors():
        if spec.cpu_device_count():
            jax.config.update("jax_num_cpu_devices", spec.cpu_device_count())
        # the rewards that need building (a server's client, learned rewards: JAX arrays) load
        # once the device count is set, before any work, so that a bad one stops the command
        spec.register_rewards()
        spec.check_devices(jax.devices())
    if spec.compilation_cache_dir:
        from spotlight_jax.elastic.exec_cache import enable_persistent_cache  # noqa: PLC0415
        enable_persistent_cache(spec.compilation_cache_dir)
    if FLAGS.dry_run:
        from spotlight_jax.runner.dry_run import dry_run  # noqa: PLC0415
        print(dry_run(spec))
        return
    from spotlight_jax import train  # noqa: PLC0415
    logging.info("config:\n%s", config)
    train.train_and_evaluate(spec, FLAGS.workdir)


def _trainer_job(spec):
    """One process of the trainer's ``jax.distributed`` job; process 0 prints one JSON line with
    the run's iterations and held-out rewards."""
    import json  # noqa: PLC0415

    import jax  # noqa: PLC0415

    from spotlight_jax import train  # noqa: PLC0415
    from spotlight_jax.cluster.distributed import initialize  # noqa: PLC0415
    initialize(FLAGS.coordinator, FLAGS.num_processes, FLAGS.process_id,
               cpu_devices=FLAGS.cpu_devices)
    history = train.run_trainer_job(spec, FLAGS.workdir, progress=jax.process_index() == 0)
    if history is not None:
        evals = [h for h in history if "val_reward" in h]
        print(json.dumps({"process": 0, "iterations": history[-1]["iteration"],
                          "val_reward": [h["val_reward"] for h in evals]}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main, flags_parser=_parse_flags)
