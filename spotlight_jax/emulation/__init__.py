"""Emulation layer: the time and dollar axes of a run on hardware it does not have.

``clock`` (virtual and wall clocks with per-phase accounting), ``cost`` (device datasheets, FLOP
counting, the profile and measured cost models, timing calibration), ``traces`` (SkyPilot spot
traces and synthetic ones, replayed as join/notice/loss events) and ``deployment`` (on-demand
devices plus spot nodes following a trace on a virtual clock, each phase charged by the cost
model). The learning of a run is real computation; only its time axis comes from here.
"""
from spotlight_jax.emulation.clock import DeviceGroup, EventCursor, VirtualClock, WallClock
from spotlight_jax.emulation.deployment import Deployment, DeploymentConfig
from spotlight_jax.emulation.traces import (
    LEAD_TIME_PRESETS,
    Outage,
    Replay,
    ReplayConfig,
    SpotEvent,
    SpotTrace,
    TraceError,
    default_trace_dir,
    load_trace,
    load_traces,
    merge_traces,
    poisson_outages,
    replay,
    synthetic_trace,
)

__all__ = [
    "DeviceGroup", "EventCursor", "VirtualClock", "WallClock", "Deployment", "DeploymentConfig",
    "LEAD_TIME_PRESETS", "Outage", "Replay", "ReplayConfig", "SpotEvent", "SpotTrace",
    "TraceError", "default_trace_dir", "load_trace", "load_traces", "merge_traces",
    "poisson_outages", "replay", "synthetic_trace",
]
