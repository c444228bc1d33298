"""Multi-host scale-out (DESIGN section 6).

* ``trainer``: the on-demand hosts form one ``jax.distributed`` job (auto-detected on SLURM /
  Kubernetes / MPI, an explicit coordinator otherwise; gloo collectives on CPU) holding one
  ``(data, fsdp, sp)`` mesh over all their devices. The controller runs in process 0: what it
  decides (rollout batches from the spot workers) reaches the other processes by
  ``broadcast_tree``, and every process then runs the same jitted GRPO update.
* Spot hosts never join that job, so losing one never takes the trainer down.
"""
