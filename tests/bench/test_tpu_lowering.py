"""``bench.tpu_lowering``: the census of programs lowered for TPU on this CPU machine.

The counter is checked on hand-built programs against closed forms (splash's forward and its
two backward kernels, their FLOPs, XLA's score matrix, a helper called twice counted twice),
then the configs' programs: a bf16 model asks for splash attention in every block, forward and
backward, with no score-sized value, every matmul in bf16, and the SP collectives each strategy
needs.
"""
import jax
import jax.numpy as jnp
import pytest

from spotlight_jax import programs
from spotlight_jax.bench import tpu_lowering as tl
from spotlight_jax.parallel import kernels

QWEN = str(programs.REPO / "configs" / "qwen_image.py")
WAN = str(programs.REPO / "configs" / "wan21_1_3b.py")


def test_the_census_counts_splash_its_two_backward_kernels_their_flops_and_xla_scores():
    b, s, h, d = 2, 256, 4, 64
    qkv = jax.ShapeDtypeStruct((b, s, h, d), jnp.bfloat16)

    def attend(kernel):
        return lambda q, k, v: kernels.attend(kernel, q, k, v)

    def grad(kernel):
        return jax.grad(lambda q, k, v: attend(kernel)(q, k, v).astype(jnp.float32).sum(),
                        argnums=(0, 1, 2))

    one = 4.0 * b * h * s * s * d                   # a forward's model FLOPs
    fwd = tl.census(tl.lower_for_tpu(attend(kernels.SPLASH), qkv, qkv, qkv), {s})
    assert (fwd.splash_forward, fwd.splash_dq, fwd.splash_dkv, fwd.score_values) == (1, 0, 0, 0)
    assert fwd.fused_attention_flops == one
    bwd = tl.census(tl.lower_for_tpu(grad(kernels.SPLASH), qkv, qkv, qkv), {s})
    assert (bwd.splash_forward, bwd.splash_dq, bwd.splash_dkv, bwd.score_values) == (1, 1, 1, 0)
    assert bwd.fused_attention_flops == 3 * one     # the backward: twice the forward
    xla = tl.census(tl.lower_for_tpu(attend(kernels.XLA), qkv, qkv, qkv), {s})
    assert (xla.splash_forward, xla.fused_attention_flops) == (0, 0.0)
    assert xla.score_values > 0 and sum(xla.matmul_flops.values()) == one


def test_a_function_lowered_once_and_called_twice_counts_twice():
    m, k, n = 48, 32, 16
    a = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16)
    helper = jax.jit(lambda a, w: a @ w)
    c = tl.census(tl.lower_for_tpu(lambda a, w: helper(a, w) + helper(2 * a, w), a, w), set())
    assert c.matmul_flops == {"bf16 x bf16": 2 * 2 * m * k * n}


@pytest.mark.parametrize("path, attentions_per_block", [(QWEN, 1), (WAN, 2)])
def test_a_bf16_model_asks_a_tpu_for_splash_in_every_block_and_sp_for_its_collectives(
        path, attentions_per_block):
    depth, sp = 2, 4
    r = tl.tpu_lowering(path, depth=depth, latent=16, batch=1, rank=4, sp=sp)
    assert (r["kernel"], r["not_splash"]) == ("splash", None)
    calls, p = depth * attentions_per_block, r["programs"]
    assert (p["forward"]["splash_forward"], p["forward"]["splash_dq"]) == (calls, 0)
    for step in ("full", "lora_factored"):    # remat `nothing`: each block's forward again
        assert (p[step]["splash_forward"], p[step]["splash_dq"], p[step]["splash_dkv"]) == (
            2 * calls, calls, calls), step
    padded = -(-r["sequence"] // 128) * 128
    for name in ("forward", "full", "lora_factored"):
        c = p[name]
        assert c["score_values"] == 0 and c["collectives"] == {}, name   # one device: no SP
        # every matmul in bf16 but splash's backward's row sums of dO * O (outside its
        # kernels, in float32): 2 b h s d per backward call of the MMDiT's joint attention
        f32 = {k: v for k, v in c["matmul_flops"].items() if k != "bf16 x bf16"}
        rows = c["splash_dq"] * 2 * r["heads"] * padded * r["head_dim"]
        if path == QWEN:
            assert f32 == ({"f32 x f32": rows} if rows else {}), name
        assert c["half_share"] > 0.9999, name
    for strategy in ("dense", "ulysses", "usp"):
        c = p[f"attention_{strategy}"]
        assert (c["splash_forward"], c["splash_dq"], c["splash_dkv"]) == (1, 1, 1), strategy
        assert c["score_values"] == 0, strategy
    assert p["attention_dense"]["collectives"] == {}
    assert p["attention_ulysses"]["collectives"]["all_to_all"] >= 4     # q, k, v and back
    ring = p["attention_ring"]
    # the ring's forward merges splash's blocks (one call in its loop, one for the last
    # block); its backward recomputes each block's scores outside the kernel
    assert (ring["splash_forward"], ring["splash_dq"]) == (2, 0) and ring["score_values"] > 0
    assert ring["collectives"]["collective_permute"] > 0
    assert "| attention, 4-way ring | 2 | 0 / 0 |" in tl.table(r)


def test_the_attention_remat_policy_keeps_splash_outputs_in_the_model():
    r = tl.tpu_lowering(QWEN, depth=2, latent=16, batch=1, rank=4, sp=2,
                        remat_policy="attention")
    full = r["programs"]["full"]
    assert (full["splash_forward"], full["splash_dq"], full["splash_dkv"]) == (2, 2, 2)
