"""Emulation layer: the time and dollar axes of a run on hardware it does not have.

``clock`` (virtual and wall clocks with per-phase accounting), ``datasheets`` (accelerators' peak
numbers, HBM and, for TPUs, list prices and slice topologies), ``slices`` (a TPU slice's chips and
hosts), ``flops`` (FLOP and parameter counts of the MMDiT), ``cost_models`` (the profile and
measured cost models, prices), ``calibration`` (timing this machine for the measured model),
``traces`` (SkyPilot spot traces and synthetic ones, replayed as join/notice/loss events) and
``deployment`` (on-demand devices plus spot nodes following a trace on a virtual clock, each
phase charged by the cost model). The learning of a run is real computation; only its time axis
comes from here.
"""
from spotlight_jax.emulation.calibration import calibrate, median_time
from spotlight_jax.emulation.clock import DeviceGroup, EventCursor, VirtualClock, WallClock
from spotlight_jax.emulation.cost_models import (
    Assumption,
    CostConfig,
    CostModel,
    MeasuredCost,
    Prices,
    ProfileCost,
    Workload,
    make_cost_model,
    profile_for,
)
from spotlight_jax.emulation.datasheets import DEVICES, DeviceSpec, device_spec
from spotlight_jax.emulation.deployment import Deployment, DeploymentConfig
from spotlight_jax.emulation.flops import forward_flops, lora_param_count, param_count
from spotlight_jax.emulation.traces import (
    LEAD_TIME_PRESETS,
    Outage,
    Replay,
    ReplayConfig,
    SpotEvent,
    SpotTrace,
    TraceConfig,
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
    "DeviceGroup", "EventCursor", "VirtualClock", "WallClock",
    "DEVICES", "DeviceSpec", "device_spec", "forward_flops", "lora_param_count", "param_count",
    "Assumption", "CostConfig", "CostModel", "MeasuredCost", "Prices", "ProfileCost", "Workload",
    "make_cost_model", "profile_for", "calibrate", "median_time",
    "Deployment", "DeploymentConfig",
    "LEAD_TIME_PRESETS", "Outage", "Replay", "ReplayConfig", "SpotEvent", "SpotTrace",
    "TraceConfig", "TraceError", "default_trace_dir", "load_trace", "load_traces",
    "merge_traces", "poisson_outages", "replay", "synthetic_trace",
]
