"""Spot TPU slices in the emulated deployment: the TPU datasheets (every number with its source),
a spot slice lost whole in one trace event after GCP's 30 s notice, SP groups priced over ICI
(against the closed form by hand), TPU list prices, the one-line errors of a slice that does not
fit, and the TPU configs, whose dry runs fit their chips' HBM."""
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

from spotlight_jax.config import ConfigError, RunSpec, load_config, make_deployment, validate
from spotlight_jax.elastic import DevicePool
from spotlight_jax.emulation import cost_models, datasheets
from spotlight_jax.emulation.cost_models import CostConfig
from spotlight_jax.emulation.slices import slice_shape, slice_sizes, topology_chips

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIB = 1024**3

# What the sources say, copied here by hand from the pages (not from datasheets.py): peak bf16
# TFLOP/s, HBM GB/s, ICI GB/s (bidirectional), HBM GB, chips per host; and the SkyPilot catalog
# rows' prices, $ per hour for the row's chips (us-central1-a).
PAGES = {"tpu_v5e": (197.0, 819.0, 400.0, 16.0, 8), "tpu_v5p": (459.0, 2765.0, 1200.0, 95.0, 4),
         "tpu_v6e": (918.0, 1638.0, 800.0, 32.0, 8)}
CATALOG = {"tpu_v5e": (8, 9.60, 1.95941), "tpu_v5p": (4, 16.80, 3.3428),
           "tpu_v6e": (8, 21.60, 4.35366)}


def _tpu(**overrides):
    """configs/tiny.py on spot TPU v5e 4x4 slices (16 chips on 2 hosts): 4 on-demand chips (a
    2x2 slice) + 3 spot slices, the v5e's list prices, GCP's notice, every loss with notice."""
    return load_config("tiny", {
        "cost.device": "tpu_v5e", "cost.price_source": "datasheet", "trace.cloud": "gcp",
        "trace.abrupt_fraction": 0.0, "deployment.on_demand_devices": 4,
        "deployment.spot_slice": "4x4", "deployment.spot_devices_per_node": 16,
        "deployment.spot_nodes": 3, "deployment.spot_sp": 4, **overrides})


def _trace_file(tmp_path, counts, gap=60):
    path = tmp_path / "slices.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": list(counts)}))
    return str(path)


# ------------------------------------------------------------------------------ datasheets

@pytest.mark.parametrize("key", sorted(datasheets.DEVICES))
def test_every_datasheet_number_is_in_its_source(key):
    spec = datasheets.DEVICES[key]
    for number in (spec.bf16_tflops, spec.hbm_gb_s, spec.interconnect_gb_s, spec.hbm_gb):
        assert number > 0
        # as the source writes it: 989, 2,039 (GB/s) or 3.35 TB/s
        written = (f"{number:g}", f"{number:,.0f}", f"{number / 1000:g} TB/s")
        assert any(w in spec.source for w in written), (key, number)
    assert f"{spec.hbm_gb:g} GB" in spec.source and spec.interconnect in spec.source
    if spec.is_tpu:
        assert spec.interconnect == "ICI" and spec.has_prices
        assert spec.price_source and spec.topology_source


@pytest.mark.parametrize("key", sorted(PAGES))
def test_tpu_datasheets_match_the_pages_and_the_price_catalog(key):
    spec = datasheets.device_spec(key)
    tflops, hbm_bw, ici, hbm, per_host = PAGES[key]
    assert (spec.bf16_tflops, spec.hbm_gb_s, spec.interconnect_gb_s, spec.hbm_gb,
            spec.chips_per_host) == (tflops, hbm_bw, ici, hbm, per_host)
    chips, on_demand, spot = CATALOG[key]
    assert spec.on_demand_per_hour * chips == pytest.approx(on_demand)
    assert spec.spot_per_hour * chips == pytest.approx(spot)
    assert f"${on_demand:.2f}" in spec.price_source and f"${spot}" in spec.price_source


def test_known_v5e_numbers_and_list_prices_per_chip():
    v5e = datasheets.device_spec("tpu_v5e")
    assert (v5e.bf16_tflops, v5e.hbm_gb, v5e.hbm_gb_s, v5e.interconnect_gb_s) == (
        197.0, 16.0, 819.0, 400.0)
    assert v5e.on_demand_per_hour == pytest.approx(1.20)
    assert datasheets.device_spec("tpu_v5p").on_demand_per_hour == pytest.approx(4.20)
    assert datasheets.device_spec("tpu_v6e").on_demand_per_hour == pytest.approx(2.70)
    assert v5e.nvlink_gb_s == v5e.interconnect_gb_s       # the former name still reads it


@pytest.mark.parametrize("kind, key", [
    ("TPU v5 lite", "tpu_v5e"), ("TPU v5", "tpu_v5p"), ("TPU v6 lite", "tpu_v6e"),
    ("NVIDIA H100 80GB HBM3", "h100_sxm"), ("NVIDIA A100-SXM4-80GB", "a100_sxm"),
    ("TPU v4", None), ("cpu", None)])
def test_a_jax_device_kind_finds_its_datasheet(kind, key):
    spec = datasheets.spec_for_device_kind(kind)
    assert spec is (None if key is None else datasheets.DEVICES[key])


# ------------------------------------------------------------------------------ topologies

@pytest.mark.parametrize("device, topology, chips, hosts", [
    # the v5e page's table: 1x1 is 1/8 of a host, 2x4 one host, 4x8 four, 16x16 thirty-two
    ("tpu_v5e", "1x1", 1, 1), ("tpu_v5e", "2x2", 4, 1), ("tpu_v5e", "2x4", 8, 1),
    ("tpu_v5e", "4x4", 16, 2), ("tpu_v5e", "4x8", 32, 4), ("tpu_v5e", "16x16", 256, 32),
    # the v5p page's table: 2x2x1 4 chips 1 host, 2x2x2 8/2, 2x4x4 32/8, 16x16x24 6144/1536
    ("tpu_v5p", "2x2x1", 4, 1), ("tpu_v5p", "2x2x2", 8, 2), ("tpu_v5p", "2x4x4", 32, 8),
    ("tpu_v5p", "16x16x24", 6144, 1536)])
def test_a_slice_is_its_chips_on_its_hosts(device, topology, chips, hosts):
    shape = slice_shape(device, topology)
    assert (shape.chips, shape.hosts, shape.multi_host) == (chips, hosts, hosts > 1)
    assert topology_chips(topology) == chips


def test_slice_sizes_and_bad_topologies():
    assert slice_sizes("tpu_v5e") == (1, 4, 8, 16, 32, 64, 128, 256)
    with pytest.raises(ValueError, match=r"topology='3x3': not a Google TPU v5e slice "
                                         r"topology; choose one of 1x1, 2x2, 2x4"):
        slice_shape("tpu_v5e", "3x3")
    with pytest.raises(ValueError, match="device='h100_sxm': not a TPU"):
        slice_shape("h100_sxm", "2x2")
    with pytest.raises(ValueError, match="e.g. '2x4'"):
        topology_chips("2x")


# --------------------------------------------------------------- a slice is preempted whole

def test_one_loss_event_removes_every_chip_and_host_of_the_slice(tmp_path):
    # 3 slices up, one gone at t=120 (the trace counts slices), back at t=240
    c = _tpu(**{"trace.path": _trace_file(tmp_path, [3, 3, 2, 2, 3])})
    d = make_deployment(c)
    assert d.slice.chips == 16 and d.slice.hosts == 2 and d.spot_devices == 48
    events = [(e.time, e.kind, e.deadline) for e in d.replay.events]
    assert events == [(90.0, "notice", 120.0), (120.0, "loss", None), (240.0, "join", None)]
    node = d.replay.events[1].node
    assert {e.node for e in d.replay.events} == {node}

    d.clock.advance_to(119.0)
    d.advance()
    assert d.spot_devices == 48                 # the notice warns; nothing is lost yet
    d.clock.advance_to(120.0)
    d.advance()
    assert d.spot_devices == 48 - 16 and d.stats["preemptions"] == 1
    assert d.clock.alive("spot") == 32
    d.clock.advance_to(240.0)
    d.advance()
    assert d.spot_devices == 48 and d.stats["joins"] == 1


def test_the_pull_schedulers_pool_loses_the_whole_slice_in_one_event(tmp_path):
    c = _tpu(**{"trace.path": _trace_file(tmp_path, [3, 3, 2, 2, 3])})
    d = make_deployment(c)
    setup = d.scheduler_setup(num_devices=4 + 3 * 16, horizon_s=600.0)
    assert setup["pool"].nodes == (("od0", "on_demand", 4), ("spot0", "spot", 16),
                                   ("spot1", "spot", 16), ("spot2", "spot", 16))
    losses = [e for e in setup["events"] if e.kind == "loss"]
    assert len(losses) == 1 and losses[0].time == 120.0
    # the deployment's devices only carry identities: stand-ins with an id
    pool = DevicePool(setup["pool"], [types.SimpleNamespace(id=i) for i in range(52)])
    changes = pool.apply(losses[0])
    lost = losses[0].node
    assert len(changes) == 1 and len(changes[0].devices) == 16
    assert set(changes[0].devices) == {dev.id for dev in pool.devices(lost, alive=None)}
    assert pool.alive_devices(lost) == ()
    assert sum(len(v) for v in pool.alive_by_role().values()) == 52 - 16


def test_every_slice_loss_comes_30_s_after_its_notice():
    d = make_deployment(_tpu(**{"trace.rate_per_node_hour": 6.0}))
    assert d.replay_lead_s == 30.0
    joined = dict.fromkeys(d.replay.initial_alive, 0.0)
    notices = {}
    losses = 0
    for e in d.replay.events:
        if e.kind == "join":
            joined[e.node] = e.time
        elif e.kind == "notice":
            notices[e.node] = e
        else:
            losses += 1
            n = notices.pop(e.node)             # abrupt_fraction 0: every loss is announced
            assert n.deadline == e.time
            assert n.time == max(e.time - 30.0, joined[e.node])
    assert losses > 10


# ---------------------------------------------------------------------- SP groups over ICI

def test_sp_collectives_on_a_tpu_go_over_ici_by_the_closed_form():
    # Qwen-Image at 512 px: 60 joint blocks of width 3072, 1024 image + 256 text tokens,
    # 24 heads; a batch of 8 with CFG (2 passes), bf16 activations, half the bidirectional
    # ICI one way, 20 us per collective
    cost = make_deployment(_tpu()).cost
    assert cost.sp_strategy(4) == "ulysses" and cost.sp_strategy(5) == "ring"
    local = 8 * 2 * (1280 / 4) * 3072 * 2
    ulysses = 60 * (4 * local * 3 / 4 / (400e9 * 0.5) + 2 * 20e-6)
    assert cost.sp_comm(8, 4) == pytest.approx(ulysses)
    assert ulysses == pytest.approx(0.030711552)
    local = 8 * 2 * (1280 / 5) * 3072 * 2
    ring = 60 * (2 * local * 4 / (400e9 * 0.5) + 4 * 20e-6)
    assert cost.sp_comm(8, 5) == pytest.approx(ring)
    # the same group on H100s: NVLink's 900 GB/s
    h100 = make_deployment(load_config("tiny")).cost
    assert h100.sp_comm(8, 4) == pytest.approx(
        60 * (4 * 8 * 2 * 320 * 3072 * 2 * 3 / 4 / (900e9 * 0.5) + 2 * 20e-6))
    rows = {a.name: a for a in cost.describe()}
    assert rows["ici_bandwidth"].value == 400.0 and "nvlink_bandwidth" not in rows
    assert {a.name for a in h100.describe()} >= {"nvlink_bandwidth"}


def test_a_joined_slice_regroups_over_ici():
    cost = make_deployment(_tpu()).cost
    assert cost.regroup("grow") == pytest.approx(
        7.6e-3 + 20_430_401_088 * 2 / (400e9 * 0.5))


# -------------------------------------------------------------------------------- prices

def test_datasheet_prices_price_the_alive_chips():
    d = make_deployment(_tpu(**{"deployment.on_demand_devices": 8,
                                "cost.device": "tpu_v5e"}))
    hourly = d.cost.dollars_per_hour({"on_demand": 8, "spot": 48})
    assert hourly == pytest.approx(8 * 9.60 / 8 + 48 * 1.95941 / 8)
    rows = {a.name: a for a in d.assumptions()}
    assert rows["spot_price"].value == pytest.approx(1.95941 / 8)
    assert "SkyPilot GCP catalog" in rows["on_demand_price"].source
    assert rows["spot_discount"].value == pytest.approx(1 - 1.95941 / 9.60)
    assert rows["spot_slice"].value == "Google TPU v5e 4x4 slice (16 chips on 2 hosts)"
    assert rows["preemption_notice"].value == 30.0
    # the config's prices stay the default, on any device
    assert CostConfig(device="tpu_v5e").prices == cost_models.Prices(3.90, 0.73)


# --------------------------------------------------------------- a slice that does not fit

@pytest.mark.parametrize("overrides, message", [
    ({"deployment.spot_slice": "3x3"},
     "deployment.spot_slice='3x3': not a Google TPU v5e slice topology; choose one of 1x1, "
     "2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
    ({"deployment.spot_slice": "2x4"},
     "deployment.spot_devices_per_node=16: one spot node is one Google TPU v5e 2x4 slice (8 "
     "chips on 1 host); set deployment.spot_devices_per_node=8"),
    ({"deployment.on_demand_devices": 6},
     "deployment.on_demand_devices=6: the on-demand Google TPU v5e chips are one slice (the "
     "trainer's, on ICI), of 1, 4, 8, 16, 32, 64, 128, 256 chips; choose one of these"),
    ({"trace.cloud": "aws"},
     "trace.cloud='aws': a TPU slice is GCP spot capacity, preempted after GCP's 30 s notice; "
     "set trace.cloud='gcp'"),
    ({"deployment.spot_slice": ""},
     "deployment.spot_slice='': cost.device='tpu_v5e' is a TPU, rented in slices; set "
     "deployment.spot_slice='<topology>', one of 1x1, 2x2"),
    ({"cost.device": "h100_sxm", "cost.price_source": "config"},
     "deployment.spot_slice='4x4': cost.device='h100_sxm' is not a TPU; leave spot_slice "
     "empty"),
    ({"cost.device": "h100_sxm"},
     "cost.price_source='datasheet': cost.device='h100_sxm' has no list prices"),
    ({"deployment.spot_slice": "4by4"}, "deployment.spot_slice='4by4': write a TPU slice"),
    ({"deployment.spot_sp": 3},
     "deployment.spot_sp=3: must divide deployment.spot_devices_per_node=16"),
])
def test_a_slice_that_does_not_fit_is_a_one_line_error(overrides, message):
    c = _tpu(**overrides)
    with pytest.raises(ConfigError) as e:
        validate(c)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=re.escape(message)):     # the study's entry too
        make_deployment(c)


# ------------------------------------------------------------------------------ the configs

def _hbm_line(report: str) -> str:
    return next(line for line in report.splitlines() if line.startswith("HBM of"))


def _per_device_gib(report: str) -> float:
    line = next(line for line in report.splitlines() if line.startswith("per device:"))
    return float(line.rsplit("=", 1)[1].split()[0])


@pytest.mark.parametrize("name, chips, spot_chips", [("qwen_image_tpu", 8, 4),
                                                     ("wan21_14b_tpu", 32, 8)])
def test_the_tpu_configs_build_their_slices(name, chips, spot_chips):
    c = load_config(name)
    spec = RunSpec.from_config(c)
    d = spec.make_deployment()
    assert d.slice.device == "tpu_v5p" and d.slice.chips == spot_chips
    assert spec.deployment.on_demand_devices == chips == spec.process.num_cpu_devices
    assert math.prod(spec.mesh.resolve(chips)) == chips      # the trainer is the one slice
    assert d.cost.prices.on_demand_per_hour == pytest.approx(4.20)
    assert d.cost.prices.spot_per_hour == pytest.approx(3.3428 / 4)
    assert d.replay_lead_s == 30.0 and spec.process.attention_impl == "auto"


@pytest.mark.e2e          # the dry run of a 20B model's programs (~8 s on 2 cores)
def test_the_qwen_image_tpu_dry_run_fits_a_v5p_chip():
    from spotlight_jax.runner.dry_run import dry_run

    report = dry_run(load_config("qwen_image_tpu"))       # its 8 devices are the tests' 8
    line = _hbm_line(report)
    hbm_gib = 95e9 / GIB
    assert f"= {hbm_gib:.2f} GiB per device" in line and "does NOT fit" not in line
    assert _per_device_gib(report) < hbm_gib
    weights = 20_430_401_088 * 2 / GIB                      # bf16, every weight on each chip
    assert f"whole weights on every device: {weights:.3f} GiB fits" in line
    assert weights > 32e9 / GIB > 16e9 / GIB              # a v6e or v5e chip could not


@pytest.mark.e2e          # a subprocess with 32 devices (~10 s on 2 cores)
def test_the_wan_tpu_dry_run_fits_a_v5p_chip_on_its_32_devices(tmp_path):
    # its mesh is 32 chips: the documented command, in a process with 32 emulated devices
    # (the tests' 8-device XLA flag left out)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-m", "spotlight_jax.main", "--config=configs/wan21_14b_tpu.py",
         f"--workdir={tmp_path}", "--dry_run"], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "mesh: {'data': 1, 'fsdp': 4, 'sp': 8} over 32 cpu devices" in out.stdout
    line = _hbm_line(out.stdout)
    assert "does NOT fit" not in line
    assert _per_device_gib(out.stdout) < 95e9 / GIB
    assert f"whole weights on every device: {14_288_491_584 * 2 / GIB:.3f} GiB fits" in line


# ------------------------------------------------------------------------------ the sweep

def test_the_cost_sweep_prices_a_tpu_deployment():
    from spotlight_jax.studies import cost_sweep

    c = _tpu(**{"trace.rate_per_node_hour": 0.0})
    it = cost_sweep.iteration_phases(c)
    od, spot = 4 * 9.60 / 8 / 3600, 48 * 1.95941 / 8 / 3600
    assert it["baseline"].dollars == pytest.approx(it["baseline"].seconds * od)
    assert it["spotlight"].dollars == pytest.approx(it["spotlight"].seconds * (od + spot))
    assert math.isfinite(it["spotlight_pipelined"].seconds)


def test_the_dry_run_counts_the_fused_kernel_that_runs_on_cost_device():
    import jax.numpy as jnp

    from spotlight_jax.runner.dry_run import fused_kernel_on
    assert fused_kernel_on("tpu_v5p", "auto", jnp.bfloat16, 128) == "splash attention"
    assert fused_kernel_on("tpu_v6e", "splash", jnp.float32, 64) == "splash attention"
    assert fused_kernel_on("tpu_v5e", "xla", jnp.bfloat16, 128) is None
    assert fused_kernel_on("h100_sxm", "auto", jnp.bfloat16, 128) == "cuDNN flash attention"
    assert fused_kernel_on("h100_sxm", "auto", jnp.float32, 128) is None
