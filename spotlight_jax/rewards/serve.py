"""Serve a registered reward over HTTP (the command line of :mod:`spotlight_jax.rewards.server`).

  python -m spotlight_jax.rewards.serve --reward=geneval_lite --port=18085

then train with ``--config.rl.reward=remote --config.remote_reward.url=http://HOST:18085``
(docs/rewards_remote.md). It binds 127.0.0.1 unless ``--host`` says otherwise, speaks the
``json`` protocol (plus Flow-GRPO's pickle protocol with ``--allow_pickle``, for testing that
client only: unpickling a request runs the sender's code), logs one line per request, and stops
cleanly on SIGTERM or Ctrl-C.
"""
from __future__ import annotations

import signal
import threading

from absl import app, flags, logging

from spotlight_jax import rewards
from spotlight_jax.rewards.server import RewardServer

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The server's flags (defined only when it runs as the program)."""
    fv = {"flag_values": flag_values}
    flags.DEFINE_string("reward", None, "registered reward to serve (e.g. geneval_lite)", **fv)
    flags.DEFINE_string("host", "127.0.0.1", "address to bind (0.0.0.0 = every interface)", **fv)
    flags.DEFINE_integer("port", 18085, "port to bind (0 = a free one, printed at start)", **fv)
    flags.DEFINE_bool("allow_pickle", False, "also serve Flow-GRPO's pickle protocol (trusts "
                      "every client: unpickling runs the sender's code)", **fv)


def check_reward(name: str) -> None:
    """A UsageError naming ``--reward`` when ``name`` is not a registered reward."""
    if name not in rewards.names():
        raise app.UsageError(f"--reward={name!r}: unknown reward; registered rewards: "
                             f"{', '.join(rewards.names())}")


def main(argv):
    del argv
    check_reward(FLAGS.reward)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    server = RewardServer(FLAGS.reward, FLAGS.host, FLAGS.port,
                          allow_pickle=FLAGS.allow_pickle).start()
    print(f"serving {FLAGS.reward} at {server.url}", flush=True)
    while not done.wait(1.0):       # wakes to run the signal handlers
        pass
    logging.info("reward server: shutting down")
    server.stop()


if __name__ == "__main__":
    define_flags()
    flags.mark_flag_as_required("reward")
    app.run(main)
