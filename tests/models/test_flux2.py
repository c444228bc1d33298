"""The FLUX.2 transformer against diffusers' ``Flux2Transformer2DModel`` on tiny random models
(``tests/fixtures/diffusers/transformer/flux2_dev`` with the guidance embedding and
``flux2_klein`` without it; 2 dual- + 2 single-stream blocks, made by
``make_flux2_fixture.py``, with diffusers' outputs on a square latent and an odd, non-square
patch grid as its pipelines feed it): ``models.convert.flux2`` loads the folder and the
velocity equals diffusers' to 1e-5 in float32. Also: [dev]'s guidance is used and required,
sequence-parallel attention equals dense, scanned blocks load stacked onto their shardings,
remat keeps the gradient, bad checkpoints and inputs are one-line errors, and where diffusers is
importable a regenerated model is compared live."""
import dataclasses
import functools
import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.models.convert import CheckpointError
from spotlight_jax.models.convert import flux2 as convert_flux2
from spotlight_jax.models.convert.diffusers_folder import read_component
from spotlight_jax.models.flux2_transformer import Flux2Config, Flux2Transformer
from spotlight_jax.models.mmdit import AttentionSpec
from spotlight_jax.parallel import MeshConfig, make_mesh

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"
TRANSFORMER = FIXTURES / "transformer"
NAMES, SIZES = ("flux2_dev", "flux2_klein"), ("square", "odd")
ATOL = 1e-5                     # float32, matmuls at 'highest' precision


@pytest.fixture(autouse=True)
def highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


def load(folder, **overrides):
    config, tensors = read_component(folder)
    return convert_flux2.flux2_model(config, tensors, source=str(folder), **overrides)


@functools.cache
def converted(name):
    model, cfg = load(TRANSFORMER / name)
    return nnx.split(model), cfg


@jax.jit
def _forward(graphdef, state, x, t, text, mask, guidance):
    return nnx.merge(graphdef, state)(x, t, text, mask, guidance=guidance)


def forward(name, inp, split=None, mask=None):
    (graphdef, state), _ = split or converted(name)
    return np.asarray(_forward(graphdef, state, inp["x"], inp["t"], inp["text"], mask,
                               inp.get("guidance")))


def fixture_inputs(name, size):
    ref = np.load(TRANSFORMER / f"{name}.npz")
    return {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith(f"{size}/")}


def reference(inp):
    """diffusers' velocity computed with a correctly rounded float32 ``exp``: torch's CPU exp
    is one ulp off on a few of the timestep embedding's frequencies, which ``1000 t`` and
    [dev]'s ``1000 g`` magnify to ~2e-5 in the velocity (the test below bounds diffusers'
    velocity as torch computes it)."""
    return inp["v_rounded_exp"]


@pytest.mark.parametrize("name, size", [(n, s) for n in NAMES for s in SIZES])
def test_the_velocity_equals_diffusers(name, size):
    inp = fixture_inputs(name, size)
    got = forward(name, inp)
    assert got.shape == inp["x"].shape and float(np.abs(inp["v"]).max()) > 1.0
    np.testing.assert_allclose(got, reference(inp), rtol=0, atol=ATOL)
    # torch's own exp rounding alone moves diffusers' velocity by < 2e-5; ours sits within it
    gap = float(np.abs(inp["v"] - inp["v_rounded_exp"]).max())
    assert gap < 2e-5
    np.testing.assert_allclose(got, inp["v"], rtol=0, atol=gap + ATOL)


def test_the_config_is_read_from_config_json():
    _, dev = converted("flux2_dev")
    _, klein = converted("flux2_klein")
    assert isinstance(dev, Flux2Config) and dev.guidance_embeds and not klein.guidance_embeds
    assert (dev.num_layers, dev.num_single_layers, dev.num_heads, dev.head_dim) == (2, 2, 2, 16)
    assert (dev.axes_dims_rope, dev.rope_theta, dev.channels, dev.patch_size) == \
        ((2, 6, 4, 4), 2000.0, 4, 2)
    assert (dev.joint_attention_dim, klein.joint_attention_dim, dev.mlp_hidden) == (24, 20, 96)
    assert dev.passes(4.0) == 1 and klein.passes(4.0) == 2 and klein.passes(1.0) == 1


def test_dev_guidance_is_used_and_required_and_klein_ignores_it():
    inp = fixture_inputs("flux2_dev", "odd")
    flipped = forward("flux2_dev", {**inp, "guidance": inp["guidance"][::-1].copy()})
    assert np.abs(flipped - reference(inp)).max() > 1e-3          # the guidance input is used
    (graphdef, state), _ = converted("flux2_dev")
    with pytest.raises(ValueError, match=r"^guidance=None: this model \(guidance_embeds=True, "
                                         r"FLUX.2 \[dev\]\) needs the distilled guidance"):
        nnx.merge(graphdef, state)(inp["x"], inp["t"], inp["text"])
    klein = fixture_inputs("flux2_klein", "square")
    np.testing.assert_allclose(forward("flux2_klein", {**klein, "guidance": inp["guidance"]}),
                               reference(klein), rtol=0, atol=ATOL)


@pytest.mark.parametrize("strategy", ["ulysses", "ring"])
def test_sequence_parallel_attention_equals_dense(strategy):
    """The joint sequence (6 text + 35 image tokens: odd, so padded) split over 2 devices."""
    inp = fixture_inputs("flux2_dev", "odd")
    (graphdef, state), _ = converted("flux2_dev")
    mesh = make_mesh(jax.devices()[:2], MeshConfig(data=1, fsdp=1, sp=2))

    @jax.jit
    def run(state, x, t, text, guidance):
        return nnx.merge(graphdef, state)(x, t, text, guidance=guidance,
                                          attn=AttentionSpec(mesh=mesh, strategy=strategy))

    got = run(state, inp["x"], inp["t"], inp["text"], inp["guidance"])
    np.testing.assert_allclose(np.asarray(got), reference(inp), rtol=0, atol=ATOL)


def test_scanned_blocks_load_stacked_onto_their_shardings_and_equal_diffusers():
    """``scan_blocks=True`` (and ``remat``): each block parameter stacked on a leading axis,
    its input rows split over 2 devices, filled one block's tensor at a time, equal to the
    looped model's blocks; the scanned velocity equals diffusers'."""
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2])
    seen = []

    def shardings(path, shape):
        seen.append(path)
        split = path[0] in ("blocks", "single_blocks") and len(shape) == 3 and shape[1] % 2 == 0
        return NamedSharding(mesh, PartitionSpec(None, "fsdp") if split else PartitionSpec())

    model, cfg = load(TRANSFORMER / "flux2_klein", shardings=shardings, scan_blocks=True,
                      remat=True)
    assert cfg.scan_blocks and cfg.remat
    assert ("single_blocks", "fc1", "kernel") in seen and ("img_in", "kernel") in seen
    (_, looped_state), _ = converted("flux2_klein")
    looped = nnx.to_pure_dict(looped_state)
    stacked = model.single_blocks.qkv.kernel[...]
    assert stacked.shape == (2, 32, 96) and stacked.sharding.spec == PartitionSpec(None, "fsdp")
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(stacked)[i],
                                      looped["single_blocks"][i]["qkv"]["kernel"])
        np.testing.assert_array_equal(np.asarray(model.blocks.txt.fc1.kernel[...])[i],
                                      looped["blocks"][i]["txt"]["fc1"]["kernel"])
    inp = fixture_inputs("flux2_klein", "odd")
    got = forward("flux2_klein", inp, split=(nnx.split(model), cfg))
    np.testing.assert_allclose(got, reference(inp), rtol=0, atol=ATOL)


@pytest.mark.e2e          # two gradient programs (~10 s)
def test_remat_gives_the_same_gradient():
    inp = fixture_inputs("flux2_klein", "square")
    grads = []
    for remat in (False, True):
        model, _ = load(TRANSFORMER / "flux2_klein", remat=remat, remat_policy="dots_no_batch")
        graphdef, state = nnx.split(model)
        loss = jax.jit(jax.grad(lambda s, g=graphdef: jnp.sum(nnx.merge(g, s)(
            inp["x"], inp["t"], inp["text"]) ** 2)))
        grads.append(jax.tree.leaves(nnx.to_pure_dict(loss(state))))
    assert max(float(np.abs(a).max()) for a in grads[0]) > 1e-2
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_bad_checkpoints_and_inputs_say_what_is_wrong(tmp_path):
    config, tensors = read_component(TRANSFORMER / "flux2_dev")
    with pytest.raises(CheckpointError, match=r"_class_name='FluxTransformer2DModel': not a "
                                              r"FLUX.2 transformer \(Flux2Transformer2DModel\)"):
        convert_flux2.flux2_config({**config, "_class_name": "FluxTransformer2DModel"})
    for key, value, msg in (("patch_size", 2, r"patch_size=2: FLUX.2's transformer takes packed"),
                            ("out_channels", 8, r"out_channels=8: must equal in_channels=16"),
                            ("in_channels", 18, r"in_channels=18: must be a multiple of 4"),
                            ("pooled_projection_dim", 768,
                             r"config.json key 'pooled_projection_dim'=768 is not a FLUX.2 "
                             r"option we convert")):
        with pytest.raises(CheckpointError, match=msg):
            convert_flux2.flux2_config({**config, key: value})
    with pytest.raises(ValueError, match=r"^axes_dims_rope=\(4, 4, 4, 6\): must be 4 even sizes "
                                         r"\(t, h, w, l\) summing to attention_head_dim=16"):
        convert_flux2.flux2_config({**config, "axes_dims_rope": [4, 4, 4, 6]})
    # a missing tensor, a foreign one and a mis-shaped one: each named, on one line
    name = "single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight"
    missing = {k: v for k, v in tensors.items() if k != name}
    with pytest.raises(CheckpointError, match=rf"missing tensor '{name}' \(for our "
                                              r"single_blocks/1/qkv/kernel\)$"):
        convert_flux2.flux2_model(config, missing)
    # a [klein] config over [dev]'s weights: the guidance embedder is unexpected
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'time_guidance_embed."
                                              r"guidance_embedder.linear_1.weight'"):
        convert_flux2.flux2_model({**config, "guidance_embeds": False}, tensors)
    with pytest.raises(CheckpointError, match=r"tensor 'transformer_blocks.0.ff.linear_in."
                                              r"weight' has shape \(192, 32\), expected "
                                              r"\(128, 32\)"):
        convert_flux2.flux2_model({**config, "mlp_ratio": 2.0}, tensors)
    bad = tmp_path / "flux2"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, "num_layers": 3}))
    (bad / "diffusion_pytorch_model.safetensors").symlink_to(
        TRANSFORMER / "flux2_dev" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(CheckpointError, match=rf"^{bad}: missing tensor "
                                              r"'transformer_blocks.2.attn.to_q.weight'"):
        load(bad)
    (graphdef, state), cfg = converted("flux2_dev")
    model = nnx.merge(graphdef, state)
    text, t, g = jnp.zeros((1, 3, 24)), jnp.zeros((1,)), jnp.ones((1,))
    with pytest.raises(ValueError, match=r"^a latent of 5 x 6 cells does not pack into 2x2"):
        model(jnp.zeros((1, 5, 6, 4)), t, text, guidance=g)
    with pytest.raises(ValueError, match=r"^FLUX.2 takes unpacked latents \[batch, height, "
                                         r"width, 4\]; got shape \(1, 4, 4, 16\)"):
        model(jnp.zeros((1, 4, 4, 16)), t, text, guidance=g)
    with pytest.raises(ValueError, match=r"^image_size=9: must be a positive even number"):
        dataclasses.replace(cfg, image_size=9).validate()
    assert isinstance(model, Flux2Transformer)


def test_text_mask_is_unused_as_in_diffusers_unless_asked():
    """The pipelines attend to every text token: a mask changes nothing by default; with
    ``use_text_mask=True`` it masks keys."""
    inp = fixture_inputs("flux2_klein", "square")
    mask = np.ones(inp["text"].shape[:2], bool)
    mask[1, 3:] = False
    np.testing.assert_array_equal(forward("flux2_klein", inp, mask=mask),
                                  forward("flux2_klein", inp))
    masked, cfg = load(TRANSFORMER / "flux2_klein", use_text_mask=True)
    got = forward("flux2_klein", inp, split=(nnx.split(masked), cfg), mask=mask)
    np.testing.assert_allclose(got[0], reference(inp)[0], rtol=0, atol=ATOL)
    assert np.abs(got[1] - reference(inp)[1]).max() > 1e-3


def test_live_regenerated_model_equals_diffusers(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    spec = importlib.util.spec_from_file_location("make_flux2_fixture",
                                                  FIXTURES / "make_flux2_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    model = gen.build("flux2_dev", seed=5)
    model.save_pretrained(tmp_path / "flux2_dev", safe_serialization=True)   # float32 this time
    inp = gen.inputs("flux2_dev", "odd", seed=11)
    want = gen.reference_rounded_exp(model, "flux2_dev", inp)
    ours, cfg = load(tmp_path / "flux2_dev")
    np.testing.assert_allclose(forward("flux2_dev", inp, split=(nnx.split(ours), cfg)), want,
                               rtol=0, atol=ATOL)
