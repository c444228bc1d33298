"""Requests and their committed state: what the scheduler owns and what a worker sends back.

A :class:`Request` is one rollout (a training trajectory: every latent and per-step log-prob is
kept), one exploration job (a candidate seed scored by its final image only) or one gradient
shard of a shared update (``kind='shard'``, one "step": its gradient travels to the update's
accumulator, not through the queue, which only decides who computes it, exactly once, with
which weights). Its
:class:`CommittedState` is the last state the queue accepted: the step index reached, the latent
after that step, and for rollouts the trajectory so far. It is plain numpy arrays plus JSON-able
metadata (``to_state()`` gives ``(arrays, meta)``), so it goes into an Orbax checkpoint and across
processes unchanged.

Workers report progress as :class:`Commit` s: the *delta* of one chunk (steps ``start+1 ..
step``), not the whole trajectory, so a commit costs one chunk of host transfer however long the
trajectory already is. :func:`validate_commit` checks a commit against the committed state and
raises :class:`CommitRejected` with a message naming the request and the problem; the queue then
re-runs the request from its last good commit (it is never dropped).

Why resuming is exact: the rollout noise of step ``i`` is a pure function of ``(seed, i)``
(``spotlight_jax.diffusion.rollout``), so a request continued from ``(step, latent)`` anywhere
computes the same bits as one that never stopped, provided the program that runs it computes a
row the same way (see ``worker.py`` on batch shapes and SP degree).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

KINDS = ("rollout", "explore", "shard")
LATENT_DTYPE = np.dtype(np.float32)
LOGP_DTYPE = np.dtype(np.float32)


class CommitRejected(ValueError):
    """A commit the queue refused (malformed state, unknown request id, wrong policy version...).

    ``rid`` is the request id the commit named, ``reason`` the problem. When ``rid`` is a known,
    leased request the queue has already put it back to pending at its last good commit.
    """

    def __init__(self, rid: str, reason: str):
        super().__init__(f"commit for request {rid!r} rejected: {reason}")
        self.rid = rid
        self.reason = reason


def pixels(latent: np.ndarray) -> np.ndarray:
    """A pixel model's final latent(s) as an image in [0, 1] (the map of
    ``diffusion.to_image``, in numpy so that every process computes the same bits)."""
    return np.clip((np.asarray(latent) + np.float32(1.0)) * np.float32(0.5), 0.0, 1.0)


def _frozen(a: np.ndarray | None) -> np.ndarray | None:
    """A read-only copy: committed arrays are shared by snapshots and must never change."""
    if a is None:
        return None
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


@dataclasses.dataclass(frozen=True)
class CommittedState:
    """The last accepted state of a request.

    ``step``: denoising steps done (0 .. num_steps). ``latent``: x after ``step`` steps (None at
    step 0: the initial latent is the seed's noise, recomputed by the worker). Rollouts also keep
    ``initial`` (x at step 0), ``latents [step, *shape]`` (x after each step) and ``log_probs
    [step]``; exploration requests keep only the latent (their reward needs the final image).
    ``versions[i]``: the policy version that ran step ``i``. ``layouts``: the numerics signatures
    (batch shape, SP degree, strategy) of the programs that ran it, as provenance: a trajectory
    run under one signature is bit-identical to an undisturbed run under it.
    """

    step: int = 0
    latent: np.ndarray | None = None
    initial: np.ndarray | None = None
    latents: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    versions: tuple[int, ...] = ()
    layouts: tuple[str, ...] = ()

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        """``(arrays, meta)``: numpy arrays by name (absent ones left out) and JSON types."""
        arrays = {k: np.asarray(v) for k, v in (("latent", self.latent),
                                                ("initial", self.initial),
                                                ("latents", self.latents),
                                                ("log_probs", self.log_probs)) if v is not None}
        meta = {"step": int(self.step), "versions": [int(v) for v in self.versions],
                "layouts": list(self.layouts)}
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict, meta: dict) -> CommittedState:
        def get(name):
            return _frozen(np.asarray(arrays[name])) if name in arrays else None
        return cls(step=int(meta["step"]), latent=get("latent"), initial=get("initial"),
                   latents=get("latents"), log_probs=get("log_probs"),
                   versions=tuple(int(v) for v in meta["versions"]),
                   layouts=tuple(meta["layouts"]))


@dataclasses.dataclass(frozen=True)
class Request:
    """One rollout or exploration job and its committed state.

    ``policy_version``: for a rollout, the version it must run on (the trainer's current one when
    submitted); for an exploration request, the version it was submitted under (it may run on
    any, and ``state.versions`` records what it ran on).
    """

    rid: str
    prompt: str
    seed: int
    num_steps: int
    kind: str = "rollout"
    policy_version: int = 0
    state: CommittedState = CommittedState()

    def __post_init__(self):
        if not isinstance(self.rid, str) or not self.rid:
            raise ValueError(f"request id must be a non-empty string, got {self.rid!r}")
        if self.kind not in KINDS:
            raise ValueError(f"request {self.rid!r}: kind {self.kind!r} is not one of {KINDS}")
        if not isinstance(self.num_steps, (int, np.integer)) or self.num_steps < 1:
            raise ValueError(f"request {self.rid!r}: num_steps must be a positive integer, "
                             f"got {self.num_steps!r}")
        if not 0 <= int(self.seed) < 2**32:
            raise ValueError(f"request {self.rid!r}: seed {self.seed} is not a uint32")

    @property
    def done(self) -> bool:
        return self.state.step >= self.num_steps

    @property
    def remaining(self) -> int:
        return self.num_steps - self.state.step

    @property
    def is_rollout(self) -> bool:
        return self.kind == "rollout"

    @property
    def needs_version(self) -> bool:
        """Whether only its exact ``policy_version`` may run it (a training rollout is sampled,
        a gradient shard computed, with the weights being trained; exploration takes any)."""
        return self.kind in ("rollout", "shard")

    def image(self) -> np.ndarray:
        """The final image in [0, 1] (same map as ``diffusion.to_image``); needs ``done``."""
        if not self.done:
            raise ValueError(f"request {self.rid!r} is at step {self.state.step} of "
                             f"{self.num_steps}: no final image yet")
        return pixels(self.state.latent)

    def trajectory(self) -> dict[str, np.ndarray]:
        """A rollout's result in ``Sampler.rollout`` layout (one sample): ``latents [T+1, ...]``
        (x_T first), ``log_probs [T]``, ``images``."""
        if not (self.done and self.is_rollout):
            raise ValueError(f"request {self.rid!r} ({self.kind}, step {self.state.step}/"
                             f"{self.num_steps}) has no complete rollout trajectory")
        s = self.state
        return {"latents": np.concatenate([s.initial[None], s.latents]),
                "log_probs": s.log_probs, "images": self.image()}

    def to_state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays, state_meta = self.state.to_state()
        meta = {"rid": self.rid, "prompt": self.prompt, "seed": int(self.seed),
                "num_steps": int(self.num_steps), "kind": self.kind,
                "policy_version": int(self.policy_version), "state": state_meta}
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict, meta: dict) -> Request:
        return cls(rid=meta["rid"], prompt=meta["prompt"], seed=int(meta["seed"]),
                   num_steps=int(meta["num_steps"]), kind=meta["kind"],
                   policy_version=int(meta["policy_version"]),
                   state=CommittedState.from_state(arrays, meta["state"]))


@dataclasses.dataclass(frozen=True)
class Commit:
    """Progress of one request over one chunk, sent by the worker that holds its lease.

    The chunk continued from committed step ``start`` and reached ``step``. ``latent``: x after
    ``step``. Rollouts also send ``latents [step-start, *shape]`` and ``log_probs [step-start]``
    for the chunk's steps, and ``initial`` (x at step 0) when ``start == 0``. ``policy_version``:
    the version that ran the chunk; ``layout``: the numerics signature of the program.
    """

    rid: str
    start: int
    step: int
    latent: np.ndarray | None
    policy_version: int
    latents: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    initial: np.ndarray | None = None
    layout: str = ""

    @property
    def num_steps(self) -> int:
        return self.step - self.start


def _check_array(rid: str, name: str, a, shape: Sequence[int], dtype: np.dtype) -> None:
    if not isinstance(a, np.ndarray):
        raise CommitRejected(rid, f"{name} must be a numpy array (host memory), got "
                                  f"{type(a).__name__}")
    if a.dtype != dtype:
        raise CommitRejected(rid, f"{name} has dtype {a.dtype}, expected {dtype}")
    if tuple(a.shape) != tuple(shape):
        raise CommitRejected(rid, f"{name} has shape {tuple(a.shape)}, expected {tuple(shape)}")
    if not np.isfinite(a).all():
        raise CommitRejected(rid, f"{name} has non-finite values")


def validate_commit(req: Request, c: Commit, latent_shape: Sequence[int]) -> None:
    """Raises :class:`CommitRejected` unless ``c`` extends ``req``'s committed state exactly:
    it starts at the committed step, ends in ``(start, num_steps]``, arrays have the latent
    shape/dtype and are finite, the chunk's last latent is the reported latent, and a rollout ran
    on its required policy version."""
    rid, shape = req.rid, tuple(latent_shape)
    if c.rid != rid:
        raise CommitRejected(c.rid, f"commit names request {c.rid!r} but was checked against "
                                    f"{rid!r}")
    committed = req.state.step
    if isinstance(c.start, bool) or not isinstance(c.start, (int, np.integer)) \
            or isinstance(c.step, bool) or not isinstance(c.step, (int, np.integer)):
        raise CommitRejected(rid, f"start/step must be integers, got {c.start!r}/{c.step!r}")
    if c.start != committed:
        raise CommitRejected(rid, f"chunk starts at step {c.start} but the last good commit is at "
                                  f"step {committed}")
    if not committed < c.step <= req.num_steps:
        raise CommitRejected(rid, f"step {c.step} out of range: must be in "
                                  f"({committed}, {req.num_steps}]")
    if req.kind == "shard":          # no latent: the gradient goes to the accumulator
        if c.latent is not None:
            raise CommitRejected(rid, "a gradient shard's commit carries no latent")
    else:
        _check_array(rid, "latent", c.latent, shape, LATENT_DTYPE)
    if isinstance(c.policy_version, bool) or not isinstance(c.policy_version, (int, np.integer)):
        raise CommitRejected(rid, f"policy_version must be an integer, got {c.policy_version!r}")
    if req.needs_version and c.policy_version != req.policy_version:
        raise CommitRejected(rid, f"{'training rollout' if req.is_rollout else 'gradient shard'}"
                                  f" ran on policy version {c.policy_version}; it must run on "
                                  f"version {req.policy_version}")
    if req.is_rollout:
        n = c.step - c.start
        if c.latents is None or c.log_probs is None:
            raise CommitRejected(rid, "a rollout commit needs latents and log_probs")
        _check_array(rid, "latents", c.latents, (n, *shape), LATENT_DTYPE)
        _check_array(rid, "log_probs", c.log_probs, (n,), LOGP_DTYPE)
        if not np.array_equal(c.latents[-1], c.latent):
            raise CommitRejected(rid, "latent differs from the chunk's last latent")
        if c.start == 0:
            if c.initial is None:
                raise CommitRejected(rid, "the first commit of a rollout needs 'initial' "
                                          "(the latent at step 0)")
            _check_array(rid, "initial", c.initial, shape, LATENT_DTYPE)


def apply_commit(req: Request, c: Commit) -> Request:
    """``req`` with ``c`` appended to its committed state (``c`` must be valid)."""
    s = req.state
    n = c.step - c.start
    layouts = s.layouts if (c.layout in s.layouts or not c.layout) else (*s.layouts, c.layout)
    if req.is_rollout:
        initial = s.initial if c.start > 0 else _frozen(c.initial)
        latents = _frozen(c.latents) if s.latents is None else _frozen(
            np.concatenate([s.latents, c.latents]))
        log_probs = _frozen(c.log_probs) if s.log_probs is None else _frozen(
            np.concatenate([s.log_probs, c.log_probs]))
    else:
        initial = latents = log_probs = None
    state = CommittedState(step=int(c.step), latent=_frozen(c.latent), initial=initial,
                           latents=latents, log_probs=log_probs,
                           versions=s.versions + (int(c.policy_version),) * n, layouts=layouts)
    return dataclasses.replace(req, state=state)
