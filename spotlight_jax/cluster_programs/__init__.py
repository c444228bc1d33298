"""Programs that run the cluster code (``spotlight_jax.cluster``, a library), one each:
``python -m spotlight_jax.cluster_programs.<name> [--flags]``.

* ``update_check``: one update by a multi-process ``jax.distributed`` job on a saved batch, the
  check that a job of several processes updates exactly as one process does
  (``tests/cluster/test_cluster_trainer.py`` runs it).
* ``hosts_demo``: spot hosts on a running Ray cluster serving a rollout queue, with an optional
  preemption notice (``launch/local_cluster.sh`` runs it).
* ``ray_token``: the job's Ray token file (``cluster.ray_auth``), which the SLURM launchers
  create before any ``ray start``.
* ``testbed``: Spotlight across hosts on a real network (the network test bed: Linux, root),
  Ray or the SLURM launchers, with network and provider faults injected; writes
  ``testbed.json`` (``tests/cluster/test_testbed_command.py`` runs it).

Being programs, they sit in the top layer with ``bench`` and ``studies`` (``hosts_demo`` loads
the base model with ``train``; both take ``programs``' ``--config`` flag), and have the same
command line: absl flags defined by ``define_flags()`` only when run, and a ``main(argv)``.
"""
