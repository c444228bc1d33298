"""Z-Image against diffusers' ``ZImageTransformer2DModel`` on a tiny random model
(``tests/fixtures/diffusers/transformer/z_image``: 2 main layers, 1 noise and 1 context
refiner, 2 heads of 16, made by ``make_z_image_fixture.py``) with diffusers' outputs on square
16 x 16 latents with full captions and on 10 x 14 latents (a 5 x 7 patch grid padded with the
image pad token) with captions of 37 and 6 real tokens, each batch at two noise levels:
``models.convert.z_image`` loads the folder and the velocity (our sign and clock) equals
diffusers' to 1e-5 in float32. Also: the mask's semantics, sequence-parallel attention equal to
dense, scanned blocks equal to the loop, bf16 weights kept bit for bit, and one-line errors."""
import dataclasses
import functools
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.models import AttentionSpec
from spotlight_jax.models.convert import CheckpointError
from spotlight_jax.models.convert import z_image as convert_z_image
from spotlight_jax.models.convert.diffusers_folder import read_component
from spotlight_jax.models.z_image_transformer import ZImageConfig, ZImageTransformer

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"
FOLDER = FIXTURES / "transformer" / "z_image"
CASES = ("square", "odd")
ATOL = 1e-5                     # float32, matmuls at 'highest' precision


@pytest.fixture(autouse=True)
def highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


@functools.cache
def component():
    return read_component(FOLDER)


@functools.cache
def converted(**overrides):
    model, cfg = convert_z_image.z_image_model(*component(), **overrides)
    return nnx.split(model), cfg


@jax.jit
def _forward(graphdef, state, x, t, text, mask):
    return nnx.merge(graphdef, state)(x, t, text, mask)


def forward(inp, mask="given", split=None):
    """Our velocity for ``inp`` (``mask``: 'given', 'none', 'all' or an array)."""
    (graphdef, state), _ = split or converted()
    m = mask
    if isinstance(mask, str):
        m = {"given": inp.get("mask"), "none": None,
             "all": np.ones(inp["text"].shape[:2], bool)}[mask]
    return np.asarray(_forward(graphdef, state, inp["x"], inp["t"], inp["text"], m))


@functools.cache
def fixture(case):
    ref = np.load(FOLDER.parent / "z_image.npz")
    return {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith(f"{case}/")}


@pytest.mark.parametrize("case", CASES)
def test_the_velocity_equals_diffusers(case):
    """Equal to diffusers with a correctly rounded ``exp`` to 1e-5; torch's own ``exp`` (one
    ulp off on 3 timestep frequencies, times 1000) moves diffusers' velocity by ~1e-5, and ours
    sits within 2e-5 of it."""
    inp = fixture(case)
    got = forward(inp)
    assert got.shape == inp["v"].shape and float(np.abs(inp["v"]).max()) > 0.5
    np.testing.assert_allclose(got, inp["v_rounded_exp"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(got, inp["v"], rtol=0, atol=2 * ATOL)
    _, cfg = converted()
    assert isinstance(cfg, ZImageConfig) and (cfg.n_layers, cfg.n_refiner_layers,
                                              cfg.head_dim, cfg.axes_dims) == (2, 1, 16, (4, 6, 6))


def test_mask_none_equals_an_all_true_mask_and_the_noise_level_matters():
    inp = fixture("square")
    none = forward(inp, "none")
    np.testing.assert_allclose(forward(inp, "all"), none, rtol=0, atol=1e-6)
    flipped = forward({**inp, "t": inp["t"][::-1].copy()}, "none")
    assert np.abs(flipped - none).max() > 0.1


def test_a_padded_caption_reads_only_its_real_tokens():
    """Row 1 of the odd case has 6 real tokens of 40: what its padding holds does not matter,
    dropping the mask (reading the padding as tokens) does, and a mask that is not a prefix
    reads its real tokens in order (as diffusers' ``embeds[mask]``)."""
    inp = fixture("odd")
    want = forward(inp)
    text, mask = inp["text"].copy(), inp["mask"]
    text[~mask] = 100.0 * np.random.default_rng(0).normal(size=text[~mask].shape)
    np.testing.assert_allclose(forward({**inp, "text": text}), want, rtol=0, atol=1e-6)
    assert np.abs(forward(inp, "all")[1] - want[1]).max() > 0.1
    # the same real tokens scattered through the row, in order
    where = np.sort(np.random.default_rng(1).choice(40, size=6, replace=False))
    scattered, smask = inp["text"].copy(), mask.copy()
    scattered[1] = 0.0
    scattered[1, where] = inp["text"][1, :6]
    smask[1] = False
    smask[1, where] = True
    np.testing.assert_allclose(forward({**inp, "text": scattered}, smask), want, rtol=0,
                               atol=1e-6)


def test_the_encoded_context_equals_encoding_in_the_call():
    inp = fixture("odd")
    (graphdef, state), _ = converted()

    @jax.jit
    def with_context(state, x, t, text, mask):
        model = nnx.merge(graphdef, state)
        return model(x, t, text, mask, context=model.encode(text, mask))

    got = with_context(state, inp["x"], inp["t"], inp["text"], inp["mask"])
    np.testing.assert_allclose(np.asarray(got), forward(inp), rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy", ["ulysses", "ring"])
def test_sequence_parallel_equals_dense(strategy):
    """The image refiner's and the main blocks' tokens split over 2 devices (the joint sequence
    of 64 caption + 64 image tokens, with per-row caption lengths masked): diffusers'
    velocity, as on one device."""
    from spotlight_jax.parallel import MeshConfig, make_mesh
    inp = fixture("odd")
    (graphdef, state), _ = converted()
    mesh = make_mesh(jax.devices()[:2], MeshConfig(data=1, fsdp=1, sp=2))
    spec = AttentionSpec(mesh=mesh, strategy=strategy, axis="sp")
    run = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a, attn=spec))
    got = run(state, inp["x"], inp["t"], inp["text"], inp["mask"])
    np.testing.assert_allclose(np.asarray(got), inp["v_rounded_exp"], rtol=0, atol=ATOL)


class _TextLast(AttentionSpec):
    """A spec that orders joint sequences ``[image; caption]`` (as a key-length kernel such
    as cuDNN's does, and as diffusers does) on any backend."""

    @property
    def text_last(self) -> bool:
        return True


def test_the_joint_order_does_not_change_the_velocity():
    """Caption first (XLA's order) or last (cuDNN's, diffusers' own): the same velocity, since
    positions are RoPE ids; with the caption last a row's valid keys come first."""
    inp = fixture("odd")
    (graphdef, state), _ = converted()
    run = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a, attn=_TextLast()))
    got = np.asarray(run(state, inp["x"], inp["t"], inp["text"], inp["mask"]))
    np.testing.assert_allclose(got, inp["v_rounded_exp"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(got, forward(inp), rtol=0, atol=ATOL)     # summation order


def test_scanned_blocks_load_stacked_and_equal_the_loop():
    (looped_def, looped), _ = converted()
    split, cfg = converted(scan_blocks=True)
    assert cfg.scan_blocks
    stacked = nnx.merge(*split)
    kernel = np.asarray(stacked.layers.to_q.kernel[...])
    ref_model = nnx.merge(looped_def, looped)
    assert kernel.shape == (2, 32, 32)
    for i in range(2):
        np.testing.assert_array_equal(kernel[i], np.asarray(ref_model.layers[i].to_q.kernel[...]))
    assert stacked.noise_refiner.mod.kernel[...].shape == (1, 32, 128)
    inp = fixture("odd")
    np.testing.assert_allclose(forward(inp, split=(split, cfg)), forward(inp), rtol=0,
                               atol=1e-6)


def test_bf16_weights_keep_the_stored_bits():
    config, tensors = component()
    model, cfg = convert_z_image.z_image_model(config, tensors, "bfloat16")
    assert cfg.dtype == cfg.param_dtype == "bfloat16"
    stored = np.asarray(tensors["layers.1.feed_forward.w2.weight"])
    assert stored.dtype == jnp.bfloat16
    got = np.asarray(model.layers[1].w2.kernel[...])
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), stored.T.view(np.uint16))
    np.testing.assert_array_equal(np.asarray(model.x_pad_token[...]).view(np.uint16),
                                  np.asarray(tensors["x_pad_token"]).view(np.uint16))


def test_bad_checkpoints_and_shapes_say_what_is_wrong():
    config, tensors = component()
    with pytest.raises(CheckpointError, match=r"^_class_name='FluxTransformer2DModel': not a "
                                              r"Z-Image transformer"):
        convert_z_image.z_image_config({**config, "_class_name": "FluxTransformer2DModel"})
    with pytest.raises(CheckpointError, match=r"^siglip_feat_dim=1152: the omni Z-Image"):
        convert_z_image.z_image_config({**config, "siglip_feat_dim": 1152})
    with pytest.raises(CheckpointError, match=r"^all_patch_size=\[2, 4\]: a checkpoint of "
                                              r"several patch sizes"):
        convert_z_image.z_image_config({**config, "all_patch_size": [2, 4],
                                        "all_f_patch_size": [1, 1]})
    missing = {k: v for k, v in tensors.items() if k != "layers.1.attention.to_k.weight"}
    with pytest.raises(CheckpointError, match=r"missing tensor 'layers.1.attention.to_k.weight' "
                                              r"\(for our layers/1/to_k/kernel\)"):
        convert_z_image.z_image_model(config, missing)
    extra = {**tensors, "siglip_pad_token": tensors["x_pad_token"]}
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'siglip_pad_token'"):
        convert_z_image.z_image_model(config, extra)
    with pytest.raises(CheckpointError, match=r"tensor 'cap_embedder.0.weight' has shape "
                                              r"\(16,\), expected \(24,\)"):
        convert_z_image.z_image_model({**config, "cap_feat_dim": 24}, tensors)
    fields = {f.name for f in dataclasses.fields(ZImageConfig)}
    values = {k: v for k, v in config.items() if k in fields}
    with pytest.raises(ValueError, match=r"^axes_dims=\(4, 6, 4\): give 3 even RoPE widths"):
        ZImageConfig(**{**values, "axes_dims": [4, 6, 4]}).validate()
    model = nnx.merge(*converted()[0])
    with pytest.raises(ValueError, match=r"^a latent of 10 x 15 x 4 does not divide into 2 x 2"):
        model(jnp.zeros((1, 10, 15, 4)), jnp.zeros((1,)), jnp.zeros((1, 3, 16)))
    assert isinstance(model, ZImageTransformer)


def _close(a, b, rel=1e-6) -> bool:
    """Equal to ``rel`` of the larger gradient's scale (the summation order differs)."""
    return float(np.abs(a - b).max()) <= rel * max(1.0, float(np.abs(b).max()))


@pytest.mark.e2e          # two gradient programs (~15 s)
def test_remat_and_scan_give_the_same_gradient():
    """``remat=True`` with ``scan_blocks=True``: the same gradient, each group's blocks
    stacked along the leading axis."""
    inp = fixture("odd")
    grads = []
    for overrides in ({}, {"remat": True, "scan_blocks": True}):
        (graphdef, state), _ = converted(**overrides)
        loss = jax.jit(jax.grad(lambda s, g=graphdef: jnp.sum(nnx.merge(g, s)(
            inp["x"], inp["t"], inp["text"], inp["mask"]) ** 2)))
        grads.append(nnx.to_pure_dict(loss(state)))
    looped, scanned = grads
    for group, n in (("noise_refiner", 1), ("context_refiner", 1), ("layers", 2)):
        stacked = scanned.pop(group)
        for i in range(n):
            assert all(_close(a[i], b) for a, b in zip(
                jax.tree.leaves(stacked), jax.tree.leaves(looped[group][i])))
    rest = {k: v for k, v in looped.items() if k not in ("noise_refiner", "context_refiner",
                                                          "layers")}
    assert all(_close(a, b) for a, b in zip(jax.tree.leaves(rest), jax.tree.leaves(scanned)))


def test_live_regenerated_model_equals_diffusers(tmp_path):
    """Where diffusers is importable: another random model (float32 weights this time) and
    other inputs, regenerated and compared."""
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    spec = importlib.util.spec_from_file_location(
        "make_z_image_fixture", FIXTURES / "make_z_image_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    model = gen.build(seed=5)
    model.save_pretrained(tmp_path / "z_image", safe_serialization=True)
    inp = gen.inputs("odd", seed=11)
    want = gen.reference_rounded_exp(model, inp)
    ours, cfg = convert_z_image.z_image_model(*read_component(tmp_path / "z_image"))
    np.testing.assert_allclose(forward(inp, split=(nnx.split(ours), cfg)), want, rtol=0,
                               atol=ATOL)
