"""MMDiT: shapes, adaLN-Zero start, scan == loop, and sharded forward/backward on a
(data=2, sp=4) mesh equal to the single-device result for every attention strategy."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import MICRO, micro_model

from spotlight_jax import world
from spotlight_jax.models import AttentionSpec, MMDiT
from spotlight_jax.parallel import MeshConfig, make_mesh
from spotlight_jax.parallel.sharding import shard_state


def inputs(cfg, b=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, cfg.image_size, cfg.image_size, cfg.channels)).astype(np.float32)
    t = rng.uniform(size=(b,)).astype(np.float32)
    prompts = ["a red bar", "two blue squares", 'the text "37"',
               "a red bar on the left of a blue square"][:b]
    tokens, mask = world.tokenize(prompts, cfg.text_len)
    return x, t, tokens, mask


def test_fresh_model_outputs_zero_velocity_adaln_zero():
    model = nnx.jit(lambda: MMDiT(MICRO, rngs=nnx.Rngs(0)))()   # compiled: eager ops compile
    v = nnx.jit(lambda m, *a: m(*a))(model, *inputs(MICRO))      # one by one
    assert v.shape == (4, 16, 16, 3)
    np.testing.assert_array_equal(v, 0.0)


def test_scan_over_blocks_equals_python_loop():
    cfg, graphdef, state = micro_model(seed=1)
    scfg = dataclasses.replace(cfg, scan_blocks=True, remat=True)
    sgraph, sstate = nnx.split(nnx.eval_shape(lambda: MMDiT(scfg, rngs=nnx.Rngs(0))))
    # copy the loop model's per-block weights into the stacked layout
    loop = nnx.to_pure_dict(state)
    stacked = nnx.to_pure_dict(sstate)
    blocks = [loop["blocks"][i] for i in range(cfg.depth)]
    stacked["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
    for k in loop:
        if k != "blocks":
            stacked[k] = loop[k]
    nnx.replace_by_pure_dict(sstate, stacked)
    x = inputs(cfg)
    def run(g):
        return jax.jit(lambda st, *a: nnx.merge(g, st)(*a))
    a = run(graphdef)(state, *x)
    b = run(sgraph)(sstate, *x)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def reference():
    # 4 heads so ulysses divides sp=4; text_len 12 + 16 image tokens = 28 (7 per sp shard)
    cfg, graphdef, state = micro_model(seed=2, image_size=16, text_len=12)
    x = inputs(cfg)

    def loss(s, attn):
        v = nnx.merge(graphdef, s)(*x, attn=attn)
        return jnp.mean(v ** 2), v

    (l0, v0), g0 = jax.jit(jax.value_and_grad(lambda s: loss(s, AttentionSpec()),
                                              has_aux=True))(state)
    return cfg, graphdef, state, x, loss, v0, g0


@pytest.mark.parametrize("strategy", ["dense", "ulysses", "ring", "usp"])
def test_sharded_forward_backward_matches_single_device(reference, strategy):
    cfg, graphdef, state, x, loss, v0, g0 = reference
    mesh = make_mesh(jax.devices(), MeshConfig(data=2, fsdp=1, sp=4))
    sharded = shard_state(state, mesh)
    attn = AttentionSpec(mesh=mesh, strategy=strategy)
    (l1, v1), g1 = jax.jit(jax.value_and_grad(lambda s: loss(s, attn), has_aux=True))(sharded)
    rel = float(jnp.max(jnp.abs(v1 - v0)) / jnp.max(jnp.abs(v0)))
    assert rel <= 1e-4, rel
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        scale = float(jnp.max(jnp.abs(a))) or 1.0
        assert float(jnp.max(jnp.abs(a - b))) / scale <= 1e-4
