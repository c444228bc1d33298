"""The Flax VAEs against diffusers: tiny random SD3 ``AutoencoderKL`` (plus an SD1-style one with
quant convs and no shift) and Qwen-Image ``AutoencoderKLQwenImage`` folders, with diffusers'
own decode/encode outputs stored beside them (tests/fixtures/diffusers/vae, made by
make_vae_fixtures.py; no torch needed here). Also: the pure decode traced inside a caller's jit
and on a data-parallel batch, the latent normalisation, determinism of decode(encode(x)), and
one-line errors for a broken folder. One live test regenerates where diffusers is installed."""
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

from spotlight_jax.io import safetensors_format
from spotlight_jax.models.convert import vae_from_diffusers
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.parallel import make_mesh
from spotlight_jax.parallel.sharding import shard_state

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers" / "vae"
FAMILIES = ["sd3", "sd1_style", "qwen_image"]
ATOL = 1e-5


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request):
    """``(family, vae, reference arrays, ours)``; ours are computed once per family, through the
    contract's ``decode``/``encode`` (jitted) and the unclipped raw decode."""
    family = request.param
    ref = {k: np.array(v) for k, v in
           safetensors_format.load(FIXTURES / f"{family}.reference.safetensors").items()}
    vae = vae_from_diffusers(FIXTURES / family)
    raw_decode = jax.jit(lambda state, z: nnx.merge(vae.graphdef, state).decode(z))
    with jax.default_matmul_precision("highest"):
        ours = {"images": np.asarray(vae.decode(ref["latents"])),
                "latents": np.asarray(vae.encode(ref["images"])),
                "decoded_raw": np.asarray(raw_decode(
                    vae.state, ref["latents"] * vae.latent_scale + vae.latent_shift)),
                "decoded_unnormalised": np.asarray(raw_decode(vae.state, ref["latents"]))}
    return family, vae, ref, ours


def test_decode_matches_diffusers(loaded):
    family, vae, ref, ours = loaded
    b, h, w, _ = ref["latents"].shape
    f = vae.downsample_factor
    assert h != w, "the fixture must be non-square"
    assert ours["images"].shape == (b, h * f, w * f, 3) and ours["images"].dtype == np.float32
    # before the clip to [0, 1], so saturated pixels cannot hide an error
    np.testing.assert_allclose(ours["decoded_raw"], ref["decoded_raw"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(ours["images"], ref["images_decoded"], atol=ATOL, rtol=0)
    assert ours["images"].min() >= 0.0 and ours["images"].max() <= 1.0


def test_encode_matches_diffusers(loaded):
    family, vae, ref, ours = loaded
    assert ours["latents"].shape == ref["latents_encoded"].shape == (2, 4, 6, vae.latent_channels)
    assert ours["latents"].dtype == np.float32
    np.testing.assert_allclose(ours["latents"], ref["latents_encoded"], atol=ATOL, rtol=0)


def test_latent_normalisation_is_applied(loaded):
    """Skipping the family's scale/shift would miss the references by far more than the
    tolerance, in both directions, so the parity tests above would catch it."""
    family, vae, ref, ours = loaded
    assert np.any(vae.latent_scale != 1.0)
    assert family == "sd1_style" or np.any(vae.latent_shift != 0.0)  # SD1: shift_factor None
    skipped = np.clip(ours["decoded_unnormalised"] * 0.5 + 0.5, 0.0, 1.0)
    assert np.abs(skipped - ref["images_decoded"]).max() > 100 * ATOL
    assert np.abs(ref["encoded_raw"] - ref["latents_encoded"]).max() > 100 * ATOL


def test_scaling_and_shift_come_from_the_config():
    cfg = json.loads((FIXTURES / "sd3" / "config.json").read_text())
    vae = vae_from_diffusers(FIXTURES / "sd3")
    np.testing.assert_allclose(vae.latent_scale, [1.0 / cfg["scaling_factor"]], rtol=1e-7)
    np.testing.assert_allclose(vae.latent_shift, [cfg["shift_factor"]], rtol=1e-7)
    sd1 = vae_from_diffusers(FIXTURES / "sd1_style")
    np.testing.assert_array_equal(sd1.latent_shift, [0.0])  # shift_factor: null
    qcfg = json.loads((FIXTURES / "qwen_image" / "config.json").read_text())
    qvae = vae_from_diffusers(FIXTURES / "qwen_image")
    np.testing.assert_allclose(qvae.latent_scale, qcfg["latents_std"], rtol=1e-7)
    np.testing.assert_allclose(qvae.latent_shift, qcfg["latents_mean"], rtol=1e-7)


def test_decode_of_encode_is_deterministic(loaded):
    _, vae, ref, ours = loaded
    with jax.default_matmul_precision("highest"):  # the fixture's compiled programs
        a = np.asarray(vae.decode(vae.encode(ref["images"])))
        b = np.asarray(vae.decode(ours["latents"]))
    assert a.shape == ref["images"].shape
    np.testing.assert_array_equal(a, b)


def test_decode_is_pure_inside_a_callers_jit_on_a_data_parallel_batch(loaded):
    """The rollout's use: the state enters a caller's jitted program as an argument, and the
    batch is split over the mesh's data axis (8 emulated devices)."""
    family, vae, ref, _ = loaded
    latents = np.concatenate([ref["latents"]] * 4)
    expected = np.concatenate([ref["images_decoded"]] * 4)

    @jax.jit
    def rollout_tail(state, x):
        return vae.decode_with(state, x).mean(axis=-1)

    mesh = make_mesh()  # data=8
    state = shard_state(vae.state, mesh)
    x = jax.device_put(latents, NamedSharding(mesh, PartitionSpec("data")))
    with jax.default_matmul_precision("highest"):
        gray = rollout_tail(state, x)
    assert len(gray.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(gray), expected.mean(-1), atol=ATOL, rtol=0)


def test_wrong_layout_is_a_one_line_error():
    vae = vae_from_diffusers(FIXTURES / "sd3")
    with pytest.raises(ValueError, match=r"latents.shape=\(1, 16, 4, 6\): expected \[B, h, w, 16"):
        vae.decode(np.zeros((1, 16, 4, 6), np.float32))  # channels-first by mistake
    with pytest.raises(ValueError, match=r"images.shape=\(1, 8, 12\)"):
        vae.encode(np.zeros((1, 8, 12), np.float32))


def _copy_with(tmp_path, family, edit) -> pathlib.Path:
    """A copy of the fixture folder whose weights went through ``edit(dict) -> dict``."""
    folder = tmp_path / family
    shutil.copytree(FIXTURES / family, folder)
    path = folder / "diffusion_pytorch_model.safetensors"
    tensors = {k: np.array(v) for k, v in safetensors_format.load(path).items()}
    safetensors_format.save(path, edit(tensors), {"format": "pt"})
    return folder


def _one_line_error(folder) -> str:
    with pytest.raises(CheckpointError) as e:
        vae_from_diffusers(folder)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("family,key", [
    ("sd3", "decoder.mid_block.attentions.0.to_out.0.weight"),
    ("qwen_image", "decoder.up_blocks.0.upsamplers.0.resample.1.weight"),
])
def test_missing_tensor_is_named(tmp_path, family, key):
    folder = _copy_with(tmp_path, family, lambda t: {k: v for k, v in t.items() if k != key})
    assert key in _one_line_error(folder)


def test_misshaped_and_unexpected_tensors_are_named(tmp_path):
    key = "encoder.conv_in.weight"
    folder = _copy_with(tmp_path / "a", "sd3", lambda t: {**t, key: t[key][:, :2]})
    assert key in _one_line_error(folder) and "shape" in _one_line_error(folder)
    folder = _copy_with(tmp_path / "b", "sd3", lambda t: {**t, "decoder.extra.weight": t[key]})
    assert "decoder.extra.weight" in _one_line_error(folder)


def test_unsupported_class_is_named(tmp_path):
    folder = tmp_path / "vae"
    shutil.copytree(FIXTURES / "sd3", folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "_class_name": "AutoencoderTiny"}))
    assert "AutoencoderTiny" in _one_line_error(folder)


def test_legacy_attention_names_load_the_same(tmp_path):
    """Old SD checkpoints name the mid-block attention query/key/value/proj_attn."""
    names = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}

    def rename(t):
        out = {}
        for k, v in t.items():
            for new, old in names.items():
                k = k.replace(f".attentions.0.{new}.", f".attentions.0.{old}.")
            out[k] = v
        return out

    folder = _copy_with(tmp_path, "sd3", rename)
    legacy = nnx.to_pure_dict(vae_from_diffusers(folder).state)
    current = nnx.to_pure_dict(vae_from_diffusers(FIXTURES / "sd3").state)
    jax.tree.map(np.testing.assert_array_equal, legacy, current)


def test_live_regeneration_matches_diffusers(tmp_path):
    """Where torch + diffusers are installed: fresh random VAEs (another seed), diffusers'
    outputs computed now, ours compared to them."""
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    spec = importlib.util.spec_from_file_location("make_vae_fixtures",
                                                  FIXTURES / "make_vae_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for family in ("sd3", "qwen_image", "wan", "wan22"):
        torch_vae = gen.build(family, seed=7)
        torch_vae.save_pretrained(tmp_path / family, safe_serialization=True)
        ref = gen.references(torch_vae, family, seed=7)
        vae = vae_from_diffusers(tmp_path / family)
        with jax.default_matmul_precision("highest"):
            images = np.asarray(vae.decode(jnp.asarray(ref["latents"])))
            latents = np.asarray(vae.encode(jnp.asarray(ref["images"])))
        if "decoded_raw_f64" in ref:    # clips: against the float64 truth (test_vae_wan.py)
            ref["images_decoded"] = np.clip(ref["decoded_raw_f64"] / 2 + 0.5, 0, 1)
            ref["latents_encoded"] = (ref["encoded_raw_f64"] - vae.latent_shift) / vae.latent_scale
        np.testing.assert_allclose(images, ref["images_decoded"], atol=ATOL, rtol=0)
        np.testing.assert_allclose(latents, ref["latents_encoded"], atol=ATOL, rtol=0)
