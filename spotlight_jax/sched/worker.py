"""Workers: run leased requests on one SP group, in chunks, committing after each chunk.

A :class:`Worker` is bound to one SP group. It takes a :class:`~spotlight_jax.sched.queue.Lease`
(:meth:`~Worker.load`), and then alternates :meth:`~Worker.plan` (which denoising call comes
next) and :meth:`~Worker.execute` (run it; returns the :class:`~spotlight_jax.sched.requests.
Commit` s that are due). Planning and running are separate so that a discrete-event driver can
charge the call's modelled duration to a virtual clock before the call "happens" (``sim.py``),
and so that a later, Ray-based worker can implement the same interface with remote calls.
:meth:`~Worker.flush` commits every in-flight request's uncommitted progress (the preemption
notice path); :meth:`~Worker.run` is the plain real-time loop (pull, run, commit, heartbeat).

:class:`InProcessWorker` is the implementation in this process. The model math sits behind a
:class:`Stepper`: :class:`SamplerStepper` runs the real MMDiT through ``Sampler.segment`` on the
group's mesh; :class:`ToyStepper` is a cheap numpy stand-in with the same resumable contract
(a pure function of ``(seed, step, latent)``), so chaos tests can replay hundreds of events fast.

Choices (documented because the issue left room):

* **Chunks.** A chunk ends at the next multiple of ``commit_every`` (or the last step), so all
  commits sit on a common grid and requests resumed from commits line up. A chunk is
  ``steps_per_call`` steps per ``segment`` call (default: the whole chunk in one call). A notice
  is honoured at the end of the current call, so ``steps_per_call=1`` stops after the current
  denoising step exactly; a larger value trades notice latency for fewer dispatches.
* **Requests at different step indices in one batch** are grouped by step index (``segment``
  takes one start for the batch). The worker always advances the cohort with the *lowest* step
  first, so a request resumed behind the others catches up and merges with them at a commit
  boundary. The alternative (per-sample start inside one call) would change the shared rollout
  code; grouping costs at most one extra call per distinct step index.
* **Fixed batch shapes.** On XLA:CPU a row's bits depend on the batch size of the program that
  computes it (and on the SP degree), not on its neighbours; on some CPUs also on its position in
  the batch (float rounding; ``microbatch=1`` is bit-exact everywhere). With ``microbatch=b`` every
  call runs exactly ``b`` rows (a short cohort is padded by repeating its last row, whose outputs
  are dropped), so a request's result does not depend on which group or with whom it ran (where the
  position matters, on which slot it ran: equal to rounding, and bit-identical with
  ``microbatch=1``): bit-identical to an undisturbed run with the same ``(microbatch, SP degree,
  strategy)`` signature, recorded per request in ``CommittedState.layouts``. It also bounds the
  programs a group needs (one per chunk length). ``microbatch=None`` runs each cohort as one call
  (fine for the toy stepper, whose rows are computed one at a time). A request resumed under another
  signature (e.g. a group of 4 devices after one of 2) continues correctly, but its bits may differ
  from the undisturbed run by float rounding (up to ~5e-7 on the micro model).
* **Latents stay on the group's devices** between calls: a call whose rows are exactly the
  previous call's output reuses that array, and a commit copies each output to the host once
  for all its rows; only commits move data to the host.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from spotlight_jax.diffusion import Sampler, initial_noise
from spotlight_jax.models import AttentionSpec
from spotlight_jax.sched.queue import Lease, RequestQueue
from spotlight_jax.sched.requests import Commit, CommitRejected, Request
from spotlight_jax.sched.step_cost import StepCost, capacity_of
from spotlight_jax.world import tokenize

ACK_STATUSES = ("accepted", "completed", "duplicate", "stale", "rejected")


# ---- steppers ------------------------------------------------------------------------------------
class Stepper(abc.ABC):
    """Per-request denoising dynamics: rows are independent, and row ``j`` of a call is a pure
    function of ``(seed_j, prompt_j, step, latent_j, params)``."""

    latent_shape: tuple[int, ...]
    num_steps: int

    @abc.abstractmethod
    def set_params(self, params) -> None:
        """Installs the policy weights (on the group's devices)."""

    @abc.abstractmethod
    def initial(self, seed: int) -> Any:
        """The latent at step 0 of one request (the seed's noise)."""

    @abc.abstractmethod
    def segment(self, x, start: int, seeds: np.ndarray, prompts: Sequence[str], num: int):
        """Runs steps ``start .. start+num-1`` on a batch; returns ``(x_end [B, ...], latents
        [B, num, ...], log_probs [B, num])`` (device or host arrays)."""

    @abc.abstractmethod
    def stack(self, rows: Sequence[Any]) -> Any:
        """Stacks per-request latents (device or host) into one batch for :meth:`segment`."""

    def signature(self, batch: int) -> str:
        """Numerics signature of a call with ``batch`` rows (see the module docstring)."""
        return f"b{batch}"

    @staticmethod
    def to_host(a) -> np.ndarray:
        return np.asarray(a)


class ToyStepper(Stepper):
    """A cheap deterministic stand-in for the model, with the rollout's resumable contract.

    ``x' = x + (s' - s) v(x) + noise_level sqrt(s - s') eps`` with ``v(x) = g (c - c^3 / 3) + b``,
    ``c = clip(x, -2, 2)``, ``g = 1 + 0.1 * params`` (the policy version changes the dynamics),
    ``b`` a bias from the prompt, ``eps = normal(rng([seed, step + 1]))``; the log-prob is the
    Gaussian one of ``eps`` averaged over the latent. Each row is computed on its own (float32,
    host), so the result never depends on the batch.
    """

    def __init__(self, latent_shape: Sequence[int] = (4, 4, 3), num_steps: int = 8,
                 noise_level: float = 0.7, delay_s: float = 0.0):
        self.latent_shape = tuple(latent_shape)
        self.num_steps = int(num_steps)
        self.noise_level = np.float32(noise_level)
        self.sigmas = np.linspace(1.0, 0.0, num_steps + 1, dtype=np.float32)
        self.gain = np.float32(1.0)
        self.delay_s = delay_s      # optional real sleep per sample-step (benchmarks)

    def set_params(self, params) -> None:
        self.gain = np.float32(1.0 + 0.1 * float(params))

    def initial(self, seed: int) -> np.ndarray:
        return np.random.default_rng([int(seed), 0]).standard_normal(self.latent_shape,
                                                                     np.float32)

    def stack(self, rows):
        return np.stack([np.asarray(r, np.float32) for r in rows])

    @staticmethod
    @functools.cache
    def _bias(prompt: str) -> np.float32:
        return np.float32((zlib.crc32(prompt.encode()) % 1000) / 1000.0 - 0.5)

    def _row(self, x, seed, bias, i):
        s, sn = self.sigmas[i], self.sigmas[i + 1]
        eps = np.random.default_rng([int(seed), i + 1]).standard_normal(self.latent_shape,
                                                                        np.float32)
        c = np.clip(x, np.float32(-2), np.float32(2))
        v = self.gain * (c - c * c * c / np.float32(3)) + bias
        std = self.noise_level * np.sqrt(s - sn)
        x_next = (x + (sn - s) * v + std * eps).astype(np.float32)
        logp = (np.float32(-0.5) * np.mean(eps * eps, dtype=np.float32) - np.log(std)
                - np.float32(0.9189385)).astype(np.float32)
        return x_next, logp

    def segment(self, x, start, seeds, prompts, num):
        if self.delay_s:
            time.sleep(self.delay_s * len(seeds) * num)
        b = x.shape[0]
        lat = np.empty((b, num, *self.latent_shape), np.float32)
        lps = np.empty((b, num), np.float32)
        for j in range(b):
            xj, bias = x[j], self._bias(prompts[j])
            for n in range(num):
                xj, lps[j, n] = self._row(xj, seeds[j], bias, start + n)
                lat[j, n] = xj
        return lat[:, -1].copy(), lat, lps

    def signature(self, batch: int) -> str:
        return "toy"


class SamplerStepper(Stepper):
    """The real model: ``Sampler.segment`` on an SP group's mesh (parameters replicated on it,
    attention laid out by the group's strategy). Latents stay on the group's devices between
    calls; only commits copy them to the host."""

    def __init__(self, sampler, text_len: int, group=None, tokenize=tokenize):
        self.sampler = sampler
        self.latent_shape = tuple(sampler.image_shape)
        self.num_steps = sampler.cfg.num_steps
        self.text_len = text_len
        self.tokenize = tokenize            # the run's prompt source's (default the world's)
        self.group = group
        self.params = None
        self.calls = 0                      # segment calls made (what ran on this group)
        self._sharding = None
        if group is not None:
            from jax.sharding import NamedSharding, PartitionSpec  # noqa: PLC0415
            self._sharding = NamedSharding(group.mesh, PartitionSpec())

    def _put(self, a):
        import jax  # noqa: PLC0415
        return a if self._sharding is None else jax.device_put(a, self._sharding)

    def set_params(self, params) -> None:
        self.params = self._put(params)

    def initial(self, seed: int):
        return self._put(initial_noise(jnp.asarray([seed], jnp.uint32), self.latent_shape,
                                       self.sampler.cfg.shared_init_bits)[0])

    def stack(self, rows):
        return self._put(jnp.stack([self._put(r) for r in rows]))

    def segment(self, x, start, seeds, prompts, num):
        if self.params is None:
            raise RuntimeError("SamplerStepper has no parameters: call set_params first")
        tokens, mask = self.tokenize(list(prompts), self.text_len)
        self.calls += 1
        out = self.sampler.segment(self.params, x, start, tokens, mask,
                                   np.asarray(seeds, np.uint32), num)
        return out["x"], out["latents"], out["log_probs"]

    def signature(self, batch: int) -> str:
        if self.group is None:
            return f"b{batch}/sp1/dense"
        return f"b{batch}/sp{self.group.degree}/{self.group.strategy}"


class SamplerCache:
    """One ``Sampler`` per group layout (mesh devices + strategy), kept across worker
    re-creations: a compiled segment program is tied to its device tuple, and a fresh ``Sampler``
    would recompile it (seconds). A node that rejoins with the same devices reuses its programs.
    """

    def __init__(self, graphdef, image_shape, sampler_cfg):
        self.graphdef, self.image_shape, self.cfg = graphdef, tuple(image_shape), sampler_cfg
        self._samplers: dict[tuple, Any] = {}

    def get(self, group):
        key = (group.key, group.strategy)
        if key not in self._samplers:
            self._samplers[key] = Sampler(self.graphdef, self.image_shape, self.cfg,
                                          attn=AttentionSpec(mesh=group.mesh,
                                                             strategy=group.strategy))
        return self._samplers[key]


# ---- workers -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """``commit_every``: steps between commits (None: only the final state is committed).
    ``steps_per_call``: steps per ``segment`` call (None: the whole chunk). ``microbatch``: rows
    per call, padded (None: a whole cohort per call). ``retain``: an exploration request this
    worker runs from step 0 keeps its trajectory here (host memory) once completed, though its
    commits carry only the latent: :meth:`InProcessWorker.retained` hands out the few a mode
    trains on, so the others' trajectories never travel."""

    commit_every: int | None = 2
    steps_per_call: int | None = None
    microbatch: int | None = None
    retain: bool = False

    def __post_init__(self):
        for name in ("commit_every", "steps_per_call", "microbatch"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"WorkerConfig.{name} must be a positive int or None, got {v!r}")


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """The next ``segment`` call: ``rids`` (real rows, all at step ``start``), ``num`` steps,
    ``batch`` rows including padding; ``commits``: the rows reach a commit boundary."""

    rids: tuple[str, ...]
    start: int
    num: int
    batch: int
    commits: bool


@dataclasses.dataclass(frozen=True)
class _Row:
    """Row ``j`` of a batch output that stays where it was computed (on the group's devices):
    rows are not sliced out one by one; a call whose rows are exactly one previous output reuses
    it as is, and a commit copies each output to the host once for all its rows."""

    src: Any
    j: int


@dataclasses.dataclass
class _Flight:
    req: Request
    step: int
    x: Any
    sent: int                                  # step of the last commit sent
    acked: int                                 # step of the last commit the queue accepted
    initial: Any = None                        # x at step 0 until the first commit is sent
    chunks: list = dataclasses.field(default_factory=list)   # (latents, log_probs, row)
    layout: str = ""                           # numerics signature of the last call
    kept: list | None = None                   # retained exploration: host (latents, log_probs)
    kept_initial: Any = None                   # ... and x at step 0 (host)


class Worker(abc.ABC):
    """The interface every worker implements (in-process here; Ray-based later).

    A worker holds at most one lease at a time. ``group_id``, ``degree`` (SP degree) and
    ``capacity`` (throughput relative to one device) identify it to the queue. Implementations
    set ``_capacity`` and ``_version`` (the installed policy version) when they start.
    """

    group_id: str
    degree: int
    config: WorkerConfig
    _capacity: float
    _version: int

    @property
    def capacity(self) -> float:
        return self._capacity

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    @abc.abstractmethod
    def lease_id(self) -> str | None:
        """The lease held, or None when idle."""

    @abc.abstractmethod
    def set_policy(self, params, version: int) -> None:
        """Installs new weights; only between leases (a rollout never mixes versions)."""

    @abc.abstractmethod
    def load(self, lease: Lease) -> None:
        """Takes a lease: each request continues from its committed state."""

    @abc.abstractmethod
    def plan(self) -> CallPlan | None:
        """The next call, or None when every held request is finished or dropped."""

    @abc.abstractmethod
    def execute(self, plan: CallPlan) -> list[Commit]:
        """Runs the planned call; returns the commits it makes due."""

    @abc.abstractmethod
    def flush(self) -> list[Commit]:
        """Commits for every held request with uncommitted progress (preemption notice)."""

    @abc.abstractmethod
    def acknowledge(self, rid: str, status: str, step: int | None = None) -> int:
        """The queue's answer to the commit of ``rid`` that reached ``step`` (one of
        :data:`ACK_STATUSES`). 'accepted' moves the request's last good commit to ``step``; any
        other status means the worker no longer holds the request and forgets it. Returns the
        steps of work thrown away (computed beyond the last accepted commit)."""

    @abc.abstractmethod
    def abandon(self) -> dict[str, int]:
        """Forgets the lease and every held request (the lease is gone); returns the steps
        thrown away per request."""

    @abc.abstractmethod
    def progress(self) -> dict[str, int]:
        """Step reached by each held request (computed, committed or not)."""

    # ---- shared loop ---------------------------------------------------------------------
    def deliver(self, queue: RequestQueue, commits: Sequence[Commit], now: float,
                lease_id: str | None = None,
                tamper: Callable[[Commit], Commit] | None = None) -> dict[str, tuple[str, int]]:
        """Sends commits to the queue and acknowledges the answers. A rejected request is
        handed back (the queue re-runs it from its last good commit). ``tamper`` (fault
        injection in tests) may alter a commit on the way. Returns rid -> (status, steps thrown
        away)."""
        lease_id = lease_id or self.lease_id
        out = {}
        for c in commits:
            try:
                status = queue.commit(lease_id, c if tamper is None else tamper(c), now)
            except CommitRejected:
                status = "rejected"
                queue.release(lease_id, now, [c.rid])
            out[c.rid] = (status, self.acknowledge(c.rid, status, c.step))
        return out

    def run(self, queue: RequestQueue, now: Callable[[], float] = time.monotonic,
            max_leases: int | None = None) -> dict[str, int]:
        """Real-time loop: pull, run every call, commit, heartbeat; until the queue has nothing
        for this group (or ``max_leases``). Returns counters (leases, calls, commits)."""
        stats = {"leases": 0, "calls": 0, "commits": 0}
        while max_leases is None or stats["leases"] < max_leases:
            lease = queue.pull(self.group_id, self.capacity, self.policy_version, now())
            if lease is None:
                break
            stats["leases"] += 1
            self.load(lease)
            while (plan := self.plan()) is not None:
                commits = self.execute(plan)
                stats["calls"] += 1
                if not queue.heartbeat(lease.lease_id, now()):
                    self.abandon()
                    break
                self.deliver(queue, commits, now())
                stats["commits"] += len(commits)
            if self.lease_id is not None:   # e.g. every request dropped after a rejection
                queue.release(lease.lease_id, now())
                self.abandon()
        return stats


class InProcessWorker(Worker):
    """Runs leased requests in this process through a :class:`Stepper` (see module docstring).

    ``capacity`` comes from ``cost`` (any object with ``rollout_step(batch, sp)``) unless given.
    """

    def __init__(self, group_id: str, stepper: Stepper, *, degree: int = 1,
                 config: WorkerConfig = WorkerConfig(), cost=None, params=0,
                 version: int = 0, capacity: float | None = None):
        cost = StepCost() if cost is None else cost
        self.group_id = group_id
        self.stepper = stepper
        self.degree = int(degree)
        self.config = config
        self._capacity = capacity_of(cost, self.degree) if capacity is None else float(capacity)
        self._version = int(version)
        self._lease: Lease | None = None
        self._flights: dict[str, _Flight] = {}
        self._order: list[str] = []
        self._retained: dict[str, dict[str, np.ndarray]] = {}   # rid -> completed trajectory
        stepper.set_params(params)

    @property
    def lease_id(self) -> str | None:
        return None if self._lease is None else self._lease.lease_id

    def set_policy(self, params, version: int) -> None:
        if self._flights:
            raise RuntimeError(f"worker {self.group_id}: set_policy while holding requests "
                               f"{sorted(self._flights)}; weights change between leases only")
        self.stepper.set_params(params)
        self._version = int(version)
        self._retained.clear()              # trajectories of the previous version's candidates

    def load(self, lease: Lease) -> None:
        if self._flights:
            raise RuntimeError(f"worker {self.group_id} already holds lease {self.lease_id}")
        self._lease = lease
        for r in lease.requests:
            if r.num_steps != self.stepper.num_steps:
                raise ValueError(f"request {r.rid!r} has {r.num_steps} steps but worker "
                                 f"{self.group_id} samples {self.stepper.num_steps}")
            s = r.state
            keep = self.config.retain and not r.is_rollout and s.step == 0
            if s.step == 0:
                x = self.stepper.initial(r.seed)
                initial = x if r.is_rollout or keep else None
            else:
                x, initial = s.latent, None
            self._flights[r.rid] = _Flight(req=r, step=s.step, x=x, sent=s.step, acked=s.step,
                                           initial=initial, kept=[] if keep else None)
            self._order.append(r.rid)

    def _boundary(self, step: int, total: int) -> int:
        k = self.config.commit_every
        return total if k is None else min(total, (step // k + 1) * k)

    def plan(self) -> CallPlan | None:
        live = [f for f in (self._flights[r] for r in self._order) if f.step < f.req.num_steps]
        if not live:
            return None
        start = min(f.step for f in live)
        cohort = [f for f in live if f.step == start]
        mb = self.config.microbatch
        rows = cohort if mb is None else cohort[:mb]
        boundary = self._boundary(start, rows[0].req.num_steps)
        num = boundary - start
        if self.config.steps_per_call is not None:
            num = min(num, self.config.steps_per_call)
        return CallPlan(rids=tuple(f.req.rid for f in rows), start=start, num=num,
                        batch=len(rows) if mb is None else mb, commits=start + num == boundary)

    def execute(self, plan: CallPlan) -> list[Commit]:
        # a request dropped while the call was planned (its lease was lost meanwhile) is
        # skipped; the call keeps its batch shape
        rows = [self._flights[r] for r in plan.rids if r in self._flights]
        if not rows:
            return []
        pad = [rows[-1]] * (plan.batch - len(rows))
        xs = [f.x for f in rows + pad]
        src = xs[0].src if isinstance(xs[0], _Row) else None
        if src is not None and all(isinstance(r, _Row) and r.src is src and r.j == i
                                   for i, r in enumerate(xs)) and len(xs) == src.shape[0]:
            x = src                          # the previous call's output, in the same order
        else:
            x = self.stepper.stack([r.src[r.j] if isinstance(r, _Row) else r for r in xs])
        seeds = np.asarray([f.req.seed for f in rows + pad], np.uint32)
        prompts = [f.req.prompt for f in rows + pad]
        x_end, lat, lps = self.stepper.segment(x, plan.start, seeds, prompts, plan.num)
        layout = self.stepper.signature(plan.batch)
        for j, f in enumerate(rows):
            f.x = _Row(x_end, j)
            f.step = plan.start + plan.num
            f.layout = layout
            if f.req.is_rollout or f.kept is not None:
                f.chunks.append((lat, lps, j))
        return self._commits(rows) if plan.commits else []

    def _commits(self, flights) -> list[Commit]:
        """Commits of ``flights``; each device array is copied to the host once."""
        copies: dict[int, tuple[Any, np.ndarray]] = {}

        def host(a):
            if id(a) not in copies:
                copies[id(a)] = (a, self.stepper.to_host(a))   # keeps ``a`` alive: ids stay unique
            return copies[id(a)][1]

        def row(x):
            return host(x.src)[x.j] if isinstance(x, _Row) else host(x)
        out = []
        for f in flights:
            kw = {}
            if f.req.is_rollout:
                kw["latents"] = np.concatenate([host(a)[j] for a, _, j in f.chunks])
                kw["log_probs"] = np.concatenate([host(b)[j] for _, b, j in f.chunks])
                if f.sent == 0:
                    kw["initial"] = row(f.initial)
            elif f.kept is not None:           # retained here, not sent
                f.kept.append((np.concatenate([host(a)[j] for a, _, j in f.chunks]),
                               np.concatenate([host(b)[j] for _, b, j in f.chunks])))
                if f.sent == 0:
                    f.kept_initial = row(f.initial).copy()
            out.append(Commit(rid=f.req.rid, start=f.sent, step=f.step, latent=row(f.x).copy(),
                              policy_version=self._version, layout=f.layout, **kw))
            f.sent, f.chunks, f.initial = f.step, [], None
        return out

    def flush(self) -> list[Commit]:
        return self._commits([self._flights[r] for r in self._order
                              if self._flights[r].step > self._flights[r].sent])

    def acknowledge(self, rid: str, status: str, step: int | None = None) -> int:
        if status not in ACK_STATUSES:
            raise ValueError(f"unknown commit status {status!r}; one of {ACK_STATUSES}")
        f = self._flights.get(rid)
        if f is None:
            return 0
        if status == "accepted":
            f.acked = max(f.acked, f.sent if step is None else step)
            return 0
        wasted = 0 if status == "completed" else f.step - f.acked
        if status == "completed" and f.kept is not None and f.kept_initial is not None:
            self._retained[rid] = {
                "latents": np.concatenate([f.kept_initial[None]] + [a for a, _ in f.kept]),
                "log_probs": np.concatenate([b for _, b in f.kept])}
        del self._flights[rid]
        self._order.remove(rid)
        if not self._flights:
            self._lease = None
        return wasted

    def abandon(self) -> dict[str, int]:
        wasted = {r: self._flights[r].step - self._flights[r].acked for r in self._order}
        self._flights.clear()
        self._order.clear()
        self._lease = None
        return wasted

    def progress(self) -> dict[str, int]:
        return {r: self._flights[r].step for r in self._order}

    def held(self, rid: str) -> Request | None:
        """The request ``rid`` as leased to this worker (None when it holds no such request)."""
        f = self._flights.get(rid)
        return None if f is None else f.req

    def retained(self, rids) -> dict[str, dict[str, np.ndarray]]:
        """The completed trajectories (``latents [T+1, ...]`` with x_T first, ``log_probs
        [T]``) of the retained exploration requests among ``rids`` (``WorkerConfig.retain``)
        that this worker ran from step 0 under its current policy version; others are absent
        (resumed here from another worker's commit, or never run here)."""
        return {r: self._retained[r] for r in rids if r in self._retained}

    def adopt_retained(self, other: InProcessWorker) -> None:
        """Keeps ``other``'s retained trajectories (a regroup replaces the worker, not its
        results)."""
        self._retained.update(other._retained)

    def uncommitted(self) -> dict[str, int]:
        """Steps computed but not yet sent in a commit, per held request."""
        return {r: self._flights[r].step - self._flights[r].sent for r in self._order}
