"""Model FLOPs and MFU (``spotlight_jax.emulation.utilization``): a known matmul program's MFU is
its FLOPs / time / peak (on a fake clock, so exact), the update's count follows the convention the
gradient's jaxpr shows (three forwards per differentiated row), and a run logs both."""

import itertools

import jax
import jax.numpy as jnp
from flax import nnx
from helpers import dot_flops

from spotlight_jax.emulation import datasheets, utilization
from spotlight_jax.emulation.flops import forward_flops
from spotlight_jax.models import MMDiT, MMDiTConfig

CFG = MMDiTConfig(image_size=8, channels=4, patch_size=2, width=32, depth=2, num_heads=2,
                  mlp_ratio=2.0, text_len=6, text_width=0, text_embed_dim=12)


def test_mfu_of_a_known_matmul_is_its_flops_over_time_and_peak(monkeypatch):
    n = 128
    flops = dot_flops(jax.make_jaxpr(lambda x: x @ x)(jnp.ones((n, n))).jaxpr)
    assert flops == 2 * n ** 3
    ticks = itertools.count()                       # every reading 0.25 s after the last
    monkeypatch.setattr(utilization.time, "perf_counter", lambda: 0.25 * next(ticks))
    peak = utilization.matmul_peak(jax.devices()[0], n=n, repeats=3)
    assert peak == flops / 0.25
    # the same program timed at 0.5 s on one device used half the measured peak, on 4 an eighth
    assert utilization.mfu(flops, 0.5, peak, 1) == 0.5
    assert utilization.mfu(flops, 0.5, peak, 4) == 0.125
    assert utilization.mfu(flops, 0.0, peak, 1) == 0.0


def test_device_peak_reads_the_datasheet_of_a_known_kind():
    class H200:
        device_kind = "NVIDIA H200"
    peak, source = utilization.device_peak(H200())
    assert peak == 989e12 and "datasheet" in source
    assert datasheets.spec_for_device_kind("NVIDIA A100-SXM4-80GB").bf16_tflops == 312.0
    assert datasheets.spec_for_device_kind("cpu") is None


def test_a_differentiated_row_costs_three_forwards_in_the_gradients_jaxpr():
    """The convention's 3x: the backward of every matmul computes two products (the input's and
    the weight's gradients), except the input gradients nothing needs (the first layers')."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MMDiT(CFG, rngs=nnx.Rngs(0))))
    b = 3
    x = jax.ShapeDtypeStruct((b, 8, 8, 4), jnp.float32)
    t = jax.ShapeDtypeStruct((b,), jnp.float32)
    tok = jax.ShapeDtypeStruct((b, 6, 12), jnp.float32)
    mask = jax.ShapeDtypeStruct((b, 6), jnp.bool_)

    def loss(st, *a):
        return jnp.sum(nnx.merge(graphdef, st)(*a) ** 2)

    grad = dot_flops(jax.make_jaxpr(jax.grad(loss))(state, x, t, tok, mask).jaxpr)
    ratio = grad / forward_flops(CFG, batch=b)
    print(f"gradient / forward matmul FLOPs: {ratio:.3f}")
    assert 2.8 < ratio <= 3.0


def test_update_and_rollout_flops_count_rows_steps_and_cfg():
    from spotlight_jax.diffusion import SamplerConfig
    from spotlight_jax.rl import UpdateRows

    class Work:                 # an objective's work: 2 minibatches x 3 epochs
        def __init__(self, sampler):
            self.sampler, self.gradient_passes = sampler, 6

        def update_rows(self, n):
            return UpdateRows(grad=n // 2 * 4, forward=n // 2, guidance=self.sampler.guidance)

    f = forward_flops(CFG)
    plain, cfg2 = SamplerConfig(num_steps=5), SamplerConfig(num_steps=5, guidance=4.0)
    # 2 minibatches x 3 epochs x (3 x 32 + 8) rows, one pass; twice that under CFG
    assert utilization.update_flops(Work(plain), CFG, 16) == 6 * (3 * 32 + 8) * f
    assert utilization.update_flops(Work(cfg2), CFG, 16) == 2 * 6 * (3 * 32 + 8) * f
    assert utilization.rollout_flops(CFG, plain, 16) == 16 * 5 * f
    assert utilization.rollout_flops(CFG, cfg2, 16) == 2 * 16 * 5 * f
