"""LoRA applied factored (``lora.adapted_model``: ``x W + s (x a) b``, what train steps
differentiate) against the merged weights (``lora.merge``: ``x (W + s a b)``, what samplers use):
the same velocity and the same gradients of the factors, on the MMDiT (looped and scanned
blocks, Flux's single-stream blocks), the Wan, Z-Image and FLUX.2 transformers; and the factored
gradient never forms a weight gradient of a frozen kernel."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import micro_model

from spotlight_jax import world
from spotlight_jax.models import convert
from spotlight_jax.rl import lora as lora_lib

SCALE = 2.0
TRANSFORMERS = (pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"
                / "transformer")
WAN = TRANSFORMERS / "wan"


def _random_lora(state, rank=3):
    """Adapters with b != 0 (a fresh b is zero: the adapted model would equal the base)."""
    lora = lora_lib.init_lora(state, rank, jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), len(lora))
    return {p: {"a": ad["a"], "b": 0.2 * jax.random.normal(k, ad["b"].shape)}
            for k, (p, ad) in zip(keys, sorted(lora.items()))}


def _mmdit_inputs(cfg, n=2):
    x = jax.random.normal(jax.random.key(2), (n, cfg.image_size, cfg.image_size, cfg.channels))
    t = jnp.linspace(0.2, 0.8, n)
    tokens, mask = world.tokenize(["a red bar", "two blue squares"][:n], cfg.text_len)
    return x, t, tokens, mask


def _both(graphdef, state, lora, inputs):
    """Velocity and the factors' gradient of a scalar loss, merged and factored."""
    def merged(lo):
        return nnx.merge(graphdef, lora_lib.merge(state, lo, SCALE))(*inputs)

    def factored(lo):
        return lora_lib.adapted_model(graphdef, state, lo, SCALE)(*inputs)

    def loss(f):
        def half_square(lo):
            v = f(lo)
            return jnp.sum(v ** 2) / 2, v
        return jax.jit(jax.grad(half_square, has_aux=True))

    return [loss(f)(lora)[::-1] for f in (merged, factored)]


def _assert_same(graphdef, state, lora, inputs):
    (v_m, g_m), (v_f, g_f) = _both(graphdef, state, lora, inputs)
    np.testing.assert_allclose(v_f, v_m, rtol=1e-5, atol=1e-5)
    top = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_m))
    # (the last block's text-stream output is unused: its factors' gradient is 0 in both)
    assert sum(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(g_m)) > len(lora)
    for (path, gm), gf in zip(jax.tree_util.tree_leaves_with_path(g_m), jax.tree.leaves(g_f)):
        np.testing.assert_allclose(gf, gm, rtol=1e-4, atol=1e-5 * top,
                                   err_msg=jax.tree_util.keystr(path))


def test_factored_lora_equals_merged_on_the_mmdit():
    # scanned, rematerialised blocks (the factors are sliced by the scan; nnx.remat refuses a
    # built model's mutation) and Flux's single-stream blocks, whose out projects [attn; MLP]
    cfg, graphdef, state = micro_model(depth=1, scan_blocks=True, remat=True, single_blocks=1,
                                       pos_embed="rope3d", rope_axes=(2, 2, 4))
    _assert_same(graphdef, state, _random_lora(state), _mmdit_inputs(cfg))


@pytest.mark.parametrize("scan", [False, pytest.param(True, marks=pytest.mark.e2e)],
                         ids=["looped", "scanned"])
def test_factored_lora_equals_merged_on_the_wan_transformer(scan):
    model, _ = convert.from_diffusers(WAN, scan_blocks=scan)
    graphdef, state = nnx.split(model)
    ref = np.load(WAN.with_suffix(".npz"))      # a small clip, its times and text states
    inputs = tuple(jnp.asarray(ref[k]) for k in ("odd_x", "odd_t", "odd_text"))
    _assert_same(graphdef, state, _random_lora(state), inputs)


@pytest.mark.parametrize("name, scan", [("z_image", False), ("flux2_klein", False),
                                        pytest.param("z_image", True, marks=pytest.mark.e2e),
                                        pytest.param("flux2_klein", True,
                                                     marks=pytest.mark.e2e)])
def test_factored_lora_equals_merged_on_z_image_and_flux2(name, scan):
    """Z-Image (adapters on its main layers and noise refiner, a padded caption) and FLUX.2
    (dual- and single-stream blocks) on their fixtures' odd case."""
    model, _ = convert.from_diffusers(TRANSFORMERS / name, scan_blocks=scan)
    graphdef, state = nnx.split(model)
    ref = np.load(TRANSFORMERS / f"{name}.npz")
    inputs = tuple(jnp.asarray(ref[f"odd/{k}"]) for k in ("x", "t", "text"))
    if name == "z_image":
        inputs += (jnp.asarray(ref["odd/mask"]),)
    _assert_same(graphdef, state, _random_lora(state), inputs)


def test_factored_gradient_forms_no_weight_gradient_of_a_frozen_kernel():
    # The merged form's backward computes x^T dy for every adapted kernel (then projects it on
    # the factors); the factored one's products are all rank-sized. Checked on the gradient's
    # program: no dot product outputs a kernel-shaped matrix (the micro model's activations are
    # 3-D, so a 2-D kernel-shaped output can only be a weight gradient or a merge).
    cfg, graphdef, state = micro_model()
    lora = _random_lora(state)
    inputs = _mmdit_inputs(cfg)
    kernels = {tuple(w.shape) for w in jax.tree.leaves(nnx.to_pure_dict(state)) if w.ndim == 2}
    kernels |= {s[::-1] for s in kernels}

    def kernel_shaped_dots(f):
        jaxpr = jax.make_jaxpr(jax.grad(lambda lo: jnp.sum(f(lo) ** 2)))(lora).jaxpr
        return [e for e in _eqns(jaxpr) if e.primitive.name == "dot_general"
                and tuple(e.outvars[0].aval.shape) in kernels]

    merged = kernel_shaped_dots(
        lambda lo: nnx.merge(graphdef, lora_lib.merge(state, lo, SCALE))(*inputs))
    factored = kernel_shaped_dots(
        lambda lo: lora_lib.adapted_model(graphdef, state, lo, SCALE)(*inputs))
    assert len(merged) > len(lora)          # the merges, and the weight gradients
    assert factored == []


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def test_adapters_of_another_model_are_refused():
    _, graphdef, state = micro_model()
    lora = {"['nowhere']['qkv']['kernel']": {"a": jnp.zeros((4, 2)), "b": jnp.zeros((2, 4))}}
    with pytest.raises(ValueError, match=r"\['nowhere'\]\['qkv'\]\['kernel'\] names no adapted"):
        lora_lib.adapted_model(graphdef, state, lora, SCALE)
