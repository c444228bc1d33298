"""Command-line tools beside the main program (``python -m spotlight_jax.tools.<name>``): the
prompt-embedding file of a real text encoder, a learned reward's head converted once, seed curves
of recorded runs."""
