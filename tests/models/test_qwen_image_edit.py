"""Qwen-Image-Edit: the image-conditioned MMDiT equals diffusers' transformer called as its edit
pipelines call it (the input images' latents as extra tokens after the target's, ``img_shapes``
listing every grid, the output cut to the target's tokens), on tiny random models
(tests/fixtures/diffusers/transformer/qwen_image_edit*, made by make_transformer_fixtures.py):
one reference of another size than the target and two references, odd patch grids, a padded
prompt; -2511's ``zero_cond_t`` (reference tokens modulated as at t = 0) too. Sequence-parallel
attention over the grown joint sequence equals dense; bad input is one line."""
import dataclasses
import functools
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.models import AttentionSpec
from spotlight_jax.models.convert import from_diffusers
from spotlight_jax.models.convert.transformer import config_from_diffusers
from spotlight_jax.parallel import MeshConfig, make_mesh

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"
TRANSFORMER = FIXTURES / "transformer"
NAMES = ("qwen_image_edit", "qwen_image_edit_2511")
CASES = ("one_ref", "two_refs")
ATOL = 1e-5                     # float32, matmuls at 'highest' precision


@pytest.fixture(autouse=True)
def highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


@functools.cache
def converted(name, **overrides):
    model, cfg = from_diffusers(TRANSFORMER / name / "transformer", **overrides)
    return nnx.split(model), cfg


def case_inputs(name, case):
    ref = np.load(TRANSFORMER / f"{name}.npz")
    inp = {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith(f"{case}/")}
    inp["refs"] = [inp[k] for k in sorted(k for k in inp if k.startswith("ref"))]
    return inp


@functools.partial(jax.jit, static_argnames="attn")
def _forward(graphdef, state, x, t, text, mask, refs, attn=AttentionSpec()):
    return nnx.merge(graphdef, state)(x, t, text, mask, attn=attn, image_latents=refs)


def forward(name, inp, refs=None, attn=AttentionSpec(), **overrides):
    (graphdef, state), _ = converted(name, **overrides)
    refs = inp["refs"] if refs is None else refs
    return np.asarray(_forward(graphdef, state, inp["x"], inp["t"], inp["text"], inp["mask"],
                               refs, attn=attn))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", CASES)
def test_the_edit_velocity_equals_diffusers(name, case):
    inp = case_inputs(name, case)
    # Qwen-Image-Edit's pipeline passes one image; its transformer takes more, as Edit Plus's
    more = {"reference_images": 2} if name == "qwen_image_edit" and case == "two_refs" else {}
    got = forward(name, inp, **more)
    assert got.shape == inp["x"].shape and float(np.abs(inp["v"]).max()) > 0.1
    np.testing.assert_allclose(got, inp["v"], rtol=0, atol=ATOL)


def test_the_pipeline_beside_the_folder_and_zero_cond_t_set_the_options():
    edit, plus = (config_from_diffusers(TRANSFORMER / n / "transformer") for n in NAMES)
    assert (edit.reference_images, edit.reference_zero_t) == (1, False)
    assert (plus.reference_images, plus.reference_zero_t) == (3, True)
    base = config_from_diffusers(TRANSFORMER / "qwen_image")    # no model_index.json beside
    assert (base.reference_images, base.reference_zero_t) == (0, False)


def test_the_reference_image_and_its_zero_t_modulation_matter():
    inp = case_inputs("qwen_image_edit_2511", "two_refs")
    ours = forward("qwen_image_edit_2511", inp)
    other = forward("qwen_image_edit_2511", inp, refs=[inp["refs"][0][::-1].copy(),
                                                       inp["refs"][1]])
    assert np.abs(other - ours).max() > 1e-3
    one = forward("qwen_image_edit_2511", inp, refs=inp["refs"][:1])
    assert np.abs(one - ours).max() > 1e-3            # the second reference is attended to
    plain = forward("qwen_image_edit_2511", inp, reference_zero_t=False)
    assert np.abs(plain - ours).max() > 1e-3          # so the 2511 check above proves it


@pytest.mark.parametrize("strategy, sp", [("ulysses", 2), ("ring", 2), ("usp", 4)])
def test_sequence_parallel_over_target_and_references_equals_dense(strategy, sp):
    """35 target + 24 + 15 reference tokens + 6 text: 80 tokens, padded per strategy."""
    inp = case_inputs("qwen_image_edit_2511", "two_refs")
    mesh = make_mesh(jax.devices()[:sp], MeshConfig(data=1, fsdp=1, sp=sp))
    got = forward("qwen_image_edit_2511", inp, attn=AttentionSpec(mesh=mesh, strategy=strategy))
    np.testing.assert_allclose(got, inp["v"], rtol=0, atol=ATOL)


def test_scan_over_blocks_with_references_equals_the_loop():
    inp = case_inputs("qwen_image_edit_2511", "one_ref")
    np.testing.assert_allclose(forward("qwen_image_edit_2511", inp, scan_blocks=True),
                               forward("qwen_image_edit_2511", inp), rtol=0, atol=1e-6)


def test_bad_reference_images_say_what_is_wrong():
    inp = case_inputs("qwen_image_edit", "one_ref")
    (graphdef, state), cfg = converted("qwen_image_edit")
    model = nnx.merge(graphdef, state)

    def call(refs, m=model):
        return m(inp["x"], inp["t"], inp["text"], inp["mask"], image_latents=refs)

    with pytest.raises(ValueError, match=r"^image_latents=None: this model edits an input image "
                                         r"\(reference_images=1\)"):
        call(None)
    with pytest.raises(ValueError, match=r"^2 reference images: this model takes 1 to 1"):
        call([inp["ref0"], inp["ref0"]])
    with pytest.raises(ValueError, match=r"^image_latents\[0\] has shape \(2, 12, 8, 3\); "
                                         r"expected \[batch=2, height, width, channels=4\]"):
        call(inp["ref0"][..., :3])
    with pytest.raises(ValueError, match=r"^image_latents\[0\] is 11x8 latent cells, not a "
                                         r"multiple of patch_size=2"):
        call(inp["ref0"][:, :11])
    (g2, s2), _ = converted("qwen_image_edit", reference_images=0)
    with pytest.raises(ValueError, match=r"^image_latents given to a text-to-image model"):
        call(inp["ref0"], nnx.merge(g2, s2))
    with pytest.raises(ValueError, match=r"^reference_zero_t=True: modulates reference tokens"):
        dataclasses.replace(cfg, reference_images=0, reference_zero_t=True).validate()
    with pytest.raises(ValueError, match=r"^reference_images=1: reference images need pos_embed "
                                         r"'rope3d'"):
        dataclasses.replace(cfg, pos_embed="rope3d_flux").validate()


def test_sincos_models_tell_references_apart_by_a_learned_slot_embedding():
    """Our own (non-RoPE) model: a reference shares the target's sin-cos grid, so a learned
    per-slot embedding marks it; swapping two references changes the velocity."""
    from spotlight_jax.models import MMDiT, MMDiTConfig

    cfg = MMDiTConfig(image_size=8, channels=3, patch_size=2, width=32, depth=1, num_heads=2,
                      text_len=4, text_width=16, text_layers=1, text_heads=2,
                      reference_images=2)
    model = MMDiT(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    x, a, b = (rng.normal(size=(1, 8, 8, 3)).astype(np.float32) for _ in range(3))
    tokens, t = np.array([[1, 2, 3, 0]]), np.array([0.5], np.float32)
    # the zero-initialised output layers would hide every input: give them weights
    model.final.kernel[...] = rng.normal(size=model.final.kernel.shape) * 0.1
    model.final_mod.kernel[...] = rng.normal(size=model.final_mod.kernel.shape) * 0.1
    for block in model.blocks:
        block.img.mod.kernel[...] = rng.normal(size=block.img.mod.kernel.shape) * 0.1
    run = nnx.jit(lambda m, refs: m(x, t, tokens, image_latents=refs))
    ab, ba = np.asarray(run(model, [a, b])), np.asarray(run(model, [b, a]))
    assert ab.shape == x.shape and np.abs(ab - ba).max() > 1e-4


def test_live_regenerated_edit_model_equals_diffusers(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    spec = importlib.util.spec_from_file_location(
        "make_transformer_fixtures", FIXTURES / "make_transformer_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    model = gen.build("qwen_image_edit_2511", seed=5)
    (tmp_path / "model_index.json").write_text('{"_class_name": "QwenImageEditPlusPipeline"}')
    model.save_pretrained(tmp_path / "transformer", safe_serialization=True)   # float32
    inp = gen.edit_inputs("two_refs", seed=13)
    want = gen.edit_reference(model, inp)
    ours, _ = from_diffusers(tmp_path / "transformer")
    refs = [inp[k] for k in sorted(k for k in inp if k.startswith("ref"))]
    got = _forward(*nnx.split(ours), inp["x"], inp["t"], inp["text"], inp["mask"], refs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=ATOL)
