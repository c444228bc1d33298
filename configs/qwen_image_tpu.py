"""Qwen-Image (configs/qwen_image.py) deployed on spot TPU v5p slices, priced at TPU list prices.

The deployment: the trainer on one on-demand v5p 2x2x2 slice (8 chips on 2 hosts, fsdp 2 x
sp 4 over ICI) and 4 spot v5p 2x2x1 slices (4 chips on 1 host each), one Ulysses SP group of 4
per slice; a spot slice is lost whole after GCP's 30 s notice (docs/spotlight.md, the spot
fleet; emulation.slices). Prices: the v5p's on-demand and spot list prices per chip-hour
(emulation.datasheets, us-central1). Attention: 'auto' (XLA's on TPU until a fused TPU kernel
is picked by it; the dry run sizes XLA's).

Why v5p: a spot SP group's rollout keeps the whole 20.4B weights on every chip (38.1 GiB in
bf16), more than a v5e (16 GB) or v6e (32 GB) chip holds; a v5p chip has 95 GB. The dry run
checks both the update and those weights against the chip's HBM:
  python -m spotlight_jax.main --config=configs/qwen_image_tpu.py --workdir=/tmp/q --dry_run
The cost model's time per iteration of each mode on this deployment:
  python -m spotlight_jax.studies.cost_sweep --config=configs/qwen_image_tpu.py
"""
import pathlib
import runpy

_qwen = runpy.run_path(str(pathlib.Path(__file__).with_name("qwen_image.py")))


def get_config():
    c = _qwen["get_config"]()
    c.attention_impl = "auto"
    # the trainer: one on-demand slice, all of the run's (emulated) devices
    c.num_cpu_devices = 8
    c.trainer_devices = 0
    c.mesh.fsdp = -1              # 2 over 8 chips
    c.mesh.sp = 4                 # Ulysses: 24 heads / 4
    d = c.deployment
    d.on_demand_devices = 8       # v5p 2x2x2: 8 chips, 2 hosts
    d.spot_slice = "2x2x1"        # v5p: 4 chips, 1 host
    d.spot_devices_per_node = 4
    d.spot_nodes = 4
    d.spot_sp = 4
    c.trace.cloud = "gcp"         # 30 s preemption notice
    c.cost.device = "tpu_v5p"
    c.cost.price_source = "datasheet"
    return c
