"""Studies, one program each: ``python -m spotlight_jax.studies.<name> [--flags]``: what the
system learns, where its gradient comes from, what a deployment costs, over runs and seeds (the
objectives side by side, the comparison grid, the cost sweep, staleness, contrast, headroom, the
planner's allocation rules on synthetic bandit worlds, the chaos run on a local Ray cluster).
Benchmarks of a piece's speed are in ``spotlight_jax.bench``.

Same command line as the benchmarks (absl flags defined by ``define_flags()`` only when run,
``main(argv)``); their results are in docs/ (tables) and results/ (run histories).
"""
