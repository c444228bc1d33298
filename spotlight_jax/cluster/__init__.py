"""Multi-host scale-out (library only; the command line is ``spotlight_jax.main``, and the
programs that check and demonstrate this code are in ``spotlight_jax.cluster_programs``).

* ``distributed``: the on-demand hosts form one ``jax.distributed`` job (auto-detected on SLURM /
  Kubernetes / MPI, an explicit coordinator otherwise; gloo collectives on CPU) holding one
  ``(data, fsdp, sp)`` mesh over all their devices; ``broadcast_tree`` hands process 0's host
  data to every process.
* ``job``: the runner runs in process 0 with a ``TrainerJob`` in place of its trainer; the other
  processes ``follow`` its commands and run the same jitted update.
* ``ray_hosts``: spot hosts as Ray actors serving the runner's rollout queue. They never join the
  trainer's job, so losing one never takes the trainer down.
* ``ray_auth``: the job's Ray token (one file per job, mode 0600) and the command of a head or
  node on a cluster address, token authentication on.
* ``testbed``, ``testbed_slurm``: hosts on a real network on one Linux machine (network
  namespaces on a bridge, each its own address, ports, ``/tmp``), and a local SLURM over them:
  where the multi-host code and the launchers are checked across a network.
"""
