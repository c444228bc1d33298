"""The local attention kernel: which one runs where, and the cuDNN code path checked on a CPU.

cuDNN flash attention cannot run here, but everything around it can: the padding handed over as
key lengths, the rows it cannot express, the ring merging blocks by their log-sum-exp, and the
models putting the padded text keys last. ``Kernel("xla", by_lengths=True)`` runs exactly that
code with XLA's kernel in cuDNN's place; it must equal the dense reference (forward and
gradients, 1e-5) in every strategy. The kernel's own HLO on a GPU is checked by
``bench.device_check`` when a device is lent.
"""
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import (
    assert_close,
    forward_and_grads,
    make_inputs,
    reference_attention,
    sp_mesh,
)

from spotlight_jax.parallel import STRATEGIES, attention, kernels

# the cuDNN code path (key lengths, odd lengths padded to even) with XLA's kernel
LENGTHS = dataclasses.replace(kernels.CUDNN, impl="xla")


def _gpu(kind="NVIDIA H100 80GB HBM3", capability="9.0"):
    return types.SimpleNamespace(platform="gpu", device_kind=kind, compute_capability=capability)


def test_auto_is_xla_on_cpu_and_a_forced_cudnn_says_why_in_one_line():
    assert kernels.resolve("auto", jnp.bfloat16, 128) == kernels.XLA
    assert kernels.resolve("xla", jnp.bfloat16, 128) == kernels.XLA
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' cannot run here: cuDNN flash "
                                         r"attention needs NVIDIA GPUs; the devices are cpu"):
        kernels.resolve("cudnn", jnp.bfloat16, 128)
    with pytest.raises(ValueError, match="'flash': choose one of"):
        kernels.resolve("flash", jnp.bfloat16, 128)
    assert kernels.resolve(LENGTHS, jnp.float32, 8) is LENGTHS
    with pytest.raises(ValueError, match="float32 for the cuDNN kernel"):
        kernels.resolve(kernels.CUDNN, jnp.float32, 128)      # resolved for bf16, fed f32


@pytest.mark.parametrize("dtype,head_dim,devices,why", [
    (jnp.bfloat16, 128, [_gpu()], None),
    (jnp.float16, 256, [_gpu()], None),                         # Hopper: up to 256
    (jnp.bfloat16, 256, [_gpu("NVIDIA A100-SXM4-80GB", "8.0")], "at most 128"),
    (jnp.bfloat16, 36, [_gpu()], "multiple of 8 and at most 256 on these GPUs; this model's is 36"),
    (jnp.float32, 128, [_gpu()], "bfloat16 or float16 inputs, not float32"),
    (jnp.bfloat16, 128, [_gpu(), types.SimpleNamespace(platform="cpu", device_kind="cpu")],
     "needs NVIDIA GPUs"),
])
def test_where_cudnn_can_run(dtype, head_dim, devices, why):
    got = kernels.cudnn_refusal(dtype, head_dim, devices)
    assert (got is None) if why is None else (why in got), got
    want = kernels.CUDNN if why is None else kernels.XLA
    assert kernels.resolve("auto", dtype, head_dim, devices) == want


def test_the_run_records_which_kernel_its_attention_runs():
    from spotlight_jax.models import AttentionSpec
    from spotlight_jax.runner.outputs import attention_kernel

    model = types.SimpleNamespace(dtype="bfloat16", head_dim=128)
    assert attention_kernel(AttentionSpec(), model) == {
        "requested": "auto", "kernel": "xla", "strategy": "dense",
        "not_cudnn": "cuDNN flash attention needs NVIDIA GPUs; the devices are cpu (cpu)"}
    gpus = types.SimpleNamespace(devices=np.array([_gpu(), _gpu()], dtype=object))
    assert attention_kernel(AttentionSpec(mesh=gpus, strategy="ulysses"), model) == {
        "requested": "auto", "kernel": "cudnn", "strategy": "ulysses"}
    assert attention_kernel(AttentionSpec(mesh=gpus, impl="xla"), model)["not_cudnn"] == \
        "attention_impl='xla'"
    assert "not float32" in attention_kernel(
        AttentionSpec(mesh=gpus), types.SimpleNamespace(dtype="float32", head_dim=128))[
        "not_cudnn"]


def prefix_mask(batch, seq, lengths):
    return jnp.asarray(np.arange(seq)[None, :] < np.asarray(lengths)[:, None])


# 71 keys (no SP degree divides them): image first, then text whose padding is masked; batch row
# 1 keeps fewer keys; 6 heads make usp at sp=4 a 2x2 split and ulysses at sp=4 fall back to ring
@pytest.mark.parametrize("strategy,sp", [(s, sp) for s in STRATEGIES for sp in (1, 4)
                                         if s != "dense" or sp == 1])
def test_the_lengths_path_equals_the_dense_reference(strategy, sp):
    q, k, v, ct = make_inputs(seq=71, heads=6, seed=2)
    mask = prefix_mask(2, 71, [68, 40])
    mesh = None if sp == 1 else sp_mesh(sp, "1d")
    got = forward_and_grads(lambda q, k, v: attention(
        q, k, v, mesh=mesh, strategy=strategy, kv_mask=mask, implementation=LENGTHS),
        q, k, v, ct)
    want = forward_and_grads(lambda q, k, v: reference_attention(q, k, v, mask), q, k, v, ct)
    assert_close(got, want)


def test_a_ring_block_with_no_valid_key_and_a_row_with_none_merge_to_the_reference():
    """Ring over 4 blocks of 12 keys: batch row 0 keeps 13 keys (blocks 2 and 3 empty), row 1
    none at all (zeros, finite gradients)."""
    q, k, v, ct = make_inputs(seq=48, heads=4, seed=4)
    mask = prefix_mask(2, 48, [13, 0])
    got = forward_and_grads(lambda q, k, v: attention(
        q, k, v, mesh=sp_mesh(4, "1d"), strategy="ring", kv_mask=mask, implementation=LENGTHS),
        q, k, v, ct)
    want = forward_and_grads(lambda q, k, v: reference_attention(q, k, v, mask), q, k, v, ct)
    assert_close(got, want)
    assert float(jnp.abs(got[0][1]).max()) == 0.0


def test_a_mask_that_is_not_a_prefix_gives_nan_rows_under_a_lengths_kernel():
    q, k, v, _ = make_inputs(seq=16, heads=2, seed=5)
    mask = np.ones((2, 16), bool)
    mask[0, 3] = False                       # a hole: row 0 cannot be said as a length
    out = attention(q, k, v, kv_mask=jnp.asarray(mask), implementation=LENGTHS)
    assert np.isnan(np.asarray(out[0])).all() and np.isfinite(np.asarray(out[1])).all()
    # XLA's own form takes any mask
    out = attention(q, k, v, kv_mask=jnp.asarray(mask), implementation="xla")
    np.testing.assert_allclose(out, reference_attention(q, k, v, jnp.asarray(mask)), atol=1e-5)


@pytest.mark.parametrize("seq", [20, 21])
def test_with_lse_gives_the_log_sum_exp_of_the_scaled_logits(seq):
    q, k, v, _ = make_inputs(seq=seq, heads=2, seed=6)
    mask = prefix_mask(2, seq, [seq, 7])
    out, lse = kernels.attend_with_lse(LENGTHS, q, k, v, mask)
    assert out.shape == q.shape and lse.shape == (2, 2, seq)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") / np.sqrt(q.shape[-1])
    s = jnp.where(mask[:, None, None, :], s, -jnp.inf)
    np.testing.assert_allclose(lse, jax.nn.logsumexp(s, axis=-1), atol=1e-5)
    np.testing.assert_allclose(out, reference_attention(q, k, v, mask), atol=1e-5)


def _tiny_model(**over):
    from flax import nnx

    from spotlight_jax.models import MMDiT, MMDiTConfig
    cfg = MMDiTConfig(image_size=16, patch_size=4, width=48, depth=2, num_heads=4,
                      text_len=8, text_width=32, text_layers=1, text_heads=2, **over)
    return MMDiT(cfg, rngs=nnx.Rngs(0)), cfg


@pytest.mark.e2e          # two model programs per case (~20 s each on 2 cores)
@pytest.mark.parametrize("over", [{}, {"single_blocks": 1, "pos_embed": "rope3d",
                                       "rope_axes": (4, 4, 4), "dual_attention_layers": (1,)}])
def test_the_model_with_the_text_last_for_a_lengths_kernel_equals_the_text_first(over):
    """The joint sequence reordered (image first, padded text last, as cuDNN needs) gives the
    same velocity as the default order, with the text mask in play."""
    from spotlight_jax.models.mmdit import AttentionSpec
    model, cfg = _tiny_model(**over)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 16, 16, 3)), jnp.float32)
    t = jnp.asarray([0.3, 0.8], jnp.float32)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (2, cfg.text_len)), jnp.int32)
    text_mask = prefix_mask(2, cfg.text_len, [8, 3])
    first = model(x, t, tokens, text_mask, attn=AttentionSpec(impl="xla"))
    spec = AttentionSpec(impl=LENGTHS)
    assert spec.resolved(jnp.float32, cfg.head_dim).text_last
    last = model(x, t, tokens, text_mask, attn=spec)
    np.testing.assert_allclose(last, first, atol=1e-5)
    assert not dataclasses.replace(spec, impl="xla").resolved(jnp.float32, 12).text_last


@pytest.mark.parametrize("q_len, kv_len", [(21, 21), (20, 9), (9, 20)])
def test_odd_lengths_are_padded_by_one_masked_position_and_equal_the_reference(q_len, kv_len):
    """cuDNN's attention refuses odd lengths when differentiated (SD3.5's 333 + 1024 tokens):
    the kernel pads one zero query row (sliced off) or one masked key; no mask becomes one."""
    q, _, _, _ = make_inputs(seq=q_len, heads=2, seed=7)
    _, k, v, _ = make_inputs(seq=kv_len, heads=2, seed=8)
    ct = jnp.ones_like(q)
    for mask in (None, prefix_mask(2, kv_len, [kv_len, 5])):
        got = forward_and_grads(lambda q, k, v, m=mask: kernels.attend(LENGTHS, q, k, v, m),
                                q, k, v, ct)
        want = forward_and_grads(lambda q, k, v, m=mask: reference_attention(q, k, v, m),
                                 q, k, v, ct)
        assert got[0].shape == q.shape
        assert_close(got, want)
