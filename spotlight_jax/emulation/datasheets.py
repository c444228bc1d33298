"""Accelerator datasheets: the peak numbers the profile cost model divides FLOPs and bytes by.

Every number is a vendor datasheet figure, quoted with its source, so the report's assumptions
table can cite it (``cost_models.ProfileCost.describe``). A number that could not be confirmed
says so in its source string.

A GPU's interconnect for SP collectives is NVLink; a TPU's is ICI, and a TPU also comes in
slices of fixed topologies (:attr:`DeviceSpec.topologies`, ``emulation.slices``) and has list
prices per chip-hour here (``cost.price_source='datasheet'``).
"""
from __future__ import annotations

import dataclasses

# Where the TPU prices come from. The Cloud TPU pricing page as stored for this project is its
# v2-v4 era version, so the per-chip prices are read from SkyPilot's GCP catalog, which records
# Google's Cloud Billing catalog prices per accelerator type and zone.
_CATALOG = ("SkyPilot GCP catalog (github.com/skypilot-org/skypilot-catalog "
            "catalogs/v8/gcp/vms.csv @006059e0), us-central1-a")


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """Peak numbers of one accelerator (a GPU, or one TPU chip).

    ``bf16_tflops``: dense bf16 TFLOP/s; ``hbm_gb_s``: HBM GB/s; ``interconnect_gb_s``: the
    bandwidth of ``interconnect`` (``"NVLink"`` or ``"ICI"``) per device, both directions
    together, which the cost model's SP collectives run over. ``hbm_gb``: HBM capacity in GB as
    the datasheet prints it (0 = not recorded); the dry run checks a device's memory against it.
    ``on_demand_per_hour``/``spot_per_hour``: list prices per device-hour with their
    ``price_source`` (None: use the config's ``cost.on_demand_per_hour`` and
    ``cost.spot_discount``). A TPU has slice ``topologies`` (``"2x4"``, ``"2x2x1"``, ...:
    chips per axis) and ``chips_per_host``; ``device_kinds`` are JAX's ``device_kind``
    strings of the chip."""

    label: str
    bf16_tflops: float
    hbm_gb_s: float
    interconnect_gb_s: float
    source: str
    interconnect: str = "NVLink"
    hbm_gb: float = 0.0
    on_demand_per_hour: float | None = None
    spot_per_hour: float | None = None
    price_source: str = ""
    topologies: tuple[str, ...] = ()
    chips_per_host: int = 0
    topology_source: str = ""
    device_kinds: tuple[str, ...] = ()

    @property
    def nvlink_gb_s(self) -> float:
        """The interconnect bandwidth under its former name (every device was a GPU)."""
        return self.interconnect_gb_s

    @property
    def is_tpu(self) -> bool:
        return bool(self.topologies)

    @property
    def has_prices(self) -> bool:
        return self.on_demand_per_hour is not None and self.spot_per_hour is not None


# The v5e and v6e 2D slice shapes (chips per axis); v6e's per-shape table was not found in the
# pages read here, so v5e's shapes stand for it (its page: "shares many similarities with v5e",
# 256-chip pods, 2D torus, 8 chips per host).
_SHAPES_2D = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

DEVICES: dict[str, DeviceSpec] = {
    "h100_sxm": DeviceSpec(
        "NVIDIA H100 SXM5 80GB", 989.0, 3350.0, 900.0,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with 2:4 sparsity "
        "= 989 dense; HBM3 80 GB at 3.35 TB/s; NVLink 4 900 GB/s",
        hbm_gb=80.0),
    "h200_sxm": DeviceSpec(
        "NVIDIA H200 SXM 141GB", 989.0, 4800.0, 900.0,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM): same BF16 compute as H100 SXM "
        "(1,979 sparse = 989 dense); HBM3e 141 GB at 4.8 TB/s; NVLink 900 GB/s",
        hbm_gb=141.0),
    "a100_sxm": DeviceSpec(
        "NVIDIA A100 SXM4 80GB", 312.0, 2039.0, 600.0,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): BF16 312 TFLOPS dense "
        "(624 sparse); HBM2e 80 GB at 2,039 GB/s; NVLink 3 600 GB/s",
        hbm_gb=80.0),
    "tpu_v5e": DeviceSpec(
        "Google TPU v5e", 197.0, 819.0, 400.0,
        "Google Cloud TPU v5e page (docs.cloud.google.com/tpu/docs/v5e): peak compute per "
        "chip (bf16) 197 TFLOPs; HBM2 16 GB at 819 GBps (one version of the page says "
        "800 GiBps, another 16 GiB: 16 GB and 819 GB/s are kept, the lower capacity); "
        "bidirectional ICI per chip 400 GBps (older page versions: 1600 Gbps = 200 GB/s, "
        "one direction); 4 ICI ports, 2D torus, 8 chips per host, 256-chip pods",
        interconnect="ICI", hbm_gb=16.0,
        on_demand_per_hour=9.6 / 8, spot_per_hour=1.95941 / 8,
        price_source=f"{_CATALOG}: tpu-v5litepod-8 $9.60 on-demand, $1.95941 spot per hour "
                     "for 8 chips (spot is 50% of on-demand in us-east5, 40% in us-west4: "
                     "spot prices vary by zone and over time)",
        topologies=_SHAPES_2D, chips_per_host=8,
        topology_source="Cloud TPU v5e page, supported 2D slice shapes: 1x1 (1/8 host), "
                        "2x2 (1/2), 2x4 (1 host), 4x4 (2), 4x8 (4), 8x8 (8), 8x16 (16), "
                        "16x16 (32 hosts)",
        device_kinds=("tpu v5 lite", "tpu v5e")),
    "tpu_v5p": DeviceSpec(
        "Google TPU v5p", 459.0, 2765.0, 1200.0,
        "Google Cloud TPU v5p page (docs.cloud.google.com/tpu/docs/v5p): peak compute per "
        "chip (BF16) 459 TFLOPs; HBM2e 95 GB at 2765 GBps (a newer table says 95 GiB: 95 GB "
        "is kept, the lower capacity); bidirectional ICI per chip 1200 GBps (older page "
        "versions: 4800 Gbps = 600 GB/s, one direction); 3D torus, 4-chip hosts, "
        "8960-chip pods",
        interconnect="ICI", hbm_gb=95.0,
        on_demand_per_hour=16.8 / 4, spot_per_hour=3.3428 / 4,
        price_source=f"{_CATALOG}: tpu-v5p-8 (4 chips) $16.80 on-demand, $3.3428 spot per "
                     "hour (spot is 40% of on-demand in us-east5: spot prices vary by zone "
                     "and over time)",
        topologies=("2x2x1", "2x2x2", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
                    "8x16x16", "16x16x16", "16x16x24"),
        chips_per_host=4,
        topology_source="Cloud TPU v5p page, 'the most common single-slice shapes' (not all): "
                        "2x2x1 (4 chips, 1 host), 2x2x2 (8, 2), 2x4x4 (32, 8), 4x4x4 (64, 16) "
                        "... 16x16x24 (6144 chips, 1536 hosts)",
        device_kinds=("tpu v5", "tpu v5p")),
    "tpu_v6e": DeviceSpec(
        "Google TPU v6e (Trillium)", 918.0, 1638.0, 800.0,
        "Google Cloud TPU v6e page (docs.cloud.google.com/tpu/docs/v6e): peak compute per "
        "chip (bf16) 918 TFLOPs; HBM 32 GB at 1638 GBps; bidirectional ICI per chip "
        "800 GBps; 4 ICI ports, 2D torus, 8 chips per host, 256-chip pods",
        interconnect="ICI", hbm_gb=32.0,
        on_demand_per_hour=21.6 / 8, spot_per_hour=4.35366 / 8,
        price_source=f"{_CATALOG}: tpu-v6e-8 $21.60 on-demand, $4.35366 spot per hour for "
                     "8 chips (spot is 45% of on-demand in us-east5: spot prices vary by "
                     "zone and over time)",
        topologies=_SHAPES_2D, chips_per_host=8,
        topology_source="NOT CONFIRMED: the v6e page read here gives 256-chip pods, a 2D "
                        "torus and 8 chips per host but no per-shape table; v5e's 2D shapes "
                        "(1x1 ... 16x16) are assumed",
        device_kinds=("tpu v6 lite", "tpu v6e")),
}


def device_spec(name: str) -> DeviceSpec:
    """The datasheet of ``name`` (a key of :data:`DEVICES`)."""
    if name not in DEVICES:
        raise ValueError(f"device={name!r}: unknown accelerator; choose one of {sorted(DEVICES)}")
    return DEVICES[name]


def tpu_devices() -> list[str]:
    """The keys of :data:`DEVICES` that are TPUs (have slice topologies)."""
    return sorted(k for k, s in DEVICES.items() if s.is_tpu)


def spec_for_device_kind(kind: str) -> DeviceSpec | None:
    """The datasheet of a JAX ``device_kind`` string ('NVIDIA H200', 'NVIDIA H100 80GB HBM3',
    'NVIDIA A100-SXM4-80GB', 'TPU v5 lite', ...): a TPU by its exact kind ('TPU v5' is v5p,
    'TPU v5 lite' v5e), a GPU by the model name (h200, h100, a100) the kind contains; None for
    a device without a datasheet here (a CPU, another accelerator)."""
    lowered = kind.lower().strip()
    for spec in DEVICES.values():
        if lowered in spec.device_kinds:
            return spec
    for key, spec in DEVICES.items():
        if not spec.is_tpu and key.split("_")[0] in lowered:
            return spec
    return None
