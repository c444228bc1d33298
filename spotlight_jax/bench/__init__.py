"""Benchmarks, one program each: ``python -m spotlight_jax.bench.<name> [--flags]``.

Every benchmark has absl flags, defined by its ``define_flags()`` when it runs as the program, and
a ``main(argv)`` for ``absl.app.run``; ``_setup`` holds what they share (the emulated-device
set-up, the repository's paths). The numbers they printed are in docs/performance.md.
"""
