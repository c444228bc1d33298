"""Pull-based request queue with leases and exactly-once completion.

Every request is, at any time, in exactly one of three places: **pending** (waiting, at its last
good commit), **leased** (held by one group under one lease) or **completed** (its result accepted
once). :meth:`RequestQueue.check_invariants` asserts this; nothing else removes a request.

* **Pull.** An idle group calls :meth:`~RequestQueue.pull` with its capacity (throughput relative
  to one device, see ``step_cost``) and the policy version it holds, and gets a :class:`Lease` on a
  batch sized to its throughput: ``batch_per_capacity * capacity`` requests (weighted by the share
  of their steps still to run), so a group of 4 devices gets about twice the work of a group of 2
  and both take about as long. With ``guided`` sizing (default), a pull never takes more than the
  group's capacity share of the pending work (guided self-scheduling): batches shrink as the queue
  drains, so groups of different sizes finish together instead of the small ones running a large
  last batch while the big ones idle.
* **Leases.** A lease expires ``lease_s`` after it was granted or last extended (commit or
  heartbeat). An expired lease's requests go back to pending at their last good commit: that is
  how an abrupt loss (no notice) is detected, and the work since that commit is what is lost.
  A preemption notice instead commits in-flight state and :meth:`~RequestQueue.release` s the
  lease at once, losing nothing.
* **Exactly once.** A commit is accepted only from the lease that currently holds the request.
  A request's final commit completes it once; any later result for it (a retry, or a zombie whose
  lease expired and whose request was finished elsewhere) is dropped and counted as a
  *duplicate*; a non-final commit from a lease that no longer holds the request is dropped and
  counted as *stale*.
* **Bad input.** A malformed commit (wrong shape/dtype, non-finite, step out of range, chunk not
  continuing the last commit, wrong policy version for a rollout, unknown request id) raises
  :class:`~spotlight_jax.sched.requests.CommitRejected`; a known request goes back to pending at
  its last good commit and is re-run, never dropped.
* **Policy versions.** A training rollout (or a gradient shard) is only given to a group holding
  exactly its version;
  a group with another version is passed over (counted as ``version_skips``) and the rollout
  stays pending for a group that has it. Exploration requests go to any group (stale weights are
  fine by design) and their committed state records the version of every step.

Leased requests are snapshots (``Request`` is immutable, committed arrays read-only), so a worker
can never corrupt the queue's copy. ``to_state``/``from_state`` give ``(arrays, meta)`` for an
Orbax checkpoint; leases do not survive a restore (their requests come back pending at their last
commit, exactly what an expired lease gives).
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from spotlight_jax.sched.requests import (
    LATENT_DTYPE,
    LOGP_DTYPE,
    Commit,
    CommitRejected,
    Request,
    apply_commit,
    validate_commit,
)

SIZINGS = ("capacity", "fixed")


@dataclasses.dataclass(frozen=True)
class QueueConfig:
    """``lease_s``: lease duration (renewed by commits and heartbeats). ``sizing``: 'capacity'
    (batch proportional to the group's capacity) or 'fixed' (``fixed_batch`` requests whatever the
    group). ``guided``: cap a pull at the group's capacity share of the pending work.
    ``max_batch``: hard cap on requests per lease (0 = none)."""

    lease_s: float = 60.0
    sizing: str = "capacity"
    batch_per_capacity: float = 2.0
    fixed_batch: int = 4
    guided: bool = True
    max_batch: int = 0

    def __post_init__(self):
        if not self.lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {self.lease_s}")
        if self.sizing not in SIZINGS:
            raise ValueError(f"sizing must be one of {SIZINGS}, got {self.sizing!r}")
        if not self.batch_per_capacity > 0 or self.fixed_batch < 1 or self.max_batch < 0:
            raise ValueError("batch_per_capacity must be > 0, fixed_batch >= 1, max_batch >= 0")


@dataclasses.dataclass
class Lease:
    """A batch of requests held by one group until ``expires_at`` (renewed by commits and
    heartbeats). ``requests`` are the snapshots the group starts from; ``rids`` shrinks as
    requests complete or are given back."""

    lease_id: str
    group_id: str
    policy_version: int
    requests: tuple[Request, ...]
    granted_at: float
    expires_at: float
    rids: set[str] = dataclasses.field(default_factory=set)

    def __post_init__(self):
        if not self.rids:
            self.rids = {r.rid for r in self.requests}


@dataclasses.dataclass(frozen=True)
class Completion:
    """Who completed a request, when (the first accepted final commit)."""

    lease_id: str
    group_id: str
    time: float


class RequestQueue:
    """The scheduler's single source of truth for requests (see the module docstring).

    ``latent_shape``: shape of one latent (every commit is checked against it). Times (``now``)
    are seconds on whatever clock the caller uses (virtual in the simulation).
    """

    def __init__(self, latent_shape: Sequence[int], config: QueueConfig = QueueConfig()):
        self.latent_shape = tuple(int(d) for d in latent_shape)
        self.config = config
        self._requests: dict[str, Request] = {}
        self._order: dict[str, int] = {}
        self._pending: set[str] = set()
        self._holder: dict[str, str] = {}          # rid -> lease id
        self._completed: dict[str, Completion] = {}
        self._leases: dict[str, Lease] = {}
        self._groups: dict[str, float] = {}        # registered group -> capacity
        self._lease_seq = 0
        self.stats: Counter = Counter()
        self.rejections: list[CommitRejected] = []

    # ---- submission and queries --------------------------------------------------------------
    def submit(self, requests: Iterable[Request]) -> None:
        """Adds new requests (pending). Ids must be new; a request may carry committed state."""
        for r in requests:
            if r.rid in self._requests:
                raise ValueError(f"request id {r.rid!r} was already submitted")
            self._check_state(r)
            self._requests[r.rid] = r
            self._order[r.rid] = len(self._order)
            if r.done:
                self._completed[r.rid] = Completion("", "", math.nan)
            else:
                self._pending.add(r.rid)
            self.stats["submitted"] += 1

    def request(self, rid: str) -> Request:
        if rid not in self._requests:
            raise KeyError(f"unknown request id {rid!r}")
        return self._requests[rid]

    def ids(self) -> list[str]:
        """Every request id, in submission order."""
        return sorted(self._requests, key=self._order.__getitem__)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def pending(self) -> list[str]:
        return sorted(self._pending, key=self._order.__getitem__)

    def leased(self) -> dict[str, str]:
        return dict(self._holder)

    def leases(self) -> dict[str, Lease]:
        return dict(self._leases)

    def completed(self) -> dict[str, Completion]:
        return dict(self._completed)

    @property
    def all_done(self) -> bool:
        return len(self._completed) == len(self._requests)

    def results(self) -> dict[str, Request]:
        """Completed requests (final committed state) by id, in submission order."""
        return {rid: self._requests[rid] for rid in sorted(self._completed,
                                                           key=self._order.__getitem__)}

    # ---- groups ------------------------------------------------------------------------------
    def register_group(self, group_id: str, capacity: float) -> None:
        """Announces a group and its capacity (``pull`` does this too); the total capacity of
        registered groups is what guided sizing divides the pending work by."""
        if not capacity > 0:
            raise ValueError(f"group {group_id!r}: capacity must be > 0, got {capacity}")
        self._groups[group_id] = float(capacity)

    def leave(self, group_id: str) -> None:
        """The group is gone or stopping: it no longer counts for sizing (its leases, if any,
        still expire or are released)."""
        self._groups.pop(group_id, None)

    # ---- pull --------------------------------------------------------------------------------
    def pull(self, group_id: str, capacity: float, policy_version: int, now: float,
             max_requests: int | None = None) -> Lease | None:
        """A batch for an idle group, or None when nothing pending may run on it.

        Requests are taken in submission order (so resumed ones, which keep their place, go
        first). Rollouts whose version differs from ``policy_version`` are skipped.
        """
        self.register_group(group_id, capacity)
        self.stats["pulls"] += 1
        eligible = []
        for rid in self.pending():
            r = self._requests[rid]
            if r.needs_version and r.policy_version != policy_version:
                self.stats["version_skips"] += 1
                continue
            eligible.append(r)
        if not eligible:
            self.stats["empty_pulls"] += 1
            return None
        cfg = self.config
        weights = [r.remaining / r.num_steps for r in eligible]
        if cfg.sizing == "fixed":
            budget, cap = float(cfg.fixed_batch), cfg.fixed_batch
        else:
            budget = capacity * cfg.batch_per_capacity
            cap = max(1, math.ceil(2 * budget))
            if cfg.guided:
                total_cap = sum(self._groups.values())
                budget = min(budget, sum(weights) * capacity / total_cap)
        if cfg.max_batch:
            cap = min(cap, cfg.max_batch)
        if max_requests is not None:
            cap = min(cap, max_requests)
        batch, work = [], 0.0
        for r, w in zip(eligible, weights):
            # nearest to the budget: stop when the next request would overshoot it by more
            # than it would undershoot (a pull always gets at least one request)
            if len(batch) >= max(cap, 1) or (batch and work + w / 2 > budget + 1e-9):
                break
            batch.append(r)
            work += w
        self._lease_seq += 1
        lease = Lease(lease_id=f"L{self._lease_seq}", group_id=group_id,
                      policy_version=int(policy_version), requests=tuple(batch),
                      granted_at=now, expires_at=now + cfg.lease_s)
        self._leases[lease.lease_id] = lease
        for r in batch:
            self._pending.discard(r.rid)
            self._holder[r.rid] = lease.lease_id
        self.stats["leases"] += 1
        self.stats["leased_requests"] += len(batch)
        return lease

    # ---- progress ----------------------------------------------------------------------------
    def heartbeat(self, lease_id: str, now: float) -> bool:
        """Extends a live lease; False when it is gone (expired/released: stop working on it)."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return False
        lease.expires_at = max(lease.expires_at, now + self.config.lease_s)
        return True

    def commit(self, lease_id: str, commit: Commit, now: float) -> str:
        """Accepts one request's progress. Returns 'accepted', 'completed', 'duplicate' (already
        completed: dropped) or 'stale' (this lease no longer holds it: dropped). Raises
        :class:`CommitRejected` for a malformed commit or an unknown request id (the request, if
        known and held by this lease, is back to pending at its last good commit)."""
        rid = commit.rid
        if rid not in self._requests:
            self.stats["rejected"] += 1
            err = CommitRejected(rid, f"unknown request id (lease {lease_id}); the queue holds "
                                      f"{len(self._requests)} requests")
            self.rejections.append(err)
            raise err
        if rid in self._completed:
            self.stats["duplicates"] += 1
            return "duplicate"
        if self._holder.get(rid) != lease_id or lease_id not in self._leases:
            self.stats["stale"] += 1
            return "stale"
        req = self._requests[rid]
        try:
            validate_commit(req, commit, self.latent_shape)
        except CommitRejected as err:
            self.stats["rejected"] += 1
            self.rejections.append(err)
            self._return([rid], lease_id)
            raise
        req = apply_commit(req, commit)
        self._requests[rid] = req
        lease = self._leases[lease_id]
        lease.expires_at = max(lease.expires_at, now + self.config.lease_s)
        self.stats["commits"] += 1
        self.stats["committed_steps"] += commit.num_steps
        if req.done:
            self._completed[rid] = Completion(lease_id, lease.group_id, now)
            del self._holder[rid]
            self._drop_from_lease(lease, rid)
            self.stats["completed"] += 1
            return "completed"
        return "accepted"

    def release(self, lease_id: str, now: float, rids: Iterable[str] | None = None) -> list[str]:
        """Gives requests of a live lease back (all by default): they are pending again at their
        last commit. The preemption-notice path (after committing) and how a worker hands back a
        request it cannot run. Unknown leases / requests not held by it are ignored."""
        if lease_id not in self._leases:
            return []
        lease = self._leases[lease_id]
        rids = sorted(lease.rids) if rids is None else [r for r in rids if r in lease.rids]
        self._return(rids, lease_id)
        self.stats["released"] += len(rids)
        return rids

    def expire(self, now: float) -> list[Lease]:
        """Ends every lease with ``expires_at <= now``; its requests go back to pending at their
        last commit and its group stops counting for sizing (it is presumed dead)."""
        out = []
        for lease in sorted(self._leases.values(), key=lambda le: (le.expires_at, le.lease_id)):
            if lease.expires_at <= now:
                out.append(lease)
                self.stats["expired_leases"] += 1
                self.stats["expired_requests"] += len(lease.rids)
                self._groups.pop(lease.group_id, None)
                self._return(sorted(lease.rids), lease.lease_id)
        return out

    def next_expiry(self) -> float | None:
        return min((le.expires_at for le in self._leases.values()), default=None)

    # ---- invariants --------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raises AssertionError unless every request is pending, leased (by exactly one live
        lease that lists it) or completed, exactly one of them, with consistent state."""
        problems = []
        leased_by_lease = Counter()
        for lease in self._leases.values():
            for rid in lease.rids:
                leased_by_lease[rid] += 1
                if self._holder.get(rid) != lease.lease_id:
                    problems.append(f"{rid}: listed by {lease.lease_id} but held by "
                                    f"{self._holder.get(rid)}")
        for rid, req in self._requests.items():
            where = [rid in self._pending, rid in self._holder, rid in self._completed]
            if sum(where) != 1:
                problems.append(f"{rid}: pending/leased/completed = {where}")
            if rid in self._holder and leased_by_lease[rid] != 1:
                problems.append(f"{rid}: held by {leased_by_lease[rid]} leases")
            if (rid in self._completed) != req.done:
                problems.append(f"{rid}: completed={rid in self._completed} but step "
                                f"{req.state.step}/{req.num_steps}")
            try:
                self._check_state(req)
            except ValueError as e:
                problems.append(str(e))
        for rid in self._holder:
            if self._holder[rid] not in self._leases:
                problems.append(f"{rid}: held by dead lease {self._holder[rid]}")
        extra = (self._pending | set(self._holder) | set(self._completed)) - set(self._requests)
        if extra:
            problems.append(f"unknown ids tracked: {sorted(extra)}")
        if problems:
            raise AssertionError("queue invariants violated:\n  " + "\n  ".join(problems))

    def summary(self) -> dict:
        return {"requests": len(self._requests), "pending": len(self._pending),
                "leased": len(self._holder), "completed": len(self._completed),
                "leases": len(self._leases), **dict(self.stats)}

    # ---- checkpoint --------------------------------------------------------------------------
    def to_state(self) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
        """``(arrays, meta)`` for a checkpoint: ``arrays[rid]`` are the request's committed arrays,
        ``meta`` is JSON (requests, their order, completions, counters, config). Leased requests
        are saved as pending at their last commit."""
        arrays, reqs = {}, []
        for rid in sorted(self._requests, key=self._order.__getitem__):
            a, m = self._requests[rid].to_state()
            if a:
                arrays[rid] = a
            reqs.append(m)
        meta = {"latent_shape": list(self.latent_shape),
                "config": dataclasses.asdict(self.config),
                "requests": reqs,
                "completed": {rid: dataclasses.asdict(c) | {"time": None if math.isnan(c.time)
                                                              else c.time}
                              for rid, c in self._completed.items()},
                "lease_seq": self._lease_seq, "stats": dict(self.stats)}
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict, meta: dict) -> RequestQueue:
        q = cls(meta["latent_shape"], QueueConfig(**meta["config"]))
        for m in meta["requests"]:
            r = Request.from_state(arrays.get(m["rid"], {}), m)
            q._check_state(r)
            q._requests[r.rid] = r
            q._order[r.rid] = len(q._order)
            if r.rid in meta["completed"]:
                c = meta["completed"][r.rid]
                q._completed[r.rid] = Completion(c["lease_id"], c["group_id"],
                                                 math.nan if c["time"] is None else c["time"])
            else:
                q._pending.add(r.rid)
        q._lease_seq = int(meta["lease_seq"])
        q.stats.update(meta["stats"])
        return q

    # ---- internals ---------------------------------------------------------------------------
    def _return(self, rids: Sequence[str], lease_id: str) -> None:
        lease = self._leases.get(lease_id)
        for rid in rids:
            if self._holder.get(rid) == lease_id:
                del self._holder[rid]
                self._pending.add(rid)
            if lease is not None:
                self._drop_from_lease(lease, rid)

    def _drop_from_lease(self, lease: Lease, rid: str) -> None:
        lease.rids.discard(rid)
        if not lease.rids:
            self._leases.pop(lease.lease_id, None)

    def _check_state(self, r: Request) -> None:
        """A request's committed state is self-consistent (used on submit, restore, invariants)."""
        s, shape, rid = r.state, self.latent_shape, r.rid

        def arr(name, a, shp, dtype):
            if a is None or a.dtype != dtype or tuple(a.shape) != tuple(shp):
                got = None if a is None else (a.dtype, tuple(a.shape))
                raise ValueError(f"request {rid!r}: committed {name} is {got}, expected "
                                 f"({dtype}, {tuple(shp)})")
        if not 0 <= s.step <= r.num_steps:
            raise ValueError(f"request {rid!r}: committed step {s.step} outside [0, "
                             f"{r.num_steps}]")
        if len(s.versions) != s.step:
            raise ValueError(f"request {rid!r}: {len(s.versions)} step versions for step "
                             f"{s.step}")
        if s.step == 0 or r.kind == "shard":
            return
        arr("latent", s.latent, shape, LATENT_DTYPE)
        if r.is_rollout:
            arr("initial", s.initial, shape, LATENT_DTYPE)
            arr("latents", s.latents, (s.step, *shape), LATENT_DTYPE)
            arr("log_probs", s.log_probs, (s.step,), LOGP_DTYPE)
