"""The Wan video transformer against diffusers' ``WanTransformer3DModel`` on a tiny random model
(``tests/fixtures/diffusers/transformer/wan``, 2 blocks, with diffusers' outputs at 3 latent
frames of 4 x 6 and at 1 frame of 6 x 4): ``models.convert.from_diffusers`` loads the folder
and the velocity equals diffusers' to 1e-5 in float32. Bad checkpoints and shapes are one-line
errors."""
import json
import pathlib
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from spotlight_jax.models import convert
from spotlight_jax.models.convert import wan as convert_wan
from spotlight_jax.models.wan_transformer import WanConfig, WanTransformer

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers" / "transformer"


@pytest.fixture(scope="module")
def wan():
    return convert.from_diffusers(FIXTURE / "wan")


@pytest.mark.parametrize("shape", ["odd", "one_frame"])
def test_the_velocity_equals_diffusers(wan, shape):
    model, cfg = wan
    assert isinstance(model, WanTransformer) and isinstance(cfg, WanConfig)
    assert (cfg.num_layers, cfg.num_attention_heads, cfg.rope_axes) == (2, 2, (4, 4, 4))
    ref = np.load(FIXTURE / "wan.npz")
    got = model(jnp.asarray(ref[f"{shape}_x"]), jnp.asarray(ref[f"{shape}_t"]),
                jnp.asarray(ref[f"{shape}_text"]))
    want = ref[f"{shape}_out"]
    assert got.shape == want.shape and float(np.abs(want).max()) > 0.1
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def test_bad_checkpoints_and_shapes_say_what_is_wrong(wan, tmp_path):
    model, cfg = wan
    with pytest.raises(ValueError, match="not a Wan transformer"):
        convert_wan.wan_config({"_class_name": "FluxTransformer2DModel"})
    with pytest.raises(ValueError, match="only text-to-video"):
        convert_wan.wan_config({"_class_name": convert_wan.CLASS_NAME, "image_dim": 1280})
    with pytest.raises(ValueError, match="tensor 'patch_embedding.weight' is missing"):
        convert_wan.wan_params({}, cfg)
    with pytest.raises(ValueError, match="does not divide into patches"):
        model(jnp.zeros((1, 2, 5, 4, 4)), jnp.zeros((1,)), jnp.zeros((1, 3, 16)))
    # a config that does not match the weights: the parameter and both shapes named
    bad = tmp_path / "wan"
    shutil.copytree(FIXTURE / "wan", bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "ffn_dim": 48}))
    with pytest.raises(ValueError, match=r"blocks/0/ffn_in/bias has shape \(40,\), the config "
                                         r"gives \(48,\)"):
        convert.from_diffusers(bad)



@pytest.mark.e2e          # a second load and a sharded program (~10 s)
def test_each_parameter_lands_on_its_sharding():
    """``shardings(path, shape)`` places every parameter: the blocks' weights split over 2
    devices, the rest replicated on them; the velocity is unchanged."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2])
    seen = []

    def shardings(path, shape):
        seen.append(path)
        if path[0] == "blocks" and len(shape) == 2 and shape[0] % 2 == 0:
            return NamedSharding(mesh, PartitionSpec("fsdp", None))
        return NamedSharding(mesh, PartitionSpec())

    model, _ = convert.from_diffusers(FIXTURE / "wan", shardings=shardings)
    kernel = model.blocks[0].attn1.to_q.kernel[...]
    assert kernel.sharding == NamedSharding(mesh, PartitionSpec("fsdp", None))
    assert ("blocks", 1, "ffn_out", "kernel") in seen and ("patch_embed", "bias") in seen
    ref = np.load(FIXTURE / "wan.npz")
    got = model(jnp.asarray(ref["odd_x"]), jnp.asarray(ref["odd_t"]), jnp.asarray(ref["odd_text"]))
    np.testing.assert_allclose(np.asarray(got), ref["odd_out"], atol=1e-5, rtol=1e-5)


def test_scanned_blocks_load_stacked_onto_their_shardings_and_equal_diffusers():
    """``scan_blocks=True``: each block parameter is stacked on a leading axis (the kernels'
    rows here split over 2 devices, filled one block's tensor at a time), equal to the looped
    model's blocks, and the scanned velocity equals diffusers'."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((2,), ("fsdp",), devices=jax.devices()[:2])

    def shardings(path, shape):       # a stacked kernel's input rows split (the scan's axis,
        split = path[0] == "blocks" and len(shape) == 3 and shape[1] % 2 == 0   # whole)
        return NamedSharding(mesh, PartitionSpec(None, "fsdp") if split else PartitionSpec())

    looped, _ = convert.from_diffusers(FIXTURE / "wan")
    model, cfg = convert.from_diffusers(FIXTURE / "wan", shardings=shardings, scan_blocks=True)
    assert cfg.scan_blocks
    stacked = model.blocks.attn1.to_q.kernel[...]
    assert stacked.shape[0] == 2 and stacked.sharding.spec == PartitionSpec(None, "fsdp")
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(stacked)[i],
                                      np.asarray(looped.blocks[i].attn1.to_q.kernel[...]))
    ref = np.load(FIXTURE / "wan.npz")
    got = model(jnp.asarray(ref["odd_x"]), jnp.asarray(ref["odd_t"]), jnp.asarray(ref["odd_text"]))
    np.testing.assert_allclose(np.asarray(got), ref["odd_out"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["ulysses", "ring"])
def test_sequence_parallel_over_the_video_tokens_equals_dense(wan, strategy):
    """The self-attention's video tokens split over 2 devices (the text keys of the
    cross-attention stay whole): the same velocity as on one device."""
    import jax

    from spotlight_jax.models.mmdit import AttentionSpec
    from spotlight_jax.parallel import MeshConfig, make_mesh
    model, _ = wan
    ref = np.load(FIXTURE / "wan.npz")
    mesh = make_mesh(jax.devices()[:2], MeshConfig(data=1, fsdp=1, sp=2))
    args = (jnp.asarray(ref["odd_x"]), jnp.asarray(ref["odd_t"]), jnp.asarray(ref["odd_text"]))
    got = model(*args, attn=AttentionSpec(mesh=mesh, strategy=strategy, axis="sp"))
    np.testing.assert_allclose(np.asarray(got), ref["odd_out"], atol=1e-5, rtol=1e-5)


@pytest.mark.e2e          # 16,384 video tokens: dense attention's logits are 1 GiB per head
def test_sequence_parallel_over_8_devices_equals_dense_at_16k_video_tokens(wan):
    """A clip of 16 latent frames of 64 x 64 (16 x 32 x 32 = 16,384 video tokens) through the
    converted model: its self-attention over 8 emulated devices (USP: the 2 heads all-to-all
    over 2 devices, ring over 4) gives the single-device dense velocity."""
    import jax

    from spotlight_jax.models.mmdit import AttentionSpec
    from spotlight_jax.parallel import MeshConfig, make_mesh
    model, cfg = wan
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((1, 16, 64, 64, cfg.in_channels)), jnp.float32)
    t = jnp.asarray([0.6], jnp.float32)
    text = jnp.asarray(rng.standard_normal((1, 5, cfg.text_dim)), jnp.float32)
    dense = np.asarray(jax.jit(lambda a, b, c: model(a, b, c))(x, t, text))
    mesh = make_mesh(jax.devices()[:8], MeshConfig(data=1, fsdp=1, sp=8))
    spec = AttentionSpec(mesh=mesh, strategy="usp", axis="sp")
    got = np.asarray(jax.jit(lambda a, b, c: model(a, b, c, attn=spec))(x, t, text))
    assert got.shape == dense.shape == (1, 16, 64, 64, cfg.in_channels)
    np.testing.assert_allclose(got, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.e2e          # two gradient programs (~20 s)
def test_remat_gives_the_same_gradient(wan):
    """``remat=True`` recomputes each block in the backward: the same gradient; scanned
    (``scan_blocks=True``) too, block by block."""
    import jax
    from flax import nnx

    from spotlight_jax.models.convert import diffusers_folder
    ref = np.load(FIXTURE / "wan.npz")
    config, tensors = diffusers_folder.read_component(FIXTURE / "wan")
    grads = []
    for remat, scan in ((False, False), (True, False), (True, True)):
        model, _ = convert_wan.wan_model(config, tensors, remat=remat, scan_blocks=scan)
        graphdef, state = nnx.split(model)
        loss = jax.jit(jax.grad(lambda s, g=graphdef: jnp.sum(nnx.merge(g, s)(
            jnp.asarray(ref["one_frame_x"]), jnp.asarray(ref["one_frame_t"]),
            jnp.asarray(ref["one_frame_text"])) ** 2)))
        grads.append(nnx.to_pure_dict(loss(state)))
    for g in grads[1:-1]:
        assert all(np.allclose(a, b, atol=1e-6)
                   for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(g)))
    # scanned: the same gradients, each block's stacked along the leading axis
    scanned, looped = grads[-1], grads[0]
    blocks = scanned.pop("blocks")
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(
        jax.tree.leaves({k: v for k, v in looped.items() if k != "blocks"}),
        jax.tree.leaves(scanned)))
    for i in range(2):
        assert all(np.allclose(a[i], b, atol=1e-6) for a, b in zip(
            jax.tree.leaves(blocks), jax.tree.leaves(looped["blocks"][i])))
