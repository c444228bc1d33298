"""Where a run's work travels: the transports between the runner and the devices.

Rollout phases (one interface, :class:`~spotlight_jax.runner.backends.rollouts.Rollouts`):
``rollouts`` (the trainer's devices, and a ready batch with nothing to roll out), ``scheduled``
(the pull scheduler's emulated pool), ``ray_rollouts`` (Ray spot hosts). The spot fleet that
explores: ``emulated_fleet`` (emulated spot nodes of this process that the trace regroups) or the
Ray hosts (``ray_fleet``: the host actors themselves; ``ray_explorer``: exploration on them;
``ray_shards``: a shared update's gradient shards on them). Which ones a run uses is decided once,
by ``runner.build``; the modes only call the interfaces.
"""
