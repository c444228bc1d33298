"""Benchmarks, one program each: ``python -m spotlight_jax.bench.<name> [--flags]``: how fast a
piece of the system is (attention strategies, rollouts, the scheduler, recovering a spot group,
the accelerator check). Studies (what the system learns or costs, over runs) are in
``spotlight_jax.studies``; the cluster's correctness check and demo in
``spotlight_jax.cluster_programs``.

Every benchmark has absl flags, defined by its ``define_flags()`` when it runs as the program, and
a ``main(argv)`` for ``absl.app.run``; ``spotlight_jax.programs`` holds what programs share (the
emulated-device set-up, the repository's paths). The numbers they printed are in
docs/performance.md.
"""
