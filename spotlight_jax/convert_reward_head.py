"""One-time conversion of a reward head published as a torch pickle into safetensors.

The LAION improved aesthetic predictor v2 ships its MLP as ``sac+logos+ava1-l14-linearMSE.pth``;
the ``aesthetic`` reward reads it as safetensors (``learned_rewards.aesthetic_head``). Needs torch,
once, on any machine:

  python -m spotlight_jax.convert_reward_head --aesthetic=sac+logos+ava1-l14-linearMSE.pth \
      --output=aesthetic.safetensors
"""
from __future__ import annotations

from absl import app, flags

from spotlight_jax.rewards.learned import convert_aesthetic


def define_flags() -> None:
    flags.DEFINE_string("aesthetic", None, "The published aesthetic head (.pth).")
    flags.DEFINE_string("output", None, "Where to write it (.safetensors).")
    flags.mark_flags_as_required(["aesthetic", "output"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    convert_aesthetic(f.aesthetic, f.output)
    print(f"wrote {f.output}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
