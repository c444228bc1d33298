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
"""
