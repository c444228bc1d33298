"""Wan 2.1 T2V 14B (configs/wan21_14b.py) deployed on spot TPU v5p slices, priced at TPU list
prices.

The deployment: the trainer on one on-demand v5p 2x4x4 slice (32 chips on 8 hosts, fsdp 4 x
sp 8 over ICI) and 2 spot v5p 2x2x2 slices (8 chips on 2 hosts each: a multi-host slice, lost
whole, both hosts in one event, after GCP's 30 s notice), one Ulysses SP group of 8 per slice
(40 heads / 8). Prices: the v5p's on-demand and spot list prices per chip-hour
(emulation.datasheets, us-central1). Attention: 'auto'.

Why v5p and 32 trainer chips: the dry run sizes XLA's attention, whose backward keeps every
head's scores over the 32,760 video tokens: 33.7 GiB per row and device at SP 8 (the largest
SP degree dividing both the 40 heads and a slice's power-of-two chips). A v6e chip (32 GB =
29.8 GiB) holds the 26.6 GiB of weights but not one row; a v5p chip (95 GB) holds the 4-row
gradient step over fsdp 4 x sp 8 in 47% of its HBM (over the 8 chips of a 2x2x2 slice it
would need 162.7 GiB). The dry run (on 32 emulated devices) checks the update and weights:
  python -m spotlight_jax.main --config=configs/wan21_14b_tpu.py --workdir=/tmp/w --dry_run
"""
import pathlib
import runpy

_wan = runpy.run_path(str(pathlib.Path(__file__).with_name("wan21_14b.py")))


def get_config():
    c = _wan["get_config"]()
    c.attention_impl = "auto"
    # the trainer: one on-demand slice, all of the run's (emulated) devices
    c.num_cpu_devices = 32
    c.trainer_devices = 0
    c.mesh.fsdp = -1              # 4 over 32 chips
    c.mesh.sp = 8                 # Ulysses: 40 heads / 8
    d = c.deployment
    d.on_demand_devices = 32      # v5p 2x4x4: 32 chips, 8 hosts
    d.spot_slice = "2x2x2"        # v5p: 8 chips, 2 hosts
    d.spot_devices_per_node = 8
    d.spot_nodes = 2
    d.spot_sp = 8
    c.trace.cloud = "gcp"         # 30 s preemption notice
    c.cost.device = "tpu_v5p"
    c.cost.price_source = "datasheet"
    return c
