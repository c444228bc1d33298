"""``bench.gpu_lowering``: the census of programs lowered for NVIDIA GPUs on this CPU machine.

The counter is checked on hand-built programs against closed forms (a kernel call, its
backward, XLA's score matrix, matmul FLOPs); then the configs' programs: a bf16 model asks for
cuDNN flash attention in every block, forward and backward, with no score-sized value and every
matmul in bf16, and so does each SP path but the ring's backward; a float32 model gets XLA with
the reason.
"""
import dataclasses

import jax
import jax.numpy as jnp
import pytest
from helpers import TINY

from spotlight_jax import config as conf
from spotlight_jax import programs
from spotlight_jax.bench import gpu_lowering as gl
from spotlight_jax.bench.step_flops import reduced_overrides

QWEN = str(programs.REPO / "configs" / "qwen_image.py")
WAN = str(programs.REPO / "configs" / "wan21_1_3b.py")


def test_the_census_counts_the_kernel_its_backward_and_xla_scores():
    b, s, h, d = 2, 128, 4, 64
    qkv = jax.ShapeDtypeStruct((b, s, h, d), jnp.bfloat16)

    def attend(impl):
        return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation=impl)

    def grad(impl):
        return jax.grad(lambda q, k, v: attend(impl)(q, k, v).astype(jnp.float32).sum(),
                        argnums=(0, 1, 2))

    fwd = gl.census(gl.lower_for_cuda(attend("cudnn"), qkv, qkv, qkv), {s})
    assert (fwd.cudnn_forward, fwd.cudnn_backward, fwd.score_values) == (1, 0, 0)
    bwd = gl.census(gl.lower_for_cuda(grad("cudnn"), qkv, qkv, qkv), {s})
    assert (bwd.cudnn_forward, bwd.cudnn_backward, bwd.score_values) == (1, 1, 0)
    xla = gl.census(gl.lower_for_cuda(attend("xla"), qkv, qkv, qkv), {s})
    assert (xla.cudnn_forward, xla.cudnn_backward) == (0, 0) and xla.score_values > 0
    # XLA's attention is two matmuls of 2 b h s s d FLOPs each (q k^T, then p v)
    assert sum(xla.matmul_flops.values()) == 4 * b * h * s * s * d


def test_the_census_sums_matmul_flops_by_operand_dtypes():
    m, k, n = 48, 32, 16
    a = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16)
    a32 = jax.ShapeDtypeStruct((m, k), jnp.float32)
    w32 = jax.ShapeDtypeStruct((k, 3 * n), jnp.float32)
    c = gl.census(gl.lower_for_cuda(lambda a, w, a32, w32: (a @ w, a32 @ w32), a, w, a32, w32),
                  set())
    assert c.matmul_flops == {"bf16 x bf16": 2 * m * k * n, "f32 x f32": 2 * m * k * 3 * n}
    assert c.half_share == pytest.approx(1 / 4)


def test_jax_checks_for_cudnn_are_back_after_the_lowering():
    from jax._src.cudnn import fused_attention_stablehlo as fused
    before = (fused.check_cudnn_version, fused.check_compute_capability)
    with gl.cudnn_assumed():
        assert fused.check_cudnn_version() == gl.CUDNN_VERSION
        assert fused.check_compute_capability("9.0") and not fused.check_compute_capability("10.0")
    assert (fused.check_cudnn_version, fused.check_compute_capability) == before


def _blocks_and_remat(path, depth, latent):
    cfg = conf.model_config(conf.load_config(path, reduced_overrides(path, depth, latent)))
    return cfg, 2 if cfg.remat else 1


@pytest.mark.parametrize("path, attentions_per_block", [(QWEN, 1), (WAN, 2)])
def test_a_bf16_model_asks_for_the_kernel_in_every_block_and_every_path_but_the_rings_backward(
        path, attentions_per_block):
    depth, latent, sp = 2, 16, 4
    r = gl.gpu_lowering(path, depth=depth, latent=latent, batch=1, rank=4, sp=sp)
    cfg, forwards = _blocks_and_remat(path, depth, latent)
    assert (r["kernel"], r["not_cudnn"]) == ("cudnn", None)
    calls = depth * attentions_per_block
    p = r["programs"]
    assert (p["forward"]["cudnn_forward"], p["forward"]["cudnn_backward"]) == (calls, 0)
    for step in ("full", "lora_factored"):    # the remat recomputes each block's forward
        assert (p[step]["cudnn_forward"], p[step]["cudnn_backward"]) == (calls * forwards, calls)
    for name, c in p.items():
        assert c["half_share"] == 1.0, name
        if name != "attention_ring":
            assert c["score_values"] == 0, name
    for strategy in ("dense", "ulysses", "usp"):
        c = p[f"attention_{strategy}"]
        assert (c["cudnn_forward"], c["cudnn_backward"]) == (1, 1), strategy
    # the ring's forward merges the kernel's blocks (one call in its loop, one for the last
    # block); its backward recomputes each block's scores outside the kernel
    ring = p["attention_ring"]
    assert (ring["cudnn_forward"], ring["cudnn_backward"]) == (2, 0)
    assert ring["score_values"] > 0
    assert "| attention, 4-way ring | 2 | 0 |" in gl.table(r)


def test_a_float32_model_gets_xla_and_says_why():
    r = gl.gpu_lowering(TINY, depth=1, latent=8, batch=1, rank=2, sp=2)
    assert r["kernel"] == "xla" and "float32" in r["not_cudnn"]
    for name, c in r["programs"].items():
        assert c["cudnn_forward"] == c["cudnn_backward"] == 0, name
        assert c["score_values"] > 0, name
    assert "attention kernel xla (cuDNN flash attention takes" in gl.table(r)


def test_more_sp_ranks_than_devices_is_one_line():
    cfg, _ = _blocks_and_remat(TINY, 1, 8)
    with pytest.raises(ValueError, match=r"--sp=64: the attention paths need 64 devices"):
        gl.attention_programs(cfg, None, batch=1, sp=64)


@pytest.mark.parametrize("path", [QWEN, WAN])
def test_the_lowered_forward_has_the_flops_the_cost_model_counts(path):
    from spotlight_jax.emulation.flops import forward_flops
    depth, latent, batch = 2, 16, 2
    cfg, _, _, progs = gl.model_programs(path, depth, latent, batch, rank=4)
    c = gl.census(gl.lower_for_cuda(progs["forward"][0], *progs["forward"][1]),
                  {gl.sequence_of(cfg), cfg.text_len})
    expected = float(forward_flops(cfg, batch=batch))
    if path == QWEN:
        # the last block's text stream after attention (out, fc1, fc2) feeds nothing: JAX drops
        # it from the program, emulation.flops counts it (0.23% of the 60-block model at 512 px)
        d, h = cfg.width, int(cfg.width * cfg.mlp_ratio)
        expected -= batch * cfg.text_len * 2 * (d * d + 2 * d * h)
    # the matmuls and the fused attention, against emulation.flops' closed form
    assert c.flops == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("policy, recomputed, attention_recomputed", [
    ("nothing", 1, 1), ("attention", 1, 0), ("dots_no_batch", 0, 1), ("dots_attention", 0, 0)])
def test_the_remat_policy_sets_how_many_forwards_of_matmuls_the_step_spends(
        policy, recomputed, attention_recomputed):
    """Each matmul: a forward, two in the backward (inputs' and weights' gradients), one more
    when the remat recomputes it; the fused attention: a forward, a backward of twice its FLOPs
    and, unless the policy keeps its outputs (``*attention``), a recompute."""
    depth, latent = 2, 64
    cfg, _, _, progs = gl.model_programs(QWEN, depth, latent, 1, rank=4, remat_policy=policy)
    assert cfg.remat
    lengths = {gl.sequence_of(cfg), cfg.text_len}
    fwd, full = (gl.census(gl.lower_for_cuda(progs[k][0], *progs[k][1]), lengths)
                 for k in ("forward", "full"))
    matmuls = sum(fwd.matmul_flops.values())
    # the patch and text embeddings' inputs need no gradient: a little under the count
    assert sum(full.matmul_flops.values()) == pytest.approx((3 + recomputed) * matmuls, rel=0.01)
    assert full.fused_attention_flops == (3 + attention_recomputed) * fwd.fused_attention_flops
    assert (full.cudnn_forward, full.cudnn_backward) == (depth * (1 + attention_recomputed),
                                                         depth)


@pytest.mark.parametrize("policy", ["nothing", "attention", "dots_no_batch", "dots_attention",
                                    "dots"])
def test_the_cost_models_recompute_share_is_the_lowered_steps(policy):
    """``emulation.flops.remat_recompute_fraction`` (what the cost model charges a GPU step
    beyond a forward and a backward of two) against the lowered full step's FLOPs."""
    from spotlight_jax.emulation.flops import remat_recompute_fraction
    cfg, _, _, progs = gl.model_programs(QWEN, 2, 64, 1, rank=4, remat_policy=policy)
    lengths = {gl.sequence_of(cfg), cfg.text_len}
    fwd, full = (gl.census(gl.lower_for_cuda(progs[k][0], *progs[k][1]), lengths).flops
                 for k in ("forward", "full"))
    # the embeddings' inputs need no gradient: the lowered step is a little under the count
    assert (full - 3 * fwd) / fwd == pytest.approx(remat_recompute_fraction(cfg), abs=0.02)
    # with XLA's attention the *attention policies keep nothing more, and dots keeps its matmuls
    xla = {"nothing": "nothing", "attention": "nothing", "dots_no_batch": "dots_no_batch",
           "dots_attention": "dots_no_batch"}
    if policy in xla:
        same = dataclasses.replace(cfg, remat_policy=xla[policy])
        assert remat_recompute_fraction(cfg, fused_attention=False) == remat_recompute_fraction(
            same, fused_attention=False)
    else:
        assert remat_recompute_fraction(cfg, fused_attention=False) == 0.0


def test_a_video_latent_can_be_oblong_and_an_image_ones_cannot():
    r = gl.gpu_lowering(WAN, depth=1, latent=8, batch=1, rank=2, sp=2, latent_width=12)
    assert r["sequence"] == 21 * 4 * 6 and "8 x 12 latent" in gl.table(r)
    with pytest.raises(ValueError, match=r"--latent_width=12: only a video model's latent"):
        gl.gpu_lowering(QWEN, depth=1, latent=8, batch=1, rank=2, sp=2, latent_width=12)


@pytest.mark.parametrize("name, calls", [("sd35_medium", 4), ("flux_dev", 6)])
def test_sd35s_odd_sequence_and_fluxs_single_blocks_lower_to_the_kernel(name, calls):
    """SD3.5 at 2 blocks: two joint attentions and two second (image) ones over 333 + 1024
    tokens, an odd length JAX's cuDNN attention refuses when differentiated unless padded;
    FLUX.1 at 2 dual blocks keeps its single blocks in proportion (38 * 2 / 19 = 4)."""
    r = gl.gpu_lowering(str(programs.REPO / "configs" / f"{name}.py"), depth=2, latent=64,
                        batch=1, rank=4, sp=2)
    p = r["programs"]
    assert r["kernel"] == "cudnn"
    assert (p["forward"]["cudnn_forward"], p["full"]["cudnn_backward"]) == (calls, calls)
    assert all(p[k]["score_values"] == 0 for k in ("forward", "full", "lora_factored"))
