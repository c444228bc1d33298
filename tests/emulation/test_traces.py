"""Spot traces: loader on good and bad files, real traces (when present), synthetic generator
determinism and rates, replay ordering, lead times and abrupt losses."""
import json
import math

import numpy as np
import pytest

from spotlight_jax.elastic import DevicePool
from spotlight_jax.emulation import (
    LEAD_TIME_PRESETS,
    ReplayConfig,
    SpotTrace,
    TraceError,
    default_trace_dir,
    load_trace,
    merge_traces,
    poisson_outages,
    replay,
    synthetic_trace,
)

SKYPILOT = default_trace_dir() / "skypilot"
needs_real_traces = pytest.mark.skipif(
    not SKYPILOT.is_dir(),
    reason=f"real SkyPilot traces not found at {SKYPILOT} (they live in ../shared/traces, outside "
           "the repo; set SPOTLIGHT_TRACES to point elsewhere); synthetic traces cover the same "
           "behaviour")


def _write(tmp_path, name, content):
    p = tmp_path / name
    p.write_text(content if isinstance(content, str) else json.dumps(content))
    return p


def test_load_good_file(tmp_path):
    p = _write(tmp_path, "ok.json", {"metadata": {"gap_seconds": 300}, "data": [0, 1, 2, 1]})
    t = load_trace(p)
    assert t.gap_seconds == 300.0 and t.counts == (0, 1, 2, 1) and t.source == str(p)
    assert t.duration_s == 1200.0 and t.max_count == 2


@pytest.mark.parametrize("content, problem", [
    ("{not json", "invalid JSON at line 1"),
    ([1, 2], "top level must be an object"),
    ({"metadata": {"gap_seconds": 30}}, "missing key 'data'"),
    ({"data": [1]}, "missing key 'metadata'"),
    ({"metadata": {}, "data": [1]}, "missing key 'metadata.gap_seconds'"),
    ({"metadata": {"gap_seconds": -5}, "data": [1]}, "gap_seconds must be a positive number"),
    ({"metadata": {"gap_seconds": "30"}, "data": [1]}, "gap_seconds must be a positive number"),
    ({"metadata": {"gap_seconds": 30}, "data": {"0": 1}}, "'data' must be a list"),
    ({"metadata": {"gap_seconds": 30}, "data": []}, "'data' is empty"),
    ({"metadata": {"gap_seconds": 30}, "data": [1, -1]}, r"data\[1\] = -1 is a negative count"),
    ({"metadata": {"gap_seconds": 30}, "data": [1, 0.5]}, r"data\[1\] = 0.5 is not an integer"),
    ({"metadata": {"gap_seconds": 30}, "data": [True]}, r"data\[0\] = True is not an integer"),
    ({"metadata": {"gap_seconds": 30}, "data": [1, "2"]}, r"data\[1\] = '2' is not an integer"),
])
def test_bad_files_name_file_and_problem(tmp_path, content, problem):
    p = _write(tmp_path, "bad.json", content)
    with pytest.raises(TraceError, match=problem) as e:
        load_trace(p)
    assert str(p) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="file not found") as e:
        load_trace(tmp_path / "nope.json")
    assert "nope.json" in str(e.value)


@needs_real_traces
def test_real_traces_load_and_replay():
    files = sorted(SKYPILOT.rglob("*.json"))
    assert files, f"no traces under {SKYPILOT}"
    for f in files:
        t = load_trace(f)
        assert t.gap_seconds > 0 and t.num_ticks > 0 and min(t.counts) >= 0
    four = [f for f in files if "4-node" in f.parts]
    t = load_trace(four[0])
    assert t.max_count <= 4
    r = replay(t, 4, ReplayConfig.preset("aws", abrupt_fraction=0.2, seed=1))
    drops = sum(max(a - b, 0) for a, b in zip(t.counts, t.counts[1:]))
    assert sum(e.kind == "loss" for e in r.events) == drops
    _check_replay_consistent(t, r, ReplayConfig.preset("aws"))


@needs_real_traces
def test_real_one_node_traces_merge_into_a_pool():
    files = sorted((SKYPILOT / "preemption" / "1-node").glob("aws-04-22-2023/*.json"))
    merged = merge_traces([load_trace(f) for f in files[:2]])
    assert merged.max_count <= 2 and merged.gap_seconds == 32.0
    r = replay(merged, ("spot0", "spot1"), ReplayConfig.preset("aws", seed=3))
    _check_replay_consistent(merged, r, ReplayConfig.preset("aws"))


def test_merge_traces_checks_gap():
    a, b = SpotTrace(30.0, (1, 0, 1)), SpotTrace(30.0, (1, 1))
    assert merge_traces([a, b]).counts == (2, 1)
    with pytest.raises(TraceError, match="different gap_seconds"):
        merge_traces([a, SpotTrace(60.0, (1,))])


def test_synthetic_is_deterministic_per_seed():
    kw = dict(rate_per_node_hour=1.0, mean_outage_s=900.0)
    a = poisson_outages(4, 36000.0, seed=7, **kw)
    assert a == poisson_outages(4, 36000.0, seed=7, **kw)
    assert a != poisson_outages(4, 36000.0, seed=8, **kw)
    # each node has its own stream: adding nodes leaves the first ones' outages unchanged
    more = poisson_outages(6, 36000.0, seed=7, **kw)
    assert [o for o in more if o.node < 4] == list(a)
    t = synthetic_trace(4, 36000.0, seed=7, gap_seconds=60.0, **kw)
    assert t == synthetic_trace(4, 36000.0, seed=7, gap_seconds=60.0, **kw)
    assert t.num_ticks == 600 and 0 <= min(t.counts) and max(t.counts) <= 4


def test_synthetic_trace_samples_the_outages():
    kw = dict(rate_per_node_hour=2.0, mean_outage_s=600.0, seed=3)
    outages = poisson_outages(3, 7200.0, **kw)
    t = synthetic_trace(3, 7200.0, gap_seconds=10.0, **kw)
    for k in range(0, t.num_ticks, 7):
        time = k * 10.0
        assert t.counts[k] == 3 - sum(o.start <= time < o.end for o in outages)


def test_poisson_rate_and_outage_length():
    rate, mean_out, nodes, dur = 0.5, 600.0, 40, 200 * 3600.0
    outages = poisson_outages(nodes, dur, rate_per_node_hour=rate, mean_outage_s=mean_out, seed=0)
    down_h = sum(min(o.end, dur) - o.start for o in outages) / 3600
    exposure_h = nodes * dur / 3600 - down_h  # node-hours up, when preemptions can happen
    expected = rate * exposure_h
    n = len(outages)
    assert abs(n - expected) < 4 * math.sqrt(expected), (n, expected)  # Poisson std = sqrt(mean)
    lengths = np.array([o.end - o.start for o in outages])
    assert abs(lengths.mean() - mean_out) < 4 * mean_out / math.sqrt(n)  # Exp std = mean


def _check_replay_consistent(trace, r, cfg):
    """Events sorted; per node join/notice/loss alternate; up count at each tick matches."""
    keys = [(e.time, ("loss", "join", "notice").index(e.kind), e.node) for e in r.events]
    assert keys == sorted(keys)
    up = set(r.initial_alive)
    noticed = {}
    joined = dict.fromkeys(up, 0.0)
    for e in r.events:
        if e.kind == "notice":
            assert e.node in up and e.node not in noticed
            assert e.deadline - e.time == pytest.approx(
                min(cfg.lead_time_s, e.deadline - joined[e.node]))
            noticed[e.node] = e.deadline
        elif e.kind == "loss":
            assert e.node in up
            assert e.abrupt == (e.node not in noticed)
            if not e.abrupt:
                assert noticed.pop(e.node) == e.time
            up.remove(e.node)
        else:
            assert e.node not in up
            up.add(e.node)
            joined[e.node] = e.time
    # up count after every tick equals the clipped trace count
    up = len(r.initial_alive)
    by_tick = {}
    for e in r.events:
        if e.kind != "notice":
            by_tick[e.time] = by_tick.get(e.time, 0) + (1 if e.kind == "join" else -1)
    for k in range(1, trace.num_ticks):
        up += by_tick.get(k * trace.gap_seconds, 0)
        assert up == min(trace.counts[k], len(r.nodes))


@pytest.mark.parametrize("cloud", sorted(LEAD_TIME_PRESETS))
def test_replay_lead_times_and_order(cloud):
    cfg = ReplayConfig.preset(cloud, seed=5)
    assert cfg.lead_time_s == {"aws": 120.0, "gcp": 30.0, "alibaba": 300.0}[cloud]
    trace = synthetic_trace(3, 20 * 3600.0, rate_per_node_hour=1.0, mean_outage_s=1200.0,
                            gap_seconds=30.0, seed=11)
    r = replay(trace, 3, cfg)
    assert sum(e.kind == "loss" for e in r.events) > 10
    assert all(not e.abrupt for e in r.events)  # abrupt_fraction 0: every loss has a notice
    _check_replay_consistent(trace, r, cfg)
    assert r == replay(trace, 3, cfg)  # deterministic
    assert r.between(0.0, 3600.0) == tuple(e for e in r.events if e.time < 3600.0)


def test_replay_notice_clipped_at_join_and_sorting():
    trace = SpotTrace(60.0, (2, 2, 1, 2, 2, 2, 1))
    r = replay(trace, ("a", "b"), ReplayConfig(lead_time_s=300.0, seed=0))
    # the node lost at t=360 rejoined at t=180 (or was up since 0): notice no earlier than join
    _check_replay_consistent(trace, r, ReplayConfig(lead_time_s=300.0))
    assert [e.kind for e in r.events if e.kind != "notice"] == ["loss", "join", "loss"]


def test_replay_abrupt_fraction():
    trace = synthetic_trace(4, 100 * 3600.0, rate_per_node_hour=1.0, mean_outage_s=600.0,
                            gap_seconds=30.0, seed=2)
    for frac in (0.0, 1.0):
        r = replay(trace, 4, ReplayConfig(abrupt_fraction=frac, seed=1))
        losses = [e for e in r.events if e.kind == "loss"]
        assert all(e.abrupt == (frac == 1.0) for e in losses)
        assert sum(e.kind == "notice" for e in r.events) == (0 if frac else len(losses))
    p = 0.3
    r = replay(trace, 4, ReplayConfig(abrupt_fraction=p, seed=1))
    losses = [e for e in r.events if e.kind == "loss"]
    n, k = len(losses), sum(e.abrupt for e in losses)
    assert n > 200
    assert abs(k - p * n) < 4 * math.sqrt(n * p * (1 - p))  # binomial std
    assert r != replay(trace, 4, ReplayConfig(abrupt_fraction=p, seed=2))


def test_replay_drives_the_pool():
    pool = DevicePool()
    trace = SpotTrace(30.0, (1, 2, 0, 1, 2))
    r = replay(trace, pool.nodes_with_role("spot"), ReplayConfig.preset("gcp", seed=0))
    r.apply_initial(pool)
    assert len(pool.devices(role="spot")) == 2
    for k in range(1, trace.num_ticks):
        for e in r.between((k - 1) * 30.0 + 1e-9, k * 30.0 + 1e-9):
            pool.apply(e)
        alive_nodes = [n for n, d in pool.alive_by_node("spot").items() if d]
        assert len(alive_nodes) == trace.counts[k]


def test_config_validation():
    with pytest.raises(ValueError, match="abrupt_fraction"):
        ReplayConfig(abrupt_fraction=1.5)
    with pytest.raises(ValueError, match="unknown cloud"):
        ReplayConfig.preset("azure")
    with pytest.raises(TraceError, match="no data points"):
        SpotTrace(30.0, ())


def test_window_replays_a_trace_from_a_later_tick():
    t = SpotTrace(300.0, (4, 4, 3, 1, 0, 2, 4), source="t")
    w = t.window(2 * 300.0 + 10.0)                 # rounds down to tick 2
    assert w.counts == (3, 1, 0, 2, 4) and w.gap_seconds == 300.0
    assert w.source == "t@600s"
    assert t.window(0.0) is t
    r = replay(w, 4, ReplayConfig.preset("aws", seed=0))
    assert r.initial_alive == ("spot0", "spot1", "spot2")     # the window's first count is up
    assert [e.time for e in r.events if e.kind == "loss"] == [300.0, 300.0, 600.0]
    with pytest.raises(TraceError, match="past the trace's end"):
        t.window(7 * 300.0)
    with pytest.raises(TraceError, match="non-negative"):
        t.window(-1.0)


def test_deployment_replays_the_configured_window(tmp_path):
    import runpy
    from pathlib import Path

    from spotlight_jax.config import make_deployment
    tiny = Path(__file__).parents[2] / "configs" / "tiny.py"
    get_config = runpy.run_path(str(tiny))["get_config"]
    p = _write(tmp_path, "t.json", json.dumps({"metadata": {"gap_seconds": 300},
                                                "data": [4, 4, 4, 1, 4]}))
    c = get_config()
    c.trace.path = str(p)
    assert len(make_deployment(c).alive_nodes) == 4
    c.trace.start_s = 900.0
    d = make_deployment(c)
    assert len(d.alive_nodes) == 1 and d.trace_source.endswith("@900s")
    assert [e.kind for e in d.replay.events] == ["join"] * 3
    c.trace.start_s = 1500.0
    with pytest.raises(TraceError, match="past the trace's end"):
        make_deployment(c)


def test_comma_separated_one_node_traces_make_a_pool(tmp_path):
    import runpy
    from pathlib import Path

    from spotlight_jax.config import make_deployment
    from spotlight_jax.emulation import load_traces
    a = _write(tmp_path, "a.json", json.dumps({"metadata": {"gap_seconds": 30},
                                               "data": [1, 1, 0, 1]}))
    b = _write(tmp_path, "b.json", json.dumps({"metadata": {"gap_seconds": 30},
                                               "data": [1, 0, 0, 1, 1]}))
    assert load_traces(f"{a}").counts == (1, 1, 0, 1)
    pool = load_traces(f"{a}, {b}")
    assert pool.counts == (2, 1, 0, 2) and pool.gap_seconds == 30.0
    with pytest.raises(TraceError, match="no trace file"):
        load_traces(" , ")
    c = runpy.run_path(str(Path(__file__).parents[2] / "configs" / "tiny.py"))["get_config"]()
    c.trace.path = f"{a},{b}"
    d = make_deployment(c)
    assert len(d.alive_nodes) == 2
    assert [e.kind for e in d.replay.events if e.kind != "notice"] == ["loss", "loss", "join",
                                                                         "join"]
    c.trace.path = f"{a},{tmp_path / 'missing.json'}"
    with pytest.raises(ValueError, match="missing.json.*does not exist"):
        make_deployment(c)
