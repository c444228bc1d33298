"""Wan's causal 3-D VAEs (``AutoencoderKLWan``) against diffusers, on tiny random models with their
structure (three spatial halvings, the last two temporal: 9 frames <-> 3 latent frames,
non-square): Wan 2.1's (tests/fixtures/diffusers/vae/wan) and Wan 2.2's (``wan22``: residual
levels, 2 x 2 pixels folded into channels, a wider decoder); no torch needed here.

Two references: diffusers in float32 (what users run) and in float64 (the truth both float32
runs round). Ours in float64 equals the float64 decode to ~1e-6, the residual being diffusers'
own upsampler, which rounds through float32 even in a float64 model (with that cast removed the
two agree to 2e-14), and the encode to 1e-9. Ours in float32 is compared with the truth at 1e-5.
Then what makes the chunked decode right: causality (the first frames of a clip decode the
same whatever follows) and chunk sizes that agree, and that chunks bound compiled memory."""
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.io import safetensors_format
from spotlight_jax.models.convert import vae_from_diffusers
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.vae import WanVAE, WanVAEConfig

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers" / "vae"
FOLDER = FIXTURES / "wan"
ATOL = 1e-5


FAMILIES = ["wan", "wan22"]


def _reference(family):
    return {k: np.array(v) for k, v in
            safetensors_format.load(FIXTURES / f"{family}.reference.safetensors").items()}


@pytest.fixture(scope="module")
def ref():
    return _reference("wan")


def _raw(vae, fn, x, **kw):
    """``fn`` ('decode' or 'encode') of the raw module, jitted over the state."""
    return np.asarray(jax.jit(lambda st, a: getattr(nnx.merge(vae.graphdef, st), fn)(a, **kw))(
        vae.state, x))


@pytest.mark.parametrize("family", FAMILIES)
def test_float64_structure_equals_diffusers(family):
    ref = _reference(family)
    with jax.enable_x64(True):
        vae = vae_from_diffusers(FIXTURES / family, dtype=jnp.float64)
        z = ref["latents"].astype(np.float64) * vae.latent_scale + vae.latent_shift
        decoded = _raw(vae, "decode", z)
        encoded = _raw(vae, "encode", ref["images"].astype(np.float64) * 2.0 - 1.0)
    assert decoded.dtype == np.float64 and decoded.shape == ref["images"].shape
    np.testing.assert_allclose(decoded, ref["decoded_raw_f64"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(encoded, ref["encoded_raw_f64"], atol=1e-9, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_contract_matches_the_truth(family):
    """``LatentVAE`` as a run uses it: DiT latents ``[B, t, h, w, c]`` -> clips in [0, 1], clips
    -> normalised latents."""
    ref = _reference(family)
    vae = vae_from_diffusers(FIXTURES / family)
    assert vae.video and vae.family == "AutoencoderKLWan"
    assert vae.downsample_factor == {"wan": 8, "wan22": 16}[family]
    with jax.default_matmul_precision("highest"):
        clips = np.asarray(vae.decode(ref["latents"]))
        latents = np.asarray(vae.encode(ref["images"]))
    assert clips.shape == ref["images"].shape and clips.dtype == np.float32
    truth = np.clip(ref["decoded_raw_f64"] / 2 + 0.5, 0, 1)
    np.testing.assert_allclose(clips, truth, atol=ATOL, rtol=0)
    np.testing.assert_allclose(clips, ref["images_decoded"], atol=ATOL, rtol=0)
    truth = (ref["encoded_raw_f64"] - vae.latent_shift) / vae.latent_scale
    np.testing.assert_allclose(latents, truth, atol=ATOL, rtol=0)
    np.testing.assert_allclose(latents, ref["latents_encoded"], atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def ours64(ref):
    """Ours in float64 (Wan 2.1's fixture): the module, the fixture's raw latents and clips, the
    decode (one latent frame per chunk) and the encode (all at once)."""
    with jax.enable_x64(True):
        vae = vae_from_diffusers(FOLDER, dtype=jnp.float64)
        z = ref["latents"].astype(np.float64) * vae.latent_scale + vae.latent_shift
        x = ref["images"].astype(np.float64) * 2.0 - 1.0
        return vae, z, x, _raw(vae, "decode", z), _raw(vae, "encode", x)


def test_chunks_agree_and_the_decode_is_causal(ours64):
    """One latent frame per chunk (the default) and all at once: the same clip; the first two
    latent frames decode to the clip's first 5 frames (nothing later leaks into them), as the
    first 5 frames encode to the first two latent frames."""
    vae, z, x, decoded, encoded = ours64
    with jax.enable_x64(True):
        np.testing.assert_allclose(_raw(vae, "decode", z, chunk=None), decoded, atol=1e-12,
                                   rtol=0)
        np.testing.assert_allclose(_raw(vae, "decode", z[:, :2]), decoded[:, :5], atol=1e-12,
                                   rtol=0)
        np.testing.assert_allclose(_raw(vae, "encode", x[:, :5]), encoded[:, :2], atol=1e-12,
                                   rtol=0)


def test_chunked_decode_bounds_compiled_memory():
    """XLA's own analysis of the compiled decode: one latent frame per chunk needs far less
    scratch memory than the whole clip at once, and beyond the clip it returns, its scratch
    does not grow with the clip's length."""
    cfg = WanVAEConfig(base_dim=4, z_dim=4, dim_mult=(1, 2), num_res_blocks=1,
                       temperal_downsample=(True,))
    graphdef, state = nnx.split(WanVAE(cfg, rngs=None))   # shape-only: compiled, never run

    def memory(frames, chunk):
        z = jax.ShapeDtypeStruct((1, frames, 8, 8, 4), jnp.float32)
        fn = jax.jit(lambda st, a: nnx.merge(graphdef, st).decode(a, chunk))
        m = fn.lower(state, z).compile().memory_analysis()
        return m.temp_size_in_bytes, m.output_size_in_bytes

    (one, out9), (whole, _) = memory(9, 1), memory(9, None)
    assert one < whole / 2, (one, whole)
    longer, out33 = memory(33, 1)
    assert longer - out33 < 1.25 * (one - out9), (longer, out33, one, out9)


def test_bad_frame_counts_and_chunks_are_one_line_errors():
    loaded = vae_from_diffusers(FOLDER)
    vae = nnx.merge(loaded.graphdef, loaded.state)
    with pytest.raises(ValueError, match=r"frames=8: this VAE takes 4k \+ 1 frames \(e.g. 5 or 9"):
        vae.encode(jnp.zeros((1, 8, 16, 16, 3)))
    with pytest.raises(ValueError, match=r"chunk=2: encodes a multiple of 4"):
        vae.encode(jnp.zeros((1, 9, 16, 16, 3)), chunk=2)
    with pytest.raises(ValueError, match=r"chunk=2: must divide the 3 frames after the first"):
        vae.decode(jnp.zeros((1, 4, 2, 2, 16)), chunk=2)


def test_latent_rank_is_checked():
    vae = vae_from_diffusers(FOLDER)
    with pytest.raises(ValueError, match=r"expected \[B, t, h, w, 16\]"):
        vae.decode(np.zeros((1, 2, 3, 16), np.float32))       # an image's latents
    with pytest.raises(ValueError, match=r"expected \[B, T, H, W, 3\]"):
        vae.encode(np.zeros((1, 16, 24, 3), np.float32))


def test_a_config_that_does_not_match_the_weights_is_one_line(tmp_path):
    """Wan 2.1's weights under a Wan 2.2 config: a tensor of another shape is named."""
    folder = tmp_path / "vae"
    shutil.copytree(FOLDER, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "is_residual": True, "patch_size": 2,
                                                    "in_channels": 12, "out_channels": 12}))
    with pytest.raises(CheckpointError,
                       match=r"tensor '[a-z_.0-9]+' has shape .*does config.json") as e:
        vae_from_diffusers(folder)
    assert "\n" not in str(e.value)
