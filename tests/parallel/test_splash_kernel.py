"""Splash attention (the Pallas TPU kernel) in every attention path, run on CPU in interpret mode.

The same Pallas kernel a TPU runs, interpreted here: each SP strategy with it equals the dense
float32 reference (forward and gradients, 1e-5) on lengths that are not whole tiles, a mask with
a hole in it (segment ids take any mask, not only a prefix) and a batch row without any valid
key (zeros, finite gradients). What a TPU's compiler makes of it is read from the lowering
(``bench.tpu_lowering``), not here.
"""
import re
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

SPLASH = kernels.Kernel("splash", interpret=True)


def _tpu(kind="TPU v5 lite"):
    return types.SimpleNamespace(platform="tpu", device_kind=kind)


def _mask(batch_lengths, seq, hole=None):
    mask = np.arange(seq)[None, :] < np.asarray(batch_lengths)[:, None]
    if hole is not None:
        mask[0, hole] = False
    return jnp.asarray(mask)


def test_auto_is_splash_on_tpus_and_a_forced_splash_elsewhere_says_why_in_one_line():
    assert kernels.resolve("auto", jnp.bfloat16, 128, [_tpu(), _tpu()]) == kernels.SPLASH
    assert kernels.resolve("splash", jnp.float32, 64, [_tpu()]) == kernels.SPLASH
    assert kernels.resolve("xla", jnp.bfloat16, 128, [_tpu()]) == kernels.XLA
    assert kernels.resolve("auto", jnp.bfloat16, 128) == kernels.XLA           # these CPUs
    with pytest.raises(ValueError, match=r"attention_impl='splash' cannot run here: splash "
                                         r"attention is a TPU kernel; the devices are cpu"):
        kernels.resolve("splash", jnp.bfloat16, 128)
    assert kernels.splash_refusal([_tpu(), types.SimpleNamespace(
        platform="cpu", device_kind="cpu")]) is not None
    assert SPLASH.fused and kernels.SPLASH.fused and not kernels.XLA.fused


# 71 keys (neither a whole tile nor divided by the SP degree); batch row 0 has a hole in its
# mask and row 1 fewer keys; 6 heads make usp at sp=4 a 2x2 split and ulysses fall back to ring
@pytest.mark.parametrize("strategy,sp", [(s, sp) for s in STRATEGIES for sp in (1, 4)
                                         if s != "dense" or sp == 1])
def test_every_path_with_splash_equals_the_dense_reference(strategy, sp):
    q, k, v, ct = make_inputs(seq=71, heads=6, seed=2)
    mask = _mask([68, 40], 71, hole=5)
    mesh = None if sp == 1 else sp_mesh(sp, "1d")
    got = forward_and_grads(lambda q, k, v: attention(
        q, k, v, mesh=mesh, strategy=strategy, kv_mask=mask, implementation=SPLASH),
        q, k, v, ct)
    want = forward_and_grads(lambda q, k, v: reference_attention(q, k, v, mask), q, k, v, ct)
    assert_close(got, want)


def test_a_ring_block_and_a_row_without_a_valid_key_give_the_reference_and_zeros():
    """Ring over 4 blocks of 12 keys: row 0 keeps 13 keys (blocks 2 and 3 empty), row 1 none
    (zeros with finite gradients)."""
    q, k, v, ct = make_inputs(seq=48, heads=4, seed=4)
    mask = _mask([13, 0], 48)
    got = forward_and_grads(lambda q, k, v: attention(
        q, k, v, mesh=sp_mesh(4, "1d"), strategy="ring", kv_mask=mask, implementation=SPLASH),
        q, k, v, ct)
    want = forward_and_grads(lambda q, k, v: reference_attention(q, k, v, mask), q, k, v, ct)
    assert_close(got, want)
    assert float(jnp.abs(got[0][1]).max()) == 0.0
    assert all(np.isfinite(np.asarray(g)).all() for g in got[1])


@pytest.mark.parametrize("q_len,kv_len", [(20, 9), (130, 40)])
def test_cross_attention_and_the_log_sum_exp_of_the_scaled_logits(q_len, kv_len):
    q, _, _, _ = make_inputs(seq=q_len, heads=2, seed=6)
    _, k, v, _ = make_inputs(seq=kv_len, heads=2, seed=7)
    mask = _mask([kv_len, 0], kv_len)
    out, lse = kernels.attend_with_lse(SPLASH, q, k, v, mask)
    assert out.shape == q.shape and lse.shape == (2, 2, q_len)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") / np.sqrt(q.shape[-1])
    s = jnp.where(mask[:, None, None, :], s, -jnp.inf)
    np.testing.assert_allclose(lse[0], jax.nn.logsumexp(s, axis=-1)[0], atol=1e-5)
    assert np.isneginf(np.asarray(lse[1])).all()
    np.testing.assert_allclose(out, reference_attention(q, k, v, mask), atol=1e-5)


def _tpu_kernels(fn, *args) -> list:
    """The Pallas kernels the gradient program of ``fn`` asks a TPU for, by name, read from
    its lowering for TPU (no TPU needed; dead code is gone by then)."""
    grad = jax.grad(fn, argnums=(0, 1, 2))
    text = jax.jit(grad).trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    return re.findall(r'kernel_name = "?(\w+)', text)


def test_a_remat_policy_that_keeps_fused_outputs_does_not_run_splash_forward_again():
    """Rematerialised with nothing saved, the backward runs splash's forward again (forward,
    forward again, dkv, dq); with ``keeps_fused_attention`` it keeps the kernel's output and
    log-sum-exp (forward, dkv, dq), and its gradients are the reference's."""
    def block(kernel, policy):
        attend = jax.checkpoint(lambda q, k, v: kernels.attend(kernel, jnp.sin(q), k, v),
                                policy=policy)
        return lambda q, k, v: jnp.sum(jnp.cos(attend(q, k, v)).astype(jnp.float32))

    shape = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)
    names = _tpu_kernels(block(kernels.SPLASH, None), shape, shape, shape)
    assert [n.split("_")[2] for n in names] == ["fwd", "fwd", "dkv", "dq"], names
    names = _tpu_kernels(block(kernels.SPLASH, kernels.keeps_fused_attention),
                         shape, shape, shape)
    assert [n.split("_")[2] for n in names] == ["fwd", "dkv", "dq"], names

    q, k, v, _ = make_inputs(seq=24, heads=2, seed=8)
    got = jax.grad(block(SPLASH, kernels.keeps_fused_attention), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda q, k, v: jnp.sum(jnp.cos(reference_attention(jnp.sin(q), k, v))),
                    argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)


@pytest.mark.e2e          # a model program in interpret mode (~20 s on 2 cores)
def test_the_model_with_splash_gives_the_velocity_it_gives_with_xla():
    """A joint text-image MMDiT (padded text, one row with 3 of 8 tokens) computes the same
    velocity with splash as with XLA's attention: the kernel plugs into the model's layout."""
    from test_kernels import _tiny_model

    from spotlight_jax.models.mmdit import AttentionSpec
    model, cfg = _tiny_model()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 16, 16, 3)), jnp.float32)
    t = jnp.asarray([0.3, 0.8], jnp.float32)
    tokens = jnp.asarray(rng.integers(1, cfg.vocab_size, (2, cfg.text_len)), jnp.int32)
    text_mask = _mask([8, 3], cfg.text_len)
    want = model(x, t, tokens, text_mask, attn=AttentionSpec(impl="xla"))
    got = model(x, t, tokens, text_mask, attn=AttentionSpec(impl=SPLASH))
    np.testing.assert_allclose(got, want, atol=1e-5)
