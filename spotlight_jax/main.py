"""Command line: the only module that defines flags.

  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/spotlight
  python -m spotlight_jax.main --config=configs/qwen_image_like.py --workdir=/tmp/q --dry_run
  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/s --config.mode=spotlight
"""
import logging as pylogging

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and plots.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print sizes and shardings; allocate nothing.")
flags.mark_flags_as_required(["config", "workdir"])


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
    config = _CONFIG.value
    import jax  # noqa: PLC0415 - the device count must be set before any backend use

    from spotlight_jax.builders import cpu_device_count  # noqa: PLC0415
    if cpu_device_count(config):
        jax.config.update("jax_num_cpu_devices", cpu_device_count(config))
    if config.get("compilation_cache_dir"):
        import os  # noqa: PLC0415

        from spotlight_jax.elastic.exec_cache import enable_persistent_cache  # noqa: PLC0415
        enable_persistent_cache(os.path.expanduser(config.compilation_cache_dir))
    from spotlight_jax import train  # noqa: PLC0415
    if _DRY_RUN.value:
        print(train.dry_run(config))
        return
    logging.info("config:\n%s", config)
    train.train_and_evaluate(config, _WORKDIR.value)


if __name__ == "__main__":
    app.run(main)
