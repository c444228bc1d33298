"""Spot traces: load SkyPilot-format traces, generate synthetic ones, and replay them as events.

A trace is a count of available spot instances per tick (``SpotTrace``). The SkyPilot traces
published with "Can't Be Late" (NSDI'24) use the JSON format
``{"metadata": {"gap_seconds": G}, "data": [n0, n1, ...]}``; :func:`load_trace` reads it and rejects
bad files with an error naming the file and the problem. :func:`synthetic_trace` makes seeded
traces from Poisson preemptions (a rate per node-hour) and exponential outage lengths, so every
behaviour can be tested without the real files.

:func:`replay` turns a trace and a set of spot nodes into timed :class:`SpotEvent` s: ``join`` when
the count rises, and for each drop a ``loss`` at the tick where the instance is seen missing,
preceded by a ``notice`` ``lead_time_s`` earlier (AWS 120 s, GCP 30 s, Alibaba 300 s), unless the
preemption is drawn abrupt (a configurable fraction): then the loss comes without notice. Which
node goes or comes back when the count changes, and which preemptions are abrupt, is drawn from a
seeded generator: the same trace, nodes and seed always give the same events.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

LEAD_TIME_PRESETS: dict[str, float] = {"aws": 120.0, "gcp": 30.0, "alibaba": 300.0}
EVENT_KINDS = ("loss", "join", "notice")  # also the order of simultaneous events
_KIND_ORDER = {k: i for i, k in enumerate(EVENT_KINDS)}


class TraceError(ValueError):
    """A spot trace file is missing or malformed; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class SpotTrace:
    """Available spot instances per tick: ``counts[k]`` holds at time ``k * gap_seconds``."""

    gap_seconds: float
    counts: tuple[int, ...]
    source: str = "synthetic"

    def __post_init__(self):
        if not (self.gap_seconds > 0 and math.isfinite(self.gap_seconds)):
            raise TraceError(f"{self.source}: gap_seconds must be a positive number, "
                             f"got {self.gap_seconds!r}")
        if not self.counts:
            raise TraceError(f"{self.source}: the trace has no data points")
        if any(c < 0 for c in self.counts):
            raise TraceError(f"{self.source}: counts must be non-negative")

    @property
    def num_ticks(self) -> int:
        return len(self.counts)

    @property
    def duration_s(self) -> float:
        return self.num_ticks * self.gap_seconds

    @property
    def max_count(self) -> int:
        return max(self.counts)

    def times(self) -> np.ndarray:
        return np.arange(self.num_ticks) * self.gap_seconds

    def window(self, start_s: float) -> SpotTrace:
        """The trace from ``start_s`` on (rounded down to a tick), re-timed to start at 0: a
        day-long real trace replayed from its busy hour instead of its first one."""
        if not (math.isfinite(start_s) and start_s >= 0):
            raise TraceError(f"{self.source}: start_s must be a non-negative number of seconds, "
                             f"got {start_s!r}")
        first = int(start_s // self.gap_seconds)
        if first >= self.num_ticks:
            raise TraceError(f"{self.source}: start_s={start_s:g} is past the trace's end "
                             f"({self.duration_s:g} s, {self.num_ticks} ticks of "
                             f"{self.gap_seconds:g} s); pick a start below {self.duration_s:g}")
        if first == 0:
            return self
        return SpotTrace(self.gap_seconds, self.counts[first:],
                         source=f"{self.source}@{first * self.gap_seconds:g}s")


def default_trace_dir() -> Path:
    """Where the real traces live: ``$SPOTLIGHT_TRACES`` or ``<repo>/../shared/traces``."""
    env = os.environ.get("SPOTLIGHT_TRACES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def load_trace(path: str | os.PathLike) -> SpotTrace:
    """Reads a SkyPilot-format trace. Raises :class:`TraceError` naming the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as e:
        raise TraceError(f"spot trace {path}: file not found") from e
    except OSError as e:
        raise TraceError(f"spot trace {path}: cannot read the file ({e})") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"spot trace {path}: invalid JSON at line {e.lineno} column {e.colno}: "
                         f"{e.msg}") from e
    if not isinstance(doc, dict):
        raise TraceError(f"spot trace {path}: the top level must be an object with 'metadata' and "
                         f"'data', got {type(doc).__name__}")
    for key in ("metadata", "data"):
        if key not in doc:
            raise TraceError(f"spot trace {path}: missing key {key!r} (expected "
                             '{"metadata": {"gap_seconds": ...}, "data": [...]})')
    meta = doc["metadata"]
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise TraceError(f"spot trace {path}: missing key 'metadata.gap_seconds'")
    gap = meta["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not gap > 0 \
            or not math.isfinite(gap):
        raise TraceError(f"spot trace {path}: metadata.gap_seconds must be a positive number, "
                         f"got {gap!r}")
    data = doc["data"]
    if not isinstance(data, list):
        raise TraceError(f"spot trace {path}: 'data' must be a list of instance counts, got "
                         f"{type(data).__name__}")
    if not data:
        raise TraceError(f"spot trace {path}: 'data' is empty (no ticks)")
    for i, c in enumerate(data):
        if isinstance(c, bool) or not isinstance(c, int):
            raise TraceError(f"spot trace {path}: data[{i}] = {c!r} is not an integer count")
        if c < 0:
            raise TraceError(f"spot trace {path}: data[{i}] = {c} is a negative count")
    return SpotTrace(gap_seconds=float(gap), counts=tuple(data), source=str(path))


def load_traces(spec: str) -> SpotTrace:
    """One trace from ``spec``: a SkyPilot file, or several separated by commas, merged into a
    pool of independent nodes (:func:`merge_traces`; e.g. four 1-node traces of one day ->
    a 4-node pool)."""
    paths = [p.strip() for p in str(spec).split(",") if p.strip()]
    if not paths:
        raise TraceError(f"no trace file in {spec!r}")
    traces = [load_trace(p) for p in paths]
    return traces[0] if len(traces) == 1 else merge_traces(traces)


def merge_traces(traces: Sequence[SpotTrace]) -> SpotTrace:
    """Sums the counts of traces with the same tick (e.g. several 1-node traces -> a pool of N
    independent nodes), cut to the shortest one."""
    if not traces:
        raise TraceError("merge_traces: no traces given")
    gaps = {t.gap_seconds for t in traces}
    if len(gaps) != 1:
        raise TraceError(f"merge_traces: traces have different gap_seconds {sorted(gaps)} "
                         f"({[t.source for t in traces]}); merge traces of the same tick only")
    n = min(t.num_ticks for t in traces)
    counts = tuple(int(sum(t.counts[k] for t in traces)) for k in range(n))
    return SpotTrace(traces[0].gap_seconds, counts,
                     source="merge(" + ", ".join(t.source for t in traces) + ")")


# ---- synthetic traces --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Outage:
    """Node ``node`` (an index) is preempted at ``start`` and available again at ``end``."""

    node: int
    start: float
    end: float


def poisson_outages(num_nodes: int, duration_s: float, *, rate_per_node_hour: float,
                    mean_outage_s: float, seed: int) -> tuple[Outage, ...]:
    """Seeded outages: each node, while up, is preempted as a Poisson process of rate
    ``rate_per_node_hour``; each outage lasts Exp(mean ``mean_outage_s``). Every node has its own
    stream (seeded by ``(seed, node)``), so adding nodes leaves the others' outages unchanged."""
    if num_nodes < 0 or duration_s <= 0 or rate_per_node_hour < 0 or mean_outage_s <= 0:
        raise ValueError("poisson_outages needs num_nodes >= 0, duration_s > 0, "
                         "rate_per_node_hour >= 0 and mean_outage_s > 0; got "
                         f"{num_nodes}, {duration_s}, {rate_per_node_hour}, {mean_outage_s}")
    out = []
    for node in range(num_nodes):
        if rate_per_node_hour == 0:
            continue
        rng = np.random.default_rng([seed, node])
        t = 0.0
        while True:
            t += rng.exponential(3600.0 / rate_per_node_hour)
            if t >= duration_s:
                break
            length = rng.exponential(mean_outage_s)
            out.append(Outage(node, t, t + length))
            t += length
    return tuple(sorted(out, key=lambda o: (o.start, o.node)))


def outages_to_trace(outages: Sequence[Outage], num_nodes: int, duration_s: float,
                     gap_seconds: float, source: str = "synthetic") -> SpotTrace:
    """Samples outages at ticks: ``counts[k]`` = nodes up at ``k * gap_seconds``."""
    times = np.arange(int(math.ceil(duration_s / gap_seconds))) * gap_seconds
    down = np.zeros(len(times), dtype=np.int64)
    for o in outages:
        down += (times >= o.start) & (times < o.end)
    return SpotTrace(float(gap_seconds), tuple(int(c) for c in num_nodes - down), source)


def synthetic_trace(num_nodes: int, duration_s: float, *, rate_per_node_hour: float,
                    mean_outage_s: float, gap_seconds: float = 30.0, seed: int = 0) -> SpotTrace:
    """A seeded trace from :func:`poisson_outages`, sampled every ``gap_seconds``. Outages shorter
    than a tick may fall between samples, as in the real (sampled) traces."""
    outages = poisson_outages(num_nodes, duration_s, rate_per_node_hour=rate_per_node_hour,
                              mean_outage_s=mean_outage_s, seed=seed)
    return outages_to_trace(outages, num_nodes, duration_s, gap_seconds,
                            source=f"synthetic(nodes={num_nodes}, rate={rate_per_node_hour}/h, "
                                   f"outage={mean_outage_s}s, seed={seed})")


# ---- replay ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """How a trace becomes events: notice lead time, share of abrupt losses, and the seed."""

    lead_time_s: float = LEAD_TIME_PRESETS["aws"]
    abrupt_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.lead_time_s < 0:
            raise ValueError(f"lead_time_s must be >= 0, got {self.lead_time_s}")
        if not 0.0 <= self.abrupt_fraction <= 1.0:
            raise ValueError(f"abrupt_fraction must be in [0, 1], got {self.abrupt_fraction}")

    @classmethod
    def preset(cls, cloud: str, **overrides) -> ReplayConfig:
        """Lead time of a cloud's preemption notice: 'aws' 120 s, 'gcp' 30 s, 'alibaba' 300 s."""
        if cloud not in LEAD_TIME_PRESETS:
            raise ValueError(f"unknown cloud {cloud!r}; presets are {sorted(LEAD_TIME_PRESETS)}")
        return cls(lead_time_s=LEAD_TIME_PRESETS[cloud], **overrides)


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """The ``trace`` config section: which spot availability a deployment replays.

    ``path``: a SkyPilot JSON file, or comma-separated 1-node files merged into a pool of nodes
    (:func:`load_traces`), replayed from ``start_s`` on; empty = a synthetic Poisson trace
    (``rate_per_node_hour``, ``mean_outage_s``, ``seed``). ``cloud`` picks the notice lead time
    (:data:`LEAD_TIME_PRESETS`); ``abrupt_fraction`` of the preemptions come without notice.
    """

    path: str = ""
    start_s: float = 0.0
    rate_per_node_hour: float = 2.0
    mean_outage_s: float = 600.0
    cloud: str = "aws"
    abrupt_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"{name}={getattr(self, name)!r}: {why}")

        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            bad("start_s", "must be a number of seconds >= 0")
        if not (math.isfinite(self.rate_per_node_hour) and self.rate_per_node_hour >= 0):
            bad("rate_per_node_hour", "must be >= 0 preemptions per node-hour (0 = none)")
        if not (math.isfinite(self.mean_outage_s) and self.mean_outage_s > 0):
            bad("mean_outage_s", "must be > 0 seconds (e.g. mean_outage_s=600.0)")
        if self.cloud not in LEAD_TIME_PRESETS:
            bad("cloud", f"choose one of {sorted(LEAD_TIME_PRESETS)}")
        if not 0.0 <= self.abrupt_fraction <= 1.0:
            bad("abrupt_fraction", "must be in [0, 1] (the share of losses without notice)")
        if self.seed < 0:
            bad("seed", "must be >= 0")

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.path.split(",") if p.strip())

    def check_files(self) -> None:
        """Raises :class:`TraceError` naming the first trace file of ``path`` that is missing."""
        for p in self.paths:
            if not os.path.exists(p):
                raise TraceError(f"path={self.path!r}: trace file {p!r} does not exist; give "
                                 "SkyPilot JSON file(s) (comma-separated 1-node traces make a "
                                 "pool of nodes) or leave it empty for a synthetic trace")

    def load(self, num_nodes: int, horizon_s: float) -> SpotTrace:
        """The trace to replay for ``num_nodes`` spot nodes: the files' (from ``start_s`` on), or
        a synthetic one over ``horizon_s`` seconds."""
        if self.paths:
            self.check_files()
            return load_traces(self.path).window(self.start_s)
        return synthetic_trace(num_nodes, horizon_s, rate_per_node_hour=self.rate_per_node_hour,
                               mean_outage_s=self.mean_outage_s, seed=self.seed)

    def replay_config(self) -> ReplayConfig:
        return ReplayConfig.preset(self.cloud, abrupt_fraction=self.abrupt_fraction,
                                   seed=self.seed)


@dataclasses.dataclass(frozen=True)
class SpotEvent:
    """``kind`` is 'join', 'notice' or 'loss'. A notice carries ``deadline`` (the time of its loss);
    a loss is ``abrupt`` when no notice preceded it."""

    time: float
    kind: str
    node: str
    deadline: float | None = None
    abrupt: bool = False


@dataclasses.dataclass(frozen=True)
class Replay:
    """Events of a trace for named nodes. ``initial_alive`` are the nodes up at time 0."""

    nodes: tuple[str, ...]
    initial_alive: tuple[str, ...]
    events: tuple[SpotEvent, ...]
    duration_s: float

    def between(self, t0: float, t1: float) -> tuple[SpotEvent, ...]:
        """Events with ``t0 <= time < t1``, in replay order."""
        return tuple(e for e in self.events if t0 <= e.time < t1)

    def apply_initial(self, pool) -> None:
        """Marks the nodes the trace says are down at time 0 as lost in ``pool``."""
        for node in self.nodes:
            if node not in self.initial_alive:
                pool.mark_node_lost(node, time=0.0, reason="not available at trace start")


def replay(trace: SpotTrace, nodes: int | Sequence[str],
           config: ReplayConfig = ReplayConfig()) -> Replay:
    """Turns a trace into timed join/notice/loss events for ``nodes`` (a count -> 'spot0', ...).

    Counts above the number of nodes are clipped. At time 0 the first ``counts[0]`` nodes are up.
    When the count drops at tick ``t``, that many up nodes (drawn with the seed) are lost at ``t``;
    each gets a notice at ``max(t - lead_time_s, time it joined)`` unless drawn abrupt. When the
    count rises, that many down nodes (drawn) join at ``t``. Events are sorted by time, then
    loss < join < notice, then node name.
    """
    names = tuple(f"spot{i}" for i in range(nodes)) if isinstance(nodes, int) else tuple(nodes)
    if len(set(names)) != len(names):
        raise ValueError(f"replay: node names repeat: {names}")
    n = len(names)
    rng = np.random.default_rng(config.seed)
    counts = [min(c, n) for c in trace.counts]
    alive = list(names[:counts[0]])
    joined_at = dict.fromkeys(alive, 0.0)
    events: list[SpotEvent] = []
    for k in range(1, len(counts)):
        t = k * trace.gap_seconds
        c = counts[k]
        if c < len(alive):
            up = sorted(alive)
            gone = sorted(rng.choice(len(up), size=len(up) - c, replace=False).tolist())
            for i in gone:
                node = up[i]
                abrupt = bool(rng.random() < config.abrupt_fraction)
                if not abrupt:
                    events.append(SpotEvent(max(t - config.lead_time_s, joined_at[node]),
                                            "notice", node, deadline=t))
                events.append(SpotEvent(t, "loss", node, abrupt=abrupt))
                alive.remove(node)
                del joined_at[node]
        elif c > len(alive):
            down = sorted(set(names) - set(alive))
            back = sorted(rng.choice(len(down), size=c - len(alive), replace=False).tolist())
            for i in back:
                node = down[i]
                events.append(SpotEvent(t, "join", node))
                alive.append(node)
                joined_at[node] = t
    events.sort(key=lambda e: (e.time, _KIND_ORDER[e.kind], e.node))
    return Replay(nodes=names, initial_alive=tuple(names[:counts[0]]), events=tuple(events),
                  duration_s=trace.duration_s)
