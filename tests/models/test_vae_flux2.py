"""FLUX.2's VAE (``AutoencoderKLFlux2``) against diffusers and ``Flux2Pipeline``, on a tiny random
model (tests/fixtures/diffusers/vae/flux2: 3 blocks, a decoder narrower than the encoder, quant
convs, 4 latent channels with non-trivial batch-norm statistics; made by make_vae_fixtures.py,
no torch needed here). ``decode(latents) -> images`` equals the pipeline's end (the transformer's
latents packed 2 x 2, batch-norm denormalised, unpacked, decoded, postprocessed) and ``encode``
its ``_encode_vae_image`` (mode, packed, normalised), unpacked, at 1e-5 in float32, on an odd,
non-square token grid (3 x 5 <-> 24 x 40 pixels). Also: the normalisation is the pipeline's
packed one, one-line errors for a broken folder or a bad shape, a FLUX.2 base folder's decoder
(``builders.decoder_of``), and a live regeneration where torch + diffusers are installed."""
import importlib.util
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from spotlight_jax.config import ConfigError
from spotlight_jax.config.builders import decoder_of
from spotlight_jax.io import safetensors_format
from spotlight_jax.models.convert import config_from_diffusers, vae_from_diffusers
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.vae.flux2_vae import pack_latents, unpack_latents
from spotlight_jax.parallel import make_mesh
from spotlight_jax.parallel.sharding import shard_state

DIFFUSERS = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"
FIXTURES = DIFFUSERS / "vae"
FOLDER = FIXTURES / "flux2"
ATOL = 1e-5


@pytest.fixture(autouse=True)
def highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="module")
def ref():
    return {k: np.array(v) for k, v in
            safetensors_format.load(FIXTURES / "flux2.reference.safetensors").items()}


@pytest.fixture(scope="module")
def vae():
    return vae_from_diffusers(FOLDER)


def _raw(vae, fn, x):
    """The raw module's ``fn`` ('decode' or 'encode': diffusers' spaces), jitted over the state."""
    return np.asarray(jax.jit(lambda st, a: getattr(nnx.merge(vae.graphdef, st), fn)(a))(
        vae.state, x))


def test_decode_equals_the_pipelines(vae, ref):
    b, h, w, c = ref["latents"].shape
    assert (h // 2, w // 2) == (3, 5) and vae.downsample_factor == 4 and c == 4
    images = np.asarray(vae.decode(ref["latents"]))
    assert images.shape == (b, 24, 40, 3) and images.dtype == np.float32
    # before the clip to [0, 1], so saturated pixels cannot hide an error
    raw = _raw(vae, "decode", vae.denormalise(jnp.asarray(ref["latents"])))
    np.testing.assert_allclose(raw, ref["decoded_raw"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(images, ref["images_decoded"], atol=ATOL, rtol=0)


def test_encode_equals_the_pipelines(vae, ref):
    latents = np.asarray(vae.encode(ref["images"]))
    assert latents.shape == ref["latents_encoded"].shape == (2, 6, 10, 4)
    np.testing.assert_allclose(latents, ref["latents_encoded"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(_raw(vae, "encode", ref["images"] * 2 - 1), ref["encoded_raw"],
                               atol=ATOL, rtol=0)


def test_the_normalisation_is_the_batch_norm_of_the_packed_latent(vae, ref):
    """Cell-wise on the unpacked latent equals per packed channel on the pipeline's packing; the
    statistics differ between positions in a cell, so a per-channel map could not match; and
    skipping the map misses the references by far more than the tolerance."""
    tensors = safetensors_format.load(FOLDER / "diffusion_pytorch_model.safetensors")
    eps = json.loads((FOLDER / "config.json").read_text())["batch_norm_eps"]
    mean = np.asarray(tensors["bn.running_mean"])
    std = np.sqrt(np.asarray(tensors["bn.running_var"]) + np.float32(eps))
    np.testing.assert_array_equal(pack_latents(ref["latents"]), ref["latents_packed"])
    np.testing.assert_array_equal(unpack_latents(ref["latents_packed"]), ref["latents"])
    packed = pack_latents(np.asarray(vae.denormalise(jnp.asarray(ref["latents"]))))
    np.testing.assert_allclose(packed, ref["latents_packed"] * std + mean, rtol=1e-6, atol=1e-6)
    assert vae.cell == 2 and vae.latent_scale.shape == (2, 2, 4)
    assert np.ptp(vae.latent_scale, axis=(0, 1)).min() > 0.05
    skipped = np.clip(_raw(vae, "decode", ref["latents"]) * 0.5 + 0.5, 0.0, 1.0)
    assert np.abs(skipped - ref["images_decoded"]).max() > 100 * ATOL
    assert np.abs(ref["encoded_raw"] - ref["latents_encoded"]).max() > 100 * ATOL


def test_the_decoder_is_narrower_than_the_encoder(vae):
    cfg = vae.config
    assert (cfg.block_out_channels, cfg.decoder_block_out_channels) == ((8, 16, 16), (4, 8, 16))
    assert cfg.use_quant_conv and cfg.use_post_quant_conv
    module = nnx.merge(vae.graphdef, vae.state)
    assert module.decoder.conv_out.kernel.shape == (3, 3, 4, 3)
    assert module.encoder.conv_in.kernel.shape == (3, 3, 3, 8)


def test_decode_is_pure_inside_a_callers_jit_on_a_data_parallel_batch(vae, ref):
    latents = np.concatenate([ref["latents"]] * 4)
    mesh = make_mesh()  # data=8
    x = jax.device_put(latents, NamedSharding(mesh, PartitionSpec("data")))
    gray = jax.jit(lambda st, z: vae.decode_with(st, z).mean(-1))(shard_state(vae.state, mesh), x)
    assert len(gray.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(gray), np.concatenate([ref["images_decoded"]] * 4)
                               .mean(-1), atol=ATOL, rtol=0)


def test_shapes_off_the_2x2_cells_are_one_line_errors(vae):
    with pytest.raises(ValueError, match=r"latents.shape=\(1, 5, 10, 4\): h and w must be "
                                         r"multiples of 2"):
        vae.decode(np.zeros((1, 5, 10, 4), np.float32))
    with pytest.raises(ValueError, match=r"images.shape=\(1, 24, 36, 3\): H and W must be "
                                         r"multiples of 8"):
        vae.encode(np.zeros((1, 24, 36, 3), np.float32))
    with pytest.raises(ValueError, match=r"expected \[B, h, w, 4\]"):
        vae.decode(np.zeros((1, 6, 10, 16), np.float32))   # packed by mistake


def _copy_with(tmp_path, edit_tensors=None, edit_config=None) -> pathlib.Path:
    """A copy of the fixture folder with its weights and config.json edited."""
    folder = tmp_path / "vae"
    shutil.copytree(FOLDER, folder)
    path = folder / "diffusion_pytorch_model.safetensors"
    if edit_tensors:
        tensors = {k: np.array(v) for k, v in safetensors_format.load(path).items()}
        safetensors_format.save(path, edit_tensors(tensors), {"format": "pt"})
    if edit_config:
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(edit_config(cfg)))
    return folder


def _one_line_error(folder) -> str:
    with pytest.raises(CheckpointError) as e:
        vae_from_diffusers(folder)
    assert "\n" not in str(e.value)
    return str(e.value)


def _drop(key):
    return lambda t: {k: v for k, v in t.items() if k != key}


@pytest.mark.parametrize("edit, expected", [
    (dict(edit_tensors=_drop("bn.running_var")), "missing tensor 'bn.running_var'"),
    (dict(edit_tensors=_drop("decoder.mid_block.attentions.0.to_out.0.weight")),
     "missing tensor 'decoder.mid_block.attentions.0.to_out.0.weight'"),
    (dict(edit_tensors=lambda t: {**t, "bn.running_mean": t["bn.running_mean"][:4]}),
     r"tensor 'bn.running_mean' has shape (4,), expected (16,)"),
    (dict(edit_tensors=lambda t: {**t, "decoder.conv_in.weight": t["decoder.conv_in.weight"][:8]}),
     "tensor 'decoder.conv_in.weight' has shape (8, 4, 3, 3)"),
    (dict(edit_tensors=lambda t: {**t, "bn.running_var": -t["bn.running_var"]}),
     "the variances positive"),
    (dict(edit_config=lambda c: {**c, "_class_name": "AutoencoderKL"}),
     "unexpected tensors, e.g. ['bn.num_batches_tracked', 'bn.running_mean'"),
    (dict(edit_config=lambda c: {**c, "_class_name": "AutoencoderKLFlux3"}),
     "_class_name='AutoencoderKLFlux3' in config.json is not a supported VAE"),
    (dict(edit_config=lambda c: {**c, "patch_size": [1, 1]}), "patch_size=[1, 1]"),
    (dict(edit_config=lambda c: {**c, "decoder_block_out_channels": [8, 16]}),
     "decoder_block_out_channels=[8, 16]: needs one width per block_out_channels entry (3)"),
])
def test_a_broken_folder_is_a_one_line_error_naming_it(tmp_path, edit, expected):
    assert expected in _one_line_error(_copy_with(tmp_path, **edit))


def test_the_update_counter_is_optional(tmp_path, vae):
    folder = _copy_with(tmp_path, edit_tensors=_drop("bn.num_batches_tracked"))
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(vae_from_diffusers(folder).state),
                 nnx.to_pure_dict(vae.state))


def _pipeline(tmp_path, transformer: str, vae: str) -> pathlib.Path:
    """A pipeline-shaped folder: a transformer fixture and a VAE fixture side by side."""
    base = tmp_path / f"{transformer}+{vae}"
    base.mkdir()
    (base / "transformer").symlink_to(DIFFUSERS / "transformer" / transformer)
    (base / "vae").symlink_to(FIXTURES / vae)
    return base


def test_a_flux2_base_folder_decodes_with_its_vae(tmp_path, ref):
    base = _pipeline(tmp_path, "flux2_klein", "flux2")
    cfg = config_from_diffusers(base / "transformer", image_size=6, image_width=10)
    vae = decoder_of(str(base), cfg)
    assert vae.family == "AutoencoderKLFlux2" and vae.latent_channels == cfg.channels == 4
    images = np.asarray(vae.decode(ref["latents"][:1]))
    assert cfg.latent_shape == ref["latents"].shape[1:] and images.shape == (1, 24, 40, 3)
    np.testing.assert_allclose(images, ref["images_decoded"][:1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("transformer, vae, says", [
    ("flux2_klein", "sd1_style", "its VAE is AutoencoderKL, the transformer is FLUX.2's"),
    ("z_image", "flux2", "its VAE is AutoencoderKLFlux2, the transformer is not FLUX.2's"),
])
def test_a_vae_of_another_family_is_a_config_error(tmp_path, transformer, vae, says):
    """Both have 4 latent channels, so only the family tells them apart."""
    base = _pipeline(tmp_path, transformer, vae)
    with pytest.raises(ConfigError, match=says):
        decoder_of(str(base), config_from_diffusers(base / "transformer"))


def test_live_regeneration_matches_diffusers(tmp_path):
    """Where torch + diffusers are installed: a fresh random VAE (another seed), the pipeline's
    outputs computed now, ours compared to them."""
    pytest.importorskip("torch", reason="torch is not installed: the stored references are used")
    pytest.importorskip("diffusers", reason="diffusers is not installed")
    spec = importlib.util.spec_from_file_location("make_vae_fixtures",
                                                  FIXTURES / "make_vae_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    torch_vae = gen.build("flux2", seed=7)
    torch_vae.save_pretrained(tmp_path / "flux2", safe_serialization=True)
    want = gen.references(torch_vae, "flux2", seed=7)
    vae = vae_from_diffusers(tmp_path / "flux2")
    np.testing.assert_allclose(np.asarray(vae.decode(want["latents"])), want["images_decoded"],
                               atol=ATOL, rtol=0)
    np.testing.assert_allclose(np.asarray(vae.encode(want["images"])), want["latents_encoded"],
                               atol=ATOL, rtol=0)
