"""The trainer's ``jax.distributed`` job: one process per on-demand host, one mesh over all.

``initialize`` joins the job; ``broadcast_tree`` hands process 0's host data (the rollout batch
its runner assembled) to every process. On CPU the processes talk over gloo
(``jax_cpu_collectives_implementation``); on GPUs over NCCL.
"""
from __future__ import annotations

import json
import logging
import socket

import jax
import numpy as np
from jax.experimental import multihost_utils

logger = logging.getLogger(__name__)
_HEADER_BYTES = 1 << 16


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, cpu_devices: int = 0,
               cpu_collectives: str = "gloo") -> tuple[int, int]:
    """Joins the trainer's ``jax.distributed`` job; returns ``(process_index, process_count)``.

    With no arguments JAX auto-detects the cluster (SLURM, Open MPI, Kubernetes, Cloud TPU).
    ``cpu_devices`` > 0 emulates that many devices per process on CPU. Must run before any JAX
    computation in the process (JAX's rule)."""
    if cpu_collectives:
        if cpu_collectives == "gloo":
            check_hostname_resolves()
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    if cpu_devices:
        jax.config.update("jax_num_cpu_devices", int(cpu_devices))
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    logger.info("trainer process %d of %d: %d local / %d global devices", jax.process_index(),
                jax.process_count(), jax.local_device_count(), jax.device_count())
    return jax.process_index(), jax.process_count()


def check_hostname_resolves() -> str:
    """This host's address by its name, which gloo's TCP transport looks up to choose the
    interface it listens on; a clear error (naming the fix) where the name does not resolve,
    instead of gloo's ``enforce fail at .../device.cc`` when the backend starts."""
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        raise RuntimeError(f"this host's name {name!r} does not resolve ({e}); gloo, the "
                           "trainer job's CPU collectives, picks its interface by it: add "
                           f"'<address> {name}' to /etc/hosts (or the cluster's DNS)") from None


def broadcast_tree(tree: dict | None) -> dict:
    """Process 0's flat dict of host arrays on every process (other processes pass None).

    Two collective broadcasts: a JSON header with names, shapes and dtypes (fixed size), then
    the arrays themselves, so followers need not know the shapes in advance."""
    if jax.process_index() == 0:
        if tree is None:
            raise ValueError("process 0 must pass the tree to broadcast")
        meta = [(k, list(np.shape(v)), np.asarray(v).dtype.str) for k, v in tree.items()]
        raw = json.dumps(meta).encode()
        if len(raw) > _HEADER_BYTES:
            raise ValueError(f"broadcast header of {len(raw)} bytes exceeds {_HEADER_BYTES}")
        header = np.zeros(_HEADER_BYTES, np.uint8)
        header[:len(raw)] = np.frombuffer(raw, np.uint8)
    else:
        header = np.zeros(_HEADER_BYTES, np.uint8)
    header = np.asarray(multihost_utils.broadcast_one_to_all(header))
    meta = json.loads(bytes(header[header != 0]).decode())
    like = {k: (np.asarray(tree[k]) if jax.process_index() == 0
                else np.zeros(shape, np.dtype(dtype))) for k, shape, dtype in meta}
    out = multihost_utils.broadcast_one_to_all(like)
    return {k: np.asarray(v) for k, v in out.items()}


