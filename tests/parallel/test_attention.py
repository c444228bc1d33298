"""Sequence-parallel attention vs an independent dense reference, on 8 emulated CPU devices.

Forward outputs and dQ/dK/dV of every strategy must match a plain-softmax einsum on one device to
1e-5 (float32) on 1-D (``sp``) and 2-D (``data`` x ``sp``) meshes, inside ``jax.jit`` and eagerly
(plain calls and eager ``jax.grad``, as in a notebook). Inputs are rank-coded (position and head
offsets on top of noise) so a misordered shard or head shows up as an error.
"""
import contextlib
import functools
import importlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spotlight_jax.parallel import STRATEGIES, MeshConfig, attention, make_mesh

# The package re-exports the function under the module's name; fetch the module itself.
attention_lib = importlib.import_module("spotlight_jax.parallel.attention")

TOL = 1e-5
# Compile-time budget: ~40 small programs are compiled here; LLVM -O0 halves XLA:CPU compile time
# and leaves the HLO (and so the numerics under test) unchanged.
FAST_COMPILE = {"xla_backend_optimization_level": 0}
SP_DEGREES = (1, 2, 3, 4, 6, 8)
# Heads per strategy, chosen so most cases run the strategy itself rather than its fallback:
# 24 heads divide every SP degree (pure Ulysses); with 6 heads usp splits sp=4 into 2x2 and
# sp=8 into 2x4, and is pure Ulysses at 2, 3, 6.
HEADS = {"dense": 4, "ulysses": 24, "ring": 4, "usp": 6}


def reference_attention(q, k, v, kv_mask=None):
    """Dense softmax attention in float32 numerics; rows without a valid key give zeros."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") / np.sqrt(q.shape[-1])
    if kv_mask is not None:
        valid = kv_mask[:, None, None, :]
        s = jnp.where(valid, s, -1e30)
        p = jnp.exp(s - s.max(-1, keepdims=True)) * valid
        p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
    else:
        p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v, precision="highest")


def rank_coded(rng, batch, seq, heads, dim):
    """Noise plus a per-position and per-head offset: a swapped shard or head changes values."""
    pos = np.arange(seq)[None, :, None, None] / seq
    head = np.arange(heads)[None, None, :, None] / heads
    lane = np.arange(dim)[None, None, None, :] / dim
    noise = 0.5 * rng.standard_normal((batch, seq, heads, dim))
    return jnp.asarray(noise + pos * (1 + lane) - head, jnp.float32)


def make_inputs(batch=2, seq=48, heads=4, dim=8, seed=0):
    """Rank-coded q, k, v and a random output cotangent (numpy-generated: nothing to compile)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rank_coded(rng, batch, seq, heads, dim) for _ in range(3))
    return q, k, v, jnp.asarray(rng.standard_normal(q.shape), jnp.float32)


def forward_and_grads(fn, q, k, v, cotangent):
    """Output and gradients of sum(fn(q, k, v) * cotangent), in one jitted program."""
    def run(q, k, v, cotangent):
        out, vjp = jax.vjp(fn, q, k, v)
        return out, vjp(cotangent)
    return jax.jit(run, compiler_options=FAST_COMPILE)(q, k, v, cotangent)


@functools.cache
def expected(batch=2, seq=48, heads=4, dim=8, seed=0, mask=None):
    """Reference output and grads for ``make_inputs(...)`` and ``make_mask(mask)``, once."""
    kv_mask = make_mask(mask)
    return forward_and_grads(lambda q, k, v: reference_attention(q, k, v, kv_mask),
                             *make_inputs(batch, seq, heads, dim, seed))


def make_mask(name):
    if name is None:
        return None
    if name == "joint":  # 7 text + 64 image tokens; trailing text padding masked out
        mask = np.ones((2, 71), bool)
        mask[0, 3:7] = mask[1, 5:7] = False
    elif name == "empty_row":  # random keys; batch row 1 has no valid key at all
        mask = np.random.default_rng(3).random((2, 24)) < 0.6
        mask[1] = False
    return jnp.asarray(mask)


def assert_close(got, want, tol=TOL):
    """Max abs error of output and dq, dk, dv (in numpy: eager jnp ops on sharded arrays would
    each compile a small program)."""
    names = ("out", "dq", "dk", "dv")
    got, want = (jax.tree.leaves(jax.device_get(x)) for x in (got, want))
    errors = {n: float(np.max(np.abs(g - w))) for n, g, w in zip(names, got, want)}
    assert max(errors.values()) <= tol, errors


def sp_mesh(sp, kind):
    """1-D: an Explicit ``("sp",)`` mesh from jax.make_mesh; 2-D: the project's Auto
    ``(data=2, fsdp=1, sp)`` mesh."""
    if kind == "1d":
        return jax.make_mesh((sp,), ("sp",), devices=jax.devices()[:sp])
    return make_mesh(jax.devices()[:2 * sp], MeshConfig(data=2, fsdp=1, sp=sp))


CASES = [(s, sp, kind) for s in STRATEGIES for sp in SP_DEGREES
         for kind in ("1d", "2d") if kind == "1d" or 2 * sp <= 8]


@pytest.mark.parametrize("strategy,sp,kind", CASES)
def test_matches_dense_reference(strategy, sp, kind):
    q, k, v, ct = make_inputs(heads=HEADS[strategy])
    mesh = sp_mesh(sp, kind)
    got = forward_and_grads(
        lambda q, k, v: attention(q, k, v, mesh=mesh, strategy=strategy), q, k, v, ct)
    assert got[0].shape == q.shape and got[0].dtype == q.dtype
    assert_close(got, expected(heads=HEADS[strategy]))


@pytest.mark.parametrize("strategy", ["ulysses", "ring", "usp"])
@pytest.mark.parametrize("sp", [4, 6])
def test_joint_text_image_sequence_padding_and_mask(strategy, sp):
    """71 tokens (no SP degree divides it) with some text keys masked. 6 heads: at sp=4 ulysses
    falls back to ring and usp splits 2x2; at sp=6 both are pure Ulysses."""
    q, k, v, ct = make_inputs(seq=71, heads=6, seed=1)
    kv_mask, mesh = make_mask("joint"), sp_mesh(sp, "1d")
    got = forward_and_grads(
        lambda q, k, v: attention(q, k, v, mesh=mesh, strategy=strategy, kv_mask=kv_mask),
        q, k, v, ct)
    assert_close(got, expected(seq=71, heads=6, seed=1, mask="joint"))


def test_cross_attention_lengths_differ():
    """q has 20 tokens, k/v 35 (both padded differently); usp 2x2 runs all_to_all and ring."""
    q, _, _, ct = make_inputs(seq=20, heads=6, seed=7)
    _, k, v, _ = make_inputs(seq=35, heads=6, seed=8)
    kv_mask = jnp.asarray(np.arange(35)[None, :] < np.array([[35], [30]]))
    mesh = sp_mesh(4, "1d")
    got = forward_and_grads(
        lambda q, k, v: attention(q, k, v, mesh=mesh, strategy="usp", kv_mask=kv_mask),
        q, k, v, ct)
    want = forward_and_grads(lambda q, k, v: reference_attention(q, k, v, kv_mask), q, k, v, ct)
    assert_close(got, want)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_kv_mask_with_fully_masked_row_gives_zeros(strategy):
    q, k, v, ct = make_inputs(seq=24, heads=4, seed=2)
    kv_mask = make_mask("empty_row")
    mesh = make_mesh(jax.devices()[:8], MeshConfig(data=2, fsdp=1, sp=4))
    got = jax.device_get(forward_and_grads(
        lambda q, k, v: attention(q, k, v, mesh=mesh, strategy=strategy, kv_mask=kv_mask),
        q, k, v, ct))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(got))
    assert not np.any(got[0][1])  # the all-masked batch row is zeros
    assert_close(got, expected(seq=24, heads=4, seed=2, mask="empty_row"))


def test_usp_with_axis_pair_and_reduced_ulysses_degree(caplog):
    """usp over (ulysses_axis, ring_axis) of a 2-D mesh; 6 heads shrink Ulysses 4 -> 2."""
    mesh = Mesh(np.asarray(jax.devices()).reshape(2, 4), ("ring", "uly"))
    for heads in (4, 6):  # 4: ulysses 4 x ring 2; 6: ulysses 2 x ring 4
        q, k, v, ct = make_inputs(seq=40, heads=heads, seed=heads)
        got = forward_and_grads(
            lambda q, k, v: attention(q, k, v, mesh=mesh, strategy="usp", axis=("uly", "ring")),
            q, k, v, ct)
        assert_close(got, expected(seq=40, heads=heads, seed=heads))


def test_heads_not_divisible_falls_back_to_ring_and_logs_once(caplog):
    attention_lib._log_once.cache_clear()
    q, k, v, ct = make_inputs(seq=24, heads=8)
    mesh = sp_mesh(6, "1d")
    with caplog.at_level(logging.INFO, logger=attention_lib.__name__):
        for _ in range(2):
            got = forward_and_grads(
                lambda q, k, v: attention(q, k, v, mesh=mesh, strategy="ulysses"), q, k, v, ct)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, messages
    assert "8 heads do not divide SP degree 6" in messages[0]
    assert "using ring attention" in messages[0]
    assert_close(got, expected(seq=24, heads=8))


def test_unknown_strategy_and_missing_axis_raise():
    q, k, v, _ = make_inputs(seq=8)
    mesh = sp_mesh(2, "1d")
    with pytest.raises(ValueError, match="dense.*ulysses.*ring.*usp"):
        attention(q, k, v, mesh=mesh, strategy="flash")
    with pytest.raises(ValueError, match="valid axis names: \\('sp',\\)"):
        attention(q, k, v, mesh=mesh, strategy="ring", axis="seq")


def projection_loss(x, w, attn):
    """A toy jitted step: q/k/v are projections of x, so attention sees intermediates."""
    b, s, _ = x.shape
    q, k, v = (jnp.einsum("bsc,cd->bsd", x, wi).reshape(b, s, 4, 8) for wi in w)
    return jnp.sum(attn(q, k, v) ** 2)


def projection_inputs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 30, 32)).astype(np.float32)  # 30 % 4 != 0: padded inside jit
    return x, (rng.standard_normal((3, 32, 32)) / 6).astype(np.float32)


@functools.cache
def projection_expected():
    return jax.jit(jax.value_and_grad(projection_loss), static_argnums=2)(
        *projection_inputs(), reference_attention)


@pytest.mark.parametrize("strategy", ["ulysses", "ring", "usp"])
def test_inside_jit_with_batch_sharded_intermediates(strategy):
    """q/k/v are intermediates of a jitted step whose batch is sharded over data."""
    mesh = make_mesh(jax.devices()[:8], MeshConfig(data=2, fsdp=1, sp=4))
    x, w = projection_inputs()
    sp_attn = lambda q, k, v: attention(q, k, v, mesh=mesh, strategy=strategy)
    got = jax.jit(jax.value_and_grad(projection_loss), static_argnums=2,
                  compiler_options=FAST_COMPILE)(
        jax.device_put(x, NamedSharding(mesh, P("data"))), w, sp_attn)
    want = projection_expected()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_eager_single_device_inputs_bfloat16_and_dense_paths():
    """Plain single-device arrays, called eagerly on an Explicit mesh; bf16 keeps its dtype."""
    q, k, v, _ = make_inputs(seq=24)
    mesh = jax.make_mesh((2, 4), ("data", "sp"), axis_types=(AxisType.Explicit,) * 2)
    bf16 = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    out = attention(*bf16, mesh=mesh, strategy="ring")
    assert isinstance(out, jax.Array) and out.shape == q.shape and out.dtype == jnp.bfloat16
    # Reference on the same bf16-rounded inputs; the remaining error is bf16 rounding of the
    # probabilities fed to the PV matmul and of the output (2^-8 relative, |out| < 4).
    want = jax.jit(reference_attention)(*[x.astype(jnp.float32) for x in bf16])
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=4 * 2**-8)
    want = expected(seq=24)[0]
    for kwargs in ({}, {"mesh": None, "strategy": "ring"}, {"mesh": mesh, "strategy": "dense"},
                   {"mesh": mesh, "strategy": "usp"}):
        np.testing.assert_allclose(np.asarray(attention(q, k, v, **kwargs)), want, atol=TOL)


# Heads for the eager tests at sp=4: ulysses runs pure Ulysses, usp splits into ulysses 2 x ring 2.
EAGER_HEADS = {"ulysses": 4, "ring": 4, "usp": 6}


def explicit_mesh(kind):
    """``jax.make_mesh`` with its default ``Explicit`` axes: the mesh a notebook user makes first,
    and the one eager ``jax.grad`` used to fail on."""
    if kind == "1d":
        return jax.make_mesh((4,), ("sp",), devices=jax.devices()[:4])
    return jax.make_mesh((2, 4), ("data", "sp"))


# Every strategy on both meshes, unplaced and placed; unplaced under set_mesh (a mesh context with
# Explicit axes changes the eager path, whatever the strategy) once per mesh.
EAGER_CASES = [(s, kind, placement) for s in ("ulysses", "ring", "usp") for kind in ("1d", "2d")
               for placement in ("unplaced", "placed")] + [
    ("ring", kind, "unplaced_under_set_mesh") for kind in ("1d", "2d")]


@pytest.mark.parametrize("strategy,kind,placement", EAGER_CASES)
def test_eager_forward_and_grad_match_dense(strategy, kind, placement):
    """Eager forward and eager ``jax.grad`` w.r.t. q, k, v, outside any jit, vs the dense reference.

    ``unplaced``: plain single-device arrays and no mesh context (22 tokens: padded to 24).
    ``unplaced_under_set_mesh``: the same inside ``jax.set_mesh(mesh)``. ``placed``: inputs already
    sequence-sharded on the mesh with a NamedSharding (24 tokens), inside ``jax.set_mesh(mesh)``,
    which JAX itself needs for eager ``jax.grad`` of any value on an ``Explicit`` mesh.
    Gradients come back placed like their inputs.
    """
    seq, heads = (24 if placement == "placed" else 22), EAGER_HEADS[strategy]
    q, k, v, ct = make_inputs(seq=seq, heads=heads, seed=4)
    mesh = explicit_mesh(kind)
    if placement == "placed":
        spec = P(None, "sp") if kind == "1d" else P("data", "sp")
        q, k, v = (jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v))

    def loss(q, k, v):
        out = attention(q, k, v, mesh=mesh, strategy=strategy)
        return jnp.sum(out * ct), out

    with contextlib.nullcontext() if placement == "unplaced" else jax.set_mesh(mesh):
        out = attention(q, k, v, mesh=mesh, strategy=strategy)
        grads, out_in_grad = jax.grad(loss, (0, 1, 2), has_aux=True)(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    want = expected(seq=seq, heads=heads, seed=4)
    assert_close((out, *grads), want)
    assert_close((out_in_grad, *grads), want)
    for grad, x in zip(grads, (q, k, v)):
        assert grad.sharding.is_equivalent_to(x.sharding, x.ndim), (grad.sharding, x.sharding)
