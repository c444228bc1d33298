"""One-time conversion of a reward head published as a torch pickle into safetensors.

The LAION improved aesthetic predictor v2 ships its MLP as ``sac+logos+ava1-l14-linearMSE.pth``;
the ``aesthetic`` reward reads it as safetensors (``learned_rewards.aesthetic_head``). Needs torch,
once, on any machine:

  python -m spotlight_jax.tools.convert_reward_head --aesthetic=sac+logos+ava1-l14-linearMSE.pth \
      --output=aesthetic.safetensors
"""
from __future__ import annotations

from absl import app, flags

from spotlight_jax.rewards.learned import convert_aesthetic, convert_open_clip


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("aesthetic", None, "The published aesthetic head (.pth).", **fv)
    flags.DEFINE_string("open_clip", None, "A published open_clip checkpoint (.pt), e.g. "
                        "HPSv2.1.", **fv)
    flags.DEFINE_string("output", None, "Where to write it (.safetensors).", **fv)
    flags.mark_flags_as_required(["output"], **fv)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    if bool(f.aesthetic) == bool(f.open_clip):
        raise app.UsageError("give one of --aesthetic or --open_clip")
    (convert_aesthetic if f.aesthetic else convert_open_clip)(f.aesthetic or f.open_clip,
                                                              f.output)
    print(f"wrote {f.output}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
