"""``kernels.RECOMPUTE``: XLA's attention differentiated as a fused kernel is (the backward
keeps q, k, v, the output and the row log-sum-exp, and recomputes the probabilities). Equal to
XLA's attention in value and gradients, masked and empty rows included; its residuals hold no
score matrix, which is what the dry run's fused-attention estimate counts."""
import jax
import jax.numpy as jnp
import numpy as np

from spotlight_jax.parallel import kernels


def _inputs():
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (3, 7, 2, 4))
    k = jax.random.normal(ks[1], (3, 11, 2, 4))
    v = jax.random.normal(ks[2], (3, 11, 2, 4))
    mask = jnp.array([[True] * 11, [True] * 4 + [False] * 7, [False] * 11])   # last: no key
    return q, k, v, mask, jax.random.normal(ks[3], (3, 7, 2, 4))


def test_recomputed_attention_equals_xla_with_gradients():
    q, k, v, mask, w = _inputs()
    for m in (None, mask):
        def loss(kernel, m=m):
            return lambda q, k, v: jnp.sum(kernels.attend(kernel, q, k, v, m) * w)

        want, want_grads = jax.value_and_grad(loss(kernels.XLA), argnums=(0, 1, 2))(q, k, v)
        got, got_grads = jax.value_and_grad(loss(kernels.RECOMPUTE), argnums=(0, 1, 2))(q, k, v)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for a, b in zip(got_grads, want_grads):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_recomputed_attention_keeps_no_score_matrix():
    q, k, v, mask, _ = _inputs()

    def largest_residual(kernel):
        _, vjp = jax.vjp(lambda q, k, v: kernels.attend(kernel, q, k, v, mask), q, k, v)
        return max(a.size for a in jax.tree.leaves(vjp))

    scores = 3 * 2 * 7 * 11         # batch x heads x queries x keys (> k, v: 3 x 11 x 2 x 4)
    assert largest_residual(kernels.XLA) >= scores
    assert largest_residual(kernels.RECOMPUTE) < scores


def test_fused_estimate_only_where_a_gpu_would_run_cudnn():
    assert kernels.fused_on_gpus("auto", jnp.bfloat16, 128)
    assert kernels.fused_on_gpus("cudnn", jnp.float16, 256)
    assert not kernels.fused_on_gpus("xla", jnp.bfloat16, 128)        # forced XLA
    assert not kernels.fused_on_gpus("auto", jnp.float32, 128)        # cuDNN takes half only
    assert not kernels.fused_on_gpus("auto", jnp.bfloat16, 12)        # not a multiple of 8
    assert not kernels.fused_on_gpus("auto", jnp.bfloat16, 512)
