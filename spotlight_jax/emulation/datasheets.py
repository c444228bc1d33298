"""Accelerator datasheets: the peak numbers the profile cost model divides FLOPs and bytes by.

Every number is a vendor datasheet figure, quoted with its source, so the report's assumptions
table can cite it (``cost_models.ProfileCost.describe``).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """Peak numbers of one accelerator: dense bf16 TFLOP/s, HBM GB/s, NVLink GB/s (total,
    both directions, per GPU)."""

    label: str
    bf16_tflops: float
    hbm_gb_s: float
    nvlink_gb_s: float
    source: str


DEVICES: dict[str, DeviceSpec] = {
    "h100_sxm": DeviceSpec(
        "NVIDIA H100 SXM5 80GB", 989.0, 3350.0, 900.0,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with 2:4 sparsity "
        "= 989 dense; HBM3 3.35 TB/s; NVLink 4 900 GB/s"),
    "h200_sxm": DeviceSpec(
        "NVIDIA H200 SXM 141GB", 989.0, 4800.0, 900.0,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM): same BF16 compute as H100 SXM "
        "(1,979 sparse = 989 dense); HBM3e 4.8 TB/s; NVLink 900 GB/s"),
    "a100_sxm": DeviceSpec(
        "NVIDIA A100 SXM4 80GB", 312.0, 2039.0, 600.0,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): BF16 312 TFLOPS dense "
        "(624 sparse); HBM2e 2,039 GB/s; NVLink 3 600 GB/s"),
}


def device_spec(name: str) -> DeviceSpec:
    """The datasheet of ``name`` (a key of :data:`DEVICES`)."""
    if name not in DEVICES:
        raise ValueError(f"device={name!r}: unknown accelerator; choose one of {sorted(DEVICES)}")
    return DEVICES[name]


def spec_for_device_kind(kind: str) -> DeviceSpec | None:
    """The datasheet of a JAX ``device_kind`` string ('NVIDIA H200', 'NVIDIA H100 80GB HBM3',
    'NVIDIA A100-SXM4-80GB', ...): the entry whose model name (h200, h100, a100) the kind
    contains; None for a device without a datasheet here (a CPU, another accelerator)."""
    lowered = kind.lower()
    for key, spec in DEVICES.items():
        if key.split("_")[0] in lowered:
            return spec
    return None
