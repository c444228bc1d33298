"""Clocks: where the runner's time goes, on real hardware and in emulation.

The runner runs real computation but *charges* every operation's duration to a clock, on the
device group that runs it. Two clocks share one API, so the runner's code is identical:

* :class:`VirtualClock` (emulation): time advances only by what is charged. The durations come
  from a cost model (``emulation.cost_models``), e.g. seconds of a 20B MMDiT rollout step on
  H100s, while the learning itself runs on a tiny model on the CPU. This is how the paper's
  time-to-target and cost claims are reproduced without the paper's hardware.
* :class:`WallClock` (real hardware): time is ``time.perf_counter``; a charged operation records
  its real measured duration instead of the modelled one.

Composition. The clock itself is a sequential phase. ``sequential()`` and ``concurrent()`` open
nested phases: a sequential phase lasts the *sum* of its parts, a concurrent one the *max* (train
on the on-demand mesh while spot groups explore)::

    with clock.concurrent() as c:
        c.run("train", od_group, 3.0, trainer.update, batch)   # runs update, charges 3.0 s
        with c.sequential() as s:
            s.run("explore", spot_group, 1.5)
            s.run("explore", spot_group, 1.0)
    # a VirtualClock advanced by max(3.0, 1.5 + 1.0) = 3.0 s; both groups were charged

Accounting (all in device-seconds unless said otherwise):

* busy: ``seconds x group.num_devices`` per (role, label), for utilisation and per-phase
  breakdowns;
* alive: the number of alive devices of each role is a step function of time set by
  :meth:`Clock.set_alive`; its integral is what one pays for (a spot device costs money while it
  is alive, busy or idle). Spot utilisation = busy / alive spot device-seconds;
* critical path (seconds, not device-seconds): every advance of the clock is attributed to the
  label that was on the critical path -- the longest branch of a concurrent phase -- so the
  report can say where the time goes.

Preemptions happen at trace times on the same time axis: :class:`EventCursor` hands out the
events of a time-sorted list up to a time, and its position is part of a checkpoint.

Threads: open phases from the runner's thread; branches running in worker threads charge
through their phase object (``phase.run`` / ``phase.timed``), which is locked. Inside an open
phase a VirtualClock's ``now()`` is the phase's start, so pass ``at=`` to :meth:`Clock.set_alive`
for changes that fall inside it.

``state_dict()`` / ``load_state_dict()`` use plain JSON types and round-trip exactly (Python's
``json`` writes floats with ``repr``), so a resumed run continues with the same clock and cost.
"""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

ROLES = ("on_demand", "spot")  # same as spotlight_jax.elastic.pool.ROLES (tested)
CLOCK_KINDS = ("virtual", "wall")
_STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class DeviceGroup:
    """A set of devices that runs one operation: hashable, with a role and a device count.

    Any object with ``role`` and ``num_devices`` attributes (and optionally ``name``) may be
    charged instead, e.g. a thin wrapper around ``elastic.groups.SPGroup``.
    """

    name: str
    role: str
    num_devices: int

    def __post_init__(self):
        _check_role(self.role)
        if (not isinstance(self.num_devices, int) or isinstance(self.num_devices, bool)
                or self.num_devices < 1):
            raise ValueError(f"DeviceGroup {self.name!r}: num_devices must be a positive integer, "
                             f"got {self.num_devices!r}")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles are {ROLES}")


def _check_seconds(seconds, what: str = "duration") -> float:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {seconds!r}") from None
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"{what} must be finite and >= 0 seconds, got {seconds!r}")
    return s


def _group_info(group) -> tuple[str, int]:
    role = getattr(group, "role", None)
    n = getattr(group, "num_devices", None)
    if role is None or n is None:
        raise ValueError(f"cannot charge {group!r}: a group needs 'role' (one of {ROLES}) and "
                         "'num_devices' attributes (see clock.DeviceGroup)")
    _check_role(role)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"group {group!r} has num_devices {n!r}; it must be a positive integer")
    return role, n


class Phase:
    """A sequential (sum) or concurrent (max) composition of charged operations.

    Obtained from ``clock.sequential()`` / ``clock.concurrent()`` (or the same methods of an
    open phase, to nest). When the ``with`` block ends, the phase's duration is passed to its
    parent; the clock itself is the outermost sequential phase and advances by it.
    ``duration`` is the phase's length so far; ``start`` the clock time when it opened.
    """

    def __init__(self, clock: Clock, parent: Phase | None, kind: str):
        self.clock, self.parent, self.kind = clock, parent, kind
        self.start = clock.now()
        self.duration = 0.0
        self.attribution: dict[str, float] = {}   # critical-path seconds per label
        self._best = -1.0                          # concurrent: the longest branch so far
        self._closed = False
        self._t0 = time.perf_counter()

    # ---- what the runner calls --------------------------------------------------------------
    def run(self, label: str, group, seconds: float | None = None,
            fn: Callable | None = None, *args, **kwargs):
        """Runs ``fn(*args, **kwargs)`` (if given) on ``group`` and charges it under ``label``.

        VirtualClock: charges ``seconds`` (the modelled duration, required). WallClock: charges
        the measured duration of ``fn``, or ``seconds`` when there is no ``fn`` (a duration the
        caller measured). Returns ``fn``'s result (None without ``fn``).
        """
        return self.clock._run(self, label, group, seconds, fn, args, kwargs)

    def charge(self, group, seconds: float, label: str) -> None:
        """Charges ``seconds`` on ``group`` under ``label`` in this phase (no function runs)."""
        self.clock._charge_into(self, group, seconds, label)

    @contextlib.contextmanager
    def timed(self, label: str, group, seconds: float | None = None) -> Iterator[None]:
        """Charges the ``with`` block: ``seconds`` on a VirtualClock, the measured time on a
        WallClock."""
        with self.clock._timed(self, label, group, seconds):
            yield

    def wait(self, seconds: float, label: str = "idle") -> None:
        """Time passes with no device busy (e.g. waiting for a node to join)."""
        self.clock._wait_into(self, seconds, label)

    def sequential(self) -> contextlib.AbstractContextManager[Phase]:
        return self.clock._open(self, "sequential")

    def concurrent(self) -> contextlib.AbstractContextManager[Phase]:
        return self.clock._open(self, "concurrent")

    # ---- composition ------------------------------------------------------------------------
    def _add(self, seconds: float, attribution: dict[str, float]) -> None:
        if self._closed:
            raise RuntimeError(f"{self.kind} phase is closed; charge inside its 'with' block")
        if self.kind == "sequential":
            self.duration += seconds
            for k, v in attribution.items():
                self.attribution[k] = self.attribution.get(k, 0.0) + v
        elif seconds > self._best:   # concurrent: the longest branch is the critical path
            self._best = seconds
            self.duration = seconds
            self.attribution = dict(attribution)


class Clock:
    """Shared bookkeeping of both clocks; see the module docstring. Not used directly."""

    kind = ""

    def __init__(self):
        self._lock = threading.RLock()
        self._stack: list[Phase] = []
        self._reset_accounts()

    def _reset_accounts(self) -> None:
        self._busy: dict[str, dict[str, float]] = {r: {} for r in ROLES}
        self._span: dict[str, float] = {}       # seconds charged per label (not device-weighted)
        self._critical: dict[str, float] = {}   # seconds of clock advance per label
        self._alive: dict[str, list[list]] = {r: [] for r in ROLES}  # [[time, count], ...]
        self._charges = 0

    # ---- time -----------------------------------------------------------------------------
    def now(self) -> float:
        raise NotImplementedError

    def _advance(self, seconds: float, attribution: dict[str, float]) -> None:
        raise NotImplementedError

    # ---- charging -------------------------------------------------------------------------
    def charge(self, group, seconds: float, label: str) -> None:
        """Charges ``seconds`` on ``group`` under ``label`` in the innermost open phase (or
        directly on the clock, which then advances by ``seconds`` if virtual)."""
        self._charge_into(self._current(), group, seconds, label)

    def run(self, label: str, group, seconds: float | None = None,
            fn: Callable | None = None, *args, **kwargs):
        """:meth:`Phase.run` in the innermost open phase (or on the clock itself)."""
        return self._run(self._current(), label, group, seconds, fn, args, kwargs)

    @contextlib.contextmanager
    def timed(self, label: str, group, seconds: float | None = None) -> Iterator[None]:
        """:meth:`Phase.timed` in the innermost open phase (or on the clock itself)."""
        with self._timed(self._current(), label, group, seconds):
            yield

    def wait(self, seconds: float, label: str = "idle") -> None:
        """Time passes with no device busy, in the innermost open phase (or on the clock)."""
        self._wait_into(self._current(), seconds, label)

    def sequential(self) -> contextlib.AbstractContextManager[Phase]:
        """A phase that lasts the sum of its parts (nested in the innermost open phase)."""
        return self._open(self._current(), "sequential")

    def concurrent(self) -> contextlib.AbstractContextManager[Phase]:
        """A phase that lasts the max of its parts (nested in the innermost open phase)."""
        return self._open(self._current(), "concurrent")

    def _current(self) -> Phase | None:
        return self._stack[-1] if self._stack else None

    def _record(self, group, seconds: float, label: str) -> None:
        role, n = _group_info(group)
        if not isinstance(label, str) or not label:
            raise ValueError(f"label must be a non-empty string, got {label!r}")
        with self._lock:
            by_label = self._busy[role]
            by_label[label] = by_label.get(label, 0.0) + seconds * n
            self._span[label] = self._span.get(label, 0.0) + seconds
            self._charges += 1

    def _report(self, phase: Phase | None, seconds: float, attribution: dict[str, float]) -> None:
        with self._lock:
            if phase is None:
                self._advance(seconds, attribution)
            else:
                phase._add(seconds, attribution)

    def _charge_into(self, phase, group, seconds, label) -> None:
        s = _check_seconds(seconds)
        self._record(group, s, label)
        self._report(phase, s, {label: s})

    def _wait_into(self, phase, seconds, label) -> None:
        s = _check_seconds(seconds, "wait")
        self._report(phase, s, {label: s})

    def _run(self, phase, label, group, seconds, fn, args, kwargs):
        raise NotImplementedError

    def _timed(self, phase, label, group, seconds):
        raise NotImplementedError

    @contextlib.contextmanager
    def _open(self, parent: Phase | None, kind: str) -> Iterator[Phase]:
        phase = Phase(self, parent, kind)
        self._stack.append(phase)
        try:
            yield phase
        finally:
            # Close even when the body raised: what was charged did happen.
            if phase in self._stack:
                self._stack.remove(phase)
            phase._closed = True
            self._report(parent, self._phase_seconds(phase), phase.attribution)

    def _phase_seconds(self, phase: Phase) -> float:
        return phase.duration

    # ---- alive devices --------------------------------------------------------------------
    def set_alive(self, role: str, n: int, at: float | None = None) -> None:
        """From time ``at`` (default: now) on, ``n`` devices of ``role`` are alive (and paid).

        Changes of one role must come in non-decreasing time order; ``at`` may lie in the past
        (an event applied after the phase it fell into) or the future (a scheduled change).
        """
        _check_role(role)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"alive count of {role!r} must be an integer >= 0, got {n!r}")
        t = self.now() if at is None else _check_seconds(at, "set_alive time")
        with self._lock:
            steps = self._alive[role]
            if steps and t < steps[-1][0]:
                raise ValueError(f"set_alive({role!r}) at t={t} is earlier than the last change "
                                 f"at t={steps[-1][0]}; changes must come in time order")
            if steps and t == steps[-1][0]:
                steps[-1][1] = n
            else:
                steps.append([t, n])

    def alive(self, role: str, at: float | None = None) -> int:
        """Number of alive devices of ``role`` at time ``at`` (default: now)."""
        _check_role(role)
        t = self.now() if at is None else float(at)
        steps = self._alive[role]
        i = bisect.bisect_right([s[0] for s in steps], t)
        return steps[i - 1][1] if i else 0

    def alive_device_seconds(self, role: str, until: float | None = None) -> float:
        """Integral of the alive count of ``role`` from the first change up to ``until``
        (default: now)."""
        _check_role(role)
        end = self.now() if until is None else float(until)
        total = 0.0
        steps = self._alive[role]
        for (t, n), nxt in zip(steps, steps[1:] + [[math.inf, 0]]):
            if t >= end:
                break
            total += n * (min(nxt[0], end) - t)
        return total

    # ---- queries --------------------------------------------------------------------------
    def busy_device_seconds(self, role: str | None = None, label: str | None = None) -> float:
        """Busy device-seconds charged, filtered by role and/or label (None = all)."""
        if role is not None:
            _check_role(role)
        roles = ROLES if role is None else (role,)
        return sum(v for r in roles for k, v in self._busy[r].items()
                   if label is None or k == label)

    def utilisation(self, role: str, until: float | None = None) -> float:
        """Busy / alive device-seconds of ``role`` (0.0 when none was alive). Meaningful between
        phases: inside an open concurrent phase busy time is charged before time advances."""
        alive = self.alive_device_seconds(role, until)
        return self.busy_device_seconds(role) / alive if alive > 0 else 0.0

    def breakdown(self) -> dict[str, dict[str, float]]:
        """Per label: critical-path seconds, charged seconds, busy device-seconds per role."""
        labels = sorted(set(self._span) | set(self._critical))
        return {lab: {"critical_s": self._critical.get(lab, 0.0),
                      "charged_s": self._span.get(lab, 0.0),
                      **{f"busy_{r}_device_s": self._busy[r].get(lab, 0.0) for r in ROLES}}
                for lab in labels}

    def summary(self) -> dict[str, Any]:
        """Totals for a report: time, busy and alive device-seconds and utilisation per role."""
        return {"time_s": self.now(), "charges": self._charges,
                **{f"busy_{r}_device_s": self.busy_device_seconds(r) for r in ROLES},
                **{f"alive_{r}_device_s": self.alive_device_seconds(r) for r in ROLES},
                **{f"utilisation_{r}": self.utilisation(r) for r in ROLES}}

    # ---- checkpoint -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain JSON types; exact round-trip through ``json.dumps``/``json.loads``."""
        if self._stack:
            raise RuntimeError(f"cannot save the clock inside an open {self._stack[-1].kind} "
                               "phase; save between phases")
        with self._lock:
            return {"version": _STATE_VERSION, "kind": self.kind, "now": self.now(),
                    "busy": {r: dict(v) for r, v in self._busy.items()},
                    "span": dict(self._span), "critical": dict(self._critical),
                    "alive": {r: [list(s) for s in v] for r, v in self._alive.items()},
                    "charges": self._charges}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != self.kind:
            raise ValueError(f"clock state of kind {state.get('kind')!r} cannot load into a "
                             f"{self.kind!r} clock; kinds are {CLOCK_KINDS}")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"clock state version {state.get('version')!r}; this code reads "
                             f"version {_STATE_VERSION}")
        if self._stack:
            raise RuntimeError("cannot load clock state inside an open phase")
        with self._lock:
            self._busy = {r: {k: float(x) for k, x in state["busy"].get(r, {}).items()}
                          for r in ROLES}
            self._span = {k: float(x) for k, x in state["span"].items()}
            self._critical = {k: float(x) for k, x in state["critical"].items()}
            self._alive = {r: [[float(t), int(n)] for t, n in state["alive"].get(r, [])]
                           for r in ROLES}
            self._charges = int(state["charges"])
            self._set_now(float(state["now"]))

    def _set_now(self, t: float) -> None:
        raise NotImplementedError


class VirtualClock(Clock):
    """Emulation clock: time advances only by charged (modelled) durations and waits."""

    kind = "virtual"

    def __init__(self, start: float = 0.0):
        super().__init__()
        self._now = _check_seconds(start, "start time")

    def now(self) -> float:
        return self._now

    def _set_now(self, t: float) -> None:
        self._now = t

    def _advance(self, seconds, attribution) -> None:
        self._now += seconds
        for k, v in attribution.items():
            self._critical[k] = self._critical.get(k, 0.0) + v

    def advance_to(self, t: float, label: str = "idle") -> None:
        """Waits until time ``t`` (no device busy); only outside phases."""
        if self._stack:
            raise RuntimeError("advance_to is only valid outside phases; use phase.wait()")
        t = _check_seconds(t, "advance_to time")
        if t < self._now:
            raise ValueError(f"advance_to({t}) is in the past (now = {self._now})")
        self.wait(t - self._now, label)

    def _run(self, phase, label, group, seconds, fn, args, kwargs):
        if seconds is None:
            raise ValueError(f"VirtualClock.run({label!r}) needs the modelled duration 'seconds' "
                             "(from the cost model)")
        s = _check_seconds(seconds)
        _group_info(group)
        out = fn(*args, **kwargs) if fn is not None else None
        self._charge_into(phase, group, s, label)
        return out

    @contextlib.contextmanager
    def _timed(self, phase, label, group, seconds):
        if seconds is None:
            raise ValueError(f"VirtualClock.timed({label!r}) needs the modelled duration "
                             "'seconds' (from the cost model)")
        s = _check_seconds(seconds)
        _group_info(group)
        yield
        self._charge_into(phase, group, s, label)


class WallClock(Clock):
    """Real-time clock: ``now()`` is ``time.perf_counter()`` since construction (plus the time
    restored from a checkpoint). Charged operations record their measured durations; phases
    only attribute time to labels, since real time advances by itself."""

    kind = "wall"

    def __init__(self, start: float = 0.0):
        super().__init__()
        self._offset = _check_seconds(start, "start time")
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return self._offset + (time.perf_counter() - self._t0)

    def _set_now(self, t: float) -> None:
        self._offset, self._t0 = t, time.perf_counter()

    def _advance(self, seconds, attribution) -> None:
        for k, v in attribution.items():
            self._critical[k] = self._critical.get(k, 0.0) + v

    def _phase_seconds(self, phase: Phase) -> float:
        # Real elapsed time of the block: it includes the gaps between charged operations.
        return time.perf_counter() - phase._t0

    def _run(self, phase, label, group, seconds, fn, args, kwargs):
        _group_info(group)
        if fn is None:
            if seconds is None:
                raise ValueError(f"WallClock.run({label!r}) needs fn to time or measured "
                                 "'seconds'")
            self._charge_into(phase, group, seconds, label)
            return None
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self._charge_into(phase, group, time.perf_counter() - t0, label)
        return out

    @contextlib.contextmanager
    def _timed(self, phase, label, group, seconds):
        _group_info(group)
        t0 = time.perf_counter()
        yield
        self._charge_into(phase, group, time.perf_counter() - t0, label)

    def _wait_into(self, phase, seconds, label) -> None:
        s = _check_seconds(seconds, "wait")
        time.sleep(s)
        self._report(phase, s, {label: s})


def make_clock(kind: str) -> Clock:
    """``'virtual'`` (emulation) or ``'wall'`` (real hardware)."""
    if kind == "virtual":
        return VirtualClock()
    if kind == "wall":
        return WallClock()
    raise ValueError(f"unknown clock kind {kind!r}; choose one of {CLOCK_KINDS}")


# --------------------------------------------------------------------------------- events

def events_until(events: Sequence, t: float, start: int = 0,
                 key: Callable[[Any], float] = lambda e: e.time) -> tuple[list, int]:
    """Events of the time-sorted ``events`` from index ``start`` with ``key(e) <= t``.

    Returns ``(due_events, next_start)``: everything that has happened by time ``t`` and not
    been handed out before.
    """
    i = start
    while i < len(events) and key(events[i]) <= t:
        i += 1
    return list(events[start:i]), i


class EventCursor:
    """Hands out a time-sorted event list (e.g. ``traces.Replay.events``) as the clock moves.

    The position is checkpointed (``state_dict``) so a resumed run sees each event exactly once.
    """

    def __init__(self, events: Sequence, position: int = 0,
                 key: Callable[[Any], float] = lambda e: e.time):
        times = [key(e) for e in events]
        bad = next((i for i in range(1, len(times)) if times[i] < times[i - 1]), None)
        if bad is not None:
            raise ValueError(f"events must be sorted by time: event {bad} at t={times[bad]} "
                             f"comes after t={times[bad - 1]}")
        self.events, self.key = tuple(events), key
        self.position = self._check_position(position)

    def _check_position(self, position) -> int:
        if not isinstance(position, int) or not 0 <= position <= len(self.events):
            raise ValueError(f"event position must be an integer in [0, {len(self.events)}], "
                             f"got {position!r}")
        return position

    def events_until(self, t: float) -> list:
        """The events with time <= ``t`` not handed out yet, in order."""
        due, self.position = events_until(self.events, t, self.position, self.key)
        return due

    def next_time(self) -> float | None:
        """Time of the next pending event (None when none is left)."""
        return self.key(self.events[self.position]) if self.position < len(self.events) else None

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = self._check_position(state["position"])
