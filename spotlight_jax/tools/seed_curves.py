"""Held-out curves of several runs (e.g. seeds) as mean and min-max band, with a table.

  python -m spotlight_jax.tools.seed_curves --out curve.png RUN_DIR [RUN_DIR ...] [--label NAME]
  python -m spotlight_jax.tools.seed_curves --out c.png --group baseline=A0,A1,A2 \\
      --group explore_sync=B0,B1,B2 [--key reward_mean] [--title T]

``--group NAME=RUN_DIR,RUN_DIR,...`` (repeatable) draws one band per named group in the same
plot; ``--key`` picks another logged metric (e.g. ``reward_mean``, the training rollouts'
reward). The drawing is ``plots.group_curves``; this module is only its command line.
"""
from __future__ import annotations

from absl import app, flags

from spotlight_jax.reporting.plots import group_curves, parse_groups

POSITIONAL_RUN_DIRS = True        # its positional words are run directories (one group)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The command line's flags; defined only when this module runs as the program."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string("out", None, "Path of the plot (.png).", **fv)
    flags.DEFINE_multi_string("group", [], "NAME=RUN_DIR,RUN_DIR,...: one band per named group "
                              "of runs (repeatable).", **fv)
    flags.DEFINE_string("label", "held-out reward", "Name of the positional runs' group.", **fv)
    flags.DEFINE_string("key", "val_reward", "The logged metric to plot.", **fv)
    flags.DEFINE_string("title", "", "Title of the plot.", **fv)
    flags.mark_flag_as_required("out", flag_values=flag_values)


def main(argv):
    fv = flags.FLAGS
    try:
        groups = parse_groups(argv[1:], fv.group, fv.label)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    group_curves(fv.out, groups, fv.key, fv.title)
    print(f"wrote {fv.out}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
