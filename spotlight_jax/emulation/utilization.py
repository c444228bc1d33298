"""Model FLOPs and their utilisation (MFU) for the run's phases.

Model FLOPs follow the MFU convention (``emulation.flops``: matmuls only, 2 per multiply-add):

* a rollout of ``n`` images: ``n x num_steps x forward_flops`` (twice under CFG);
* an update: per gradient step, each row whose forward is differentiated counts three forwards
  (the forward and a backward of two: the activations' and the weights' gradients), each
  forward-only row (an old or reference policy's velocity) one; rows from the objective's
  ``ObjectiveWork.update_rows``, times its gradient passes per update. With LoRA the weights'
  gradient of the frozen base is never computed, so the hardware does less than the model
  FLOPs say (the convention, as for full fine-tuning, keeps runs comparable).

MFU = model FLOP/s / (peak per device x devices). The peak of a device is its datasheet's dense
bf16 number where ``emulation.datasheets`` has its kind (H100, H200, A100); otherwise (a CPU)
the measured rate of an f32 matmul on that device, which the run prints at start.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from spotlight_jax.emulation.datasheets import spec_for_device_kind
from spotlight_jax.emulation.flops import forward_flops


def matmul_peak(device, n: int = 512, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` f32 matmul on ``device`` (the median of ``repeats`` after a
    compile): the peak MFU is measured against where no datasheet applies."""
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / max(statistics.median(times), 1e-9)


def device_peak(device) -> tuple[float, str]:
    """``(FLOP/s, where the number comes from)`` of one device."""
    spec = spec_for_device_kind(str(getattr(device, "device_kind", "")))
    if spec is not None:
        return spec.bf16_tflops * 1e12, f"{spec.label} datasheet, dense bf16"
    return matmul_peak(device), f"measured f32 512^3 matmul on {device}"


def rollout_flops(model_cfg, sampler_cfg, n: int) -> float:
    """Model FLOPs of sampling ``n`` images (every step's velocity, both CFG passes)."""
    passes = model_cfg.passes(sampler_cfg.guidance)
    return float(n * sampler_cfg.num_steps * passes * forward_flops(model_cfg))


def update_flops(work, model_cfg, n: int) -> float:
    """Model FLOPs of an update on ``n`` samples (the module docstring's count); ``work``: the
    objective's ``rl.ObjectiveWork`` (its rows per gradient pass and passes per update)."""
    rows = work.update_rows(n)
    steps = work.gradient_passes
    passes = model_cfg.passes(rows.guidance)
    return float(steps * passes * (3 * rows.grad + rows.forward) * forward_flops(model_cfg))


def mfu(flops: float, seconds: float, peak: float, devices: int) -> float:
    """The share of ``devices`` x ``peak`` FLOP/s that ``flops`` in ``seconds`` used."""
    if seconds <= 0 or peak <= 0 or devices < 1:
        return 0.0
    return flops / seconds / (peak * devices)
