"""The remat policies (``model.remat_policy``): every policy gives the gradient of the model
without remat exactly (rematerialisation changes what is stored, never the math), and XLA's
cost analysis of the compiled gradient orders them as the cost model charges them: no remat <
keep every matmul output <= keep the projections' outputs < keep nothing (a whole forward
again). The cost model's recompute share (``emulation.flops.remat_recompute_fraction``) is
checked against the same analysis."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.emulation.flops import remat_recompute_fraction
from spotlight_jax.models import MMDiT, MMDiTConfig

BASE = MMDiTConfig(image_size=16, patch_size=2, width=64, depth=2, num_heads=4, text_len=8,
                   text_width=32, text_layers=1, text_heads=2)
POLICIES = {"none": {"remat": False}, "nothing": {"remat": True},
            "attention": {"remat": True, "remat_policy": "attention"},
            "dots_no_batch": {"remat": True, "remat_policy": "dots_no_batch"},
            "dots_attention": {"remat": True, "remat_policy": "dots_attention"},
            "dots": {"remat": True, "remat_policy": "dots"}}


@pytest.mark.e2e          # six gradient programs compiled: ~40 s
def test_every_policy_gives_the_same_gradient_and_costs_what_it_keeps():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 16, 16, 3)), jnp.float32)
    t = jnp.asarray([0.3, 0.8])
    tokens = jnp.asarray(rng.integers(1, BASE.vocab_size, (2, BASE.text_len)), jnp.int32)
    mask = jnp.asarray(np.arange(BASE.text_len)[None] < np.array([[8], [5]]))
    grads, flops = {}, {}
    for name, over in POLICIES.items():
        cfg = dataclasses.replace(BASE, **over)
        graphdef, state = nnx.split(MMDiT(cfg, rngs=nnx.Rngs(0)))
        grad = jax.jit(jax.grad(lambda s, g=graphdef: jnp.mean(
            nnx.merge(g, s)(x, t, tokens, mask) ** 2)))
        analysis = grad.lower(state).compile().cost_analysis()
        flops[name] = (analysis[0] if isinstance(analysis, list) else analysis)["flops"]
        grads[name] = jax.tree.leaves(grad(state))
    for name in POLICIES:
        assert all(np.array_equal(a, b) for a, b in zip(grads["none"], grads[name])), name
    assert flops["none"] < flops["dots"] <= flops["dots_no_batch"] < flops["nothing"], flops
    # XLA's attention is no fused kernel: the *attention policies keep nothing more here
    assert flops["attention"] == flops["nothing"] and (
        flops["dots_attention"] == flops["dots_no_batch"]), flops
    # keeping nothing recomputes a whole forward: about a third more than a forward + backward
    assert flops["nothing"] / flops["none"] == pytest.approx(4 / 3, abs=0.05)
    fraction = remat_recompute_fraction(dataclasses.replace(BASE, **POLICIES["dots_no_batch"]))
    assert 0 < fraction < 1
    with pytest.raises(ValueError, match="remat_policy='some': choose one of"):
        dataclasses.replace(BASE, remat_policy="some").validate()


def _attention_policy_grads(policies, run: bool):
    """Per policy, the matmul FLOPs of the lowered gradient program of ``BASE`` under the XLA
    stand-in of a fused kernel (``kernels.RECOMPUTE``), and its gradient when ``run``."""
    from spotlight_jax.bench.gpu_lowering import census
    from spotlight_jax.models import AttentionSpec
    from spotlight_jax.parallel import kernels

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 16, 16, 3)), jnp.float32)
    t = jnp.asarray([0.3, 0.8])
    tokens = jnp.asarray(rng.integers(1, BASE.vocab_size, (2, BASE.text_len)), jnp.int32)
    spec = AttentionSpec(impl=kernels.RECOMPUTE)
    seq = BASE.num_patches + BASE.text_len
    matmuls, grads = {}, {}
    for policy in policies:
        cfg = dataclasses.replace(BASE, remat=True, remat_policy=policy)
        graphdef, state = nnx.split(MMDiT(cfg, rngs=nnx.Rngs(0)))
        grad = jax.jit(jax.grad(lambda s, g=graphdef: jnp.mean(
            nnx.merge(g, s)(x, t, tokens, attn=spec) ** 2)))
        matmuls[policy] = sum(census(grad.lower(state).as_text(), {seq}).matmul_flops.values())
        if run:
            grads[policy] = jax.tree.leaves(grad(state))
    return matmuls, grads, seq


def test_the_attention_policy_keeps_a_fused_kernels_outputs_instead_of_recomputing_them():
    """Under the XLA stand-in of a fused kernel (whose forward names its output and
    log-sum-exp), ``attention`` keeps them: the step's program has one attention forward fewer
    per block (its two matmuls, 4 b h s^2 d FLOPs) than under ``nothing``."""
    matmuls, _, seq = _attention_policy_grads(("nothing", "attention"), run=False)
    assert matmuls["nothing"] - matmuls["attention"] == BASE.depth * 4 * 2 * seq * seq * BASE.width


@pytest.mark.e2e          # two gradient programs compiled and run: ~15 s
def test_the_attention_policy_keeps_the_gradient_under_a_fused_kernel():
    _, grads, _ = _attention_policy_grads(("nothing", "attention"), run=True)
    assert all(np.array_equal(a, c) for a, c in zip(grads["nothing"], grads["attention"]))
