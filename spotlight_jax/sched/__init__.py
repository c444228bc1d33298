"""Preemption-aware, pull-based request scheduler (docs/design.md, Contracts).

``requests``: a request (rollout or exploration job) and its committed state, plain arrays + JSON
for checkpoints, validated on commit. ``queue``: the pull-based queue with leases, capacity-sized
batches, exactly-once completion and policy-version rules. ``worker``: the ``Worker`` interface
and the in-process worker that runs leased requests on an SP group in chunks of ``commit_every``
steps (real model through ``Sampler.segment``, or a cheap toy stepper). ``sim``: a deterministic
discrete-event simulation on a virtual clock that replays spot traces / random chaos schedules
over groups of emulated devices. ``step_cost``: the step-time / capacity model.
"""
from spotlight_jax.sched.queue import Completion, Lease, QueueConfig, RequestQueue
from spotlight_jax.sched.requests import (
    KINDS,
    Commit,
    CommitRejected,
    CommittedState,
    Request,
    apply_commit,
    validate_commit,
)
from spotlight_jax.sched.sim import (
    FAULTS,
    SimConfig,
    SimEvent,
    SimReport,
    Simulation,
    events_from_replay,
    make_requests,
    random_schedule,
    results_equal,
)
from spotlight_jax.sched.step_cost import StepCost, capacity_of
from spotlight_jax.sched.worker import (
    CallPlan,
    InProcessWorker,
    SamplerCache,
    SamplerStepper,
    Stepper,
    ToyStepper,
    Worker,
    WorkerConfig,
)

__all__ = [
    "StepCost", "capacity_of",
    "Completion", "Lease", "QueueConfig", "RequestQueue",
    "KINDS", "Commit", "CommitRejected", "CommittedState", "Request", "apply_commit",
    "validate_commit",
    "FAULTS", "SimConfig", "SimEvent", "SimReport", "Simulation", "events_from_replay",
    "make_requests", "random_schedule", "results_equal",
    "CallPlan", "InProcessWorker", "SamplerCache", "SamplerStepper", "Stepper", "ToyStepper",
    "Worker", "WorkerConfig",
]
