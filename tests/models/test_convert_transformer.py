"""diffusers transformers (Qwen-Image, SD3, SD3.5, FLUX.1 [dev] and [schnell]) converted into our
MMDiT equal diffusers' own outputs: tiny random models and their float32 outputs on square, wide
and tall latents are committed fixtures (tests/fixtures/diffusers/, made by
make_transformer_fixtures.py), so no torch is needed. Also: mask None equals an all-True mask,
fp32/fp16/sharded checkpoints load, a bf16 model keeps the stored bits, a renamed, missing or
mis-shaped tensor is one clear error, sequence-parallel attention equals dense, scan equals
the loop, and LoRA finds the projections. Where diffusers is importable, one test regenerates a
model live and compares."""
import dataclasses
import functools
import importlib.util
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.emulation import flops
from spotlight_jax.io import safetensors_format
from spotlight_jax.models import AttentionSpec, MMDiTConfig
from spotlight_jax.models.convert import CheckpointError, convert_tensors, from_diffusers
from spotlight_jax.models.convert.diffusers_folder import read_component
from spotlight_jax.parallel import MeshConfig, make_mesh
from spotlight_jax.rl import lora

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"
TRANSFORMER = FIXTURES / "transformer"
NAMES = ("qwen_image", "sd3", "sd35", "flux_dev", "flux_schnell")
SIZES = ("square", "wide", "tall")     # tall only for the RoPE models (Qwen-Image, Flux)
ROPE = ("qwen_image", "flux_dev", "flux_schnell")
ATOL = 1e-5                     # float32, matmuls at 'highest' precision


@pytest.fixture(autouse=True)
def highest_precision():
    with jax.default_matmul_precision("highest"):
        yield


@functools.cache
def converted(name):
    model, cfg = from_diffusers(TRANSFORMER / name)
    return nnx.split(model), cfg


@jax.jit
def _forward(graphdef, state, x, t, text, mask, pooled, guidance):
    return nnx.merge(graphdef, state)(x, t, text, mask, pooled, guidance)


def forward(name, inp, mask="given", attn=None, split=None):
    """Our velocity for the fixture inputs ``inp`` (``mask``: 'given', 'none' or 'all')."""
    (graphdef, state), _ = split or converted(name)
    m = {"given": inp.get("mask"), "none": None,
         "all": np.ones(inp["text"].shape[:2], bool)}[mask]
    args = (inp["x"], inp["t"], inp["text"], m, inp.get("pooled"), inp.get("guidance"))
    if attn is not None:
        return nnx.merge(graphdef, state)(*args, attn=attn)
    return _forward(graphdef, state, *args)


def fixture_inputs(name, size):
    ref = np.load(TRANSFORMER / f"{name}.npz")
    return {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith(f"{size}/")}


CASES = [(n, s) for n in NAMES for s in SIZES if s != "tall" or n in ROPE]


def reference(inp):
    """diffusers' velocity; for Flux [dev] computed with a correctly rounded ``exp`` (torch's
    is one ulp off on 2 of the timestep embedding's frequencies, which the guidance scale x 1000
    magnifies: ``make_transformer_fixtures.reference_rounded_exp``; the test below bounds
    diffusers' velocity as torch computes it)."""
    return inp.get("v_rounded_exp", inp["v"])


@pytest.mark.parametrize("name, size", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_converted_model_equals_diffusers(name, size):
    inp = fixture_inputs(name, size)
    np.testing.assert_allclose(forward(name, inp), reference(inp), rtol=0, atol=ATOL)


def test_flux_dev_guidance_matters_and_torchs_own_exp_moves_it_by_its_rounding():
    inp = fixture_inputs("flux_dev", "wide")
    ours = np.asarray(forward("flux_dev", inp))
    # torch's exp rounding alone moves diffusers' output by ~1e-5 (3500 x one ulp of a frequency
    # in the guidance embedding); ours sits within 2e-5 of it
    gap = float(np.abs(inp["v"] - inp["v_rounded_exp"]).max())
    assert 1e-6 < gap < 2e-5
    np.testing.assert_allclose(ours, inp["v"], rtol=0, atol=2e-5)
    other = np.asarray(forward("flux_dev", {**inp, "guidance": inp["guidance"][::-1].copy()}))
    assert np.abs(other - ours).max() > 1e-3          # the guidance input is used
    (graphdef, state), _ = converted("flux_dev")
    with pytest.raises(ValueError, match=r"^guidance=None: this model \(guidance_embed=True"):
        nnx.merge(graphdef, state)(inp["x"], inp["t"], inp["text"], None, inp["pooled"])


def test_qwen_image_mask_none_equals_all_true_and_diffusers_unmasked():
    inp = fixture_inputs("qwen_image", "wide")
    none, full = forward("qwen_image", inp, "none"), forward("qwen_image", inp, "all")
    np.testing.assert_array_equal(none, full)
    np.testing.assert_allclose(none, inp["v_nomask"], rtol=0, atol=ATOL)
    # the padded prompt's mask matters (else the masked check above would prove nothing)
    assert np.abs(np.asarray(forward("qwen_image", inp)) - np.asarray(none))[1].max() > 1e-3


def test_sd3_attends_to_every_text_token_as_diffusers_does():
    inp = fixture_inputs("sd3", "square")
    padded = np.ones(inp["text"].shape[:2], bool)
    padded[:, 3:] = False
    a = forward("sd3", {**inp, "mask": padded})
    np.testing.assert_array_equal(a, forward("sd3", inp, "none"))


def copy_with(tmp_path, name, tensors=None, shards=1, config=None):
    """The fixture folder ``name`` rewritten with ``tensors`` (our writer), in ``shards``."""
    cfg0, t0 = read_component(TRANSFORMER / name)
    tensors = t0 if tensors is None else tensors
    out = tmp_path / name
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config or cfg0))
    keys = sorted(tensors)
    if shards == 1:
        safetensors_format.save(out / "diffusion_pytorch_model.safetensors", tensors)
        return out
    weight_map = {}
    for i in range(shards):
        fname = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in keys[i::shards]}
        safetensors_format.save(out / fname, part)
        weight_map.update({k: fname for k in part})
    (out / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


@pytest.mark.parametrize("dtype, shards", [(np.float32, 1), (np.float16, 1), (np.float32, 3)],
                         ids=["fp32", "fp16", "fp32_sharded"])
def test_fp32_fp16_and_sharded_checkpoints_load(tmp_path, dtype, shards):
    _, tensors = read_component(TRANSFORMER / "qwen_image")
    folder = copy_with(tmp_path, "qwen_image", {k: np.asarray(v).astype(dtype)
                                                for k, v in tensors.items()}, shards)
    model, cfg = from_diffusers(folder)
    inp = fixture_inputs("qwen_image", "wide")
    # the bf16 fixture weights are exact in fp32 and fp16 (fp16 may round the tiniest)
    np.testing.assert_allclose(forward("qwen_image", inp, split=(nnx.split(model), cfg)),
                               inp["v"], rtol=0, atol=ATOL)


def test_sd3_table_is_rounded_through_its_stored_dtype():
    """diffusers adds the table as stored (bf16 here): ours rounds the recomputed one the same
    way, and a float32 table must match ours to float32 precision."""
    (_, _), cfg = converted("sd3")
    assert cfg.pos_embed_dtype == "bfloat16"
    config, tensors = read_component(TRANSFORMER / "sd3")
    as_f32 = {**tensors, "pos_embed.pos_embed": np.asarray(tensors["pos_embed.pos_embed"],
                                                           np.float32)}
    with pytest.raises(CheckpointError, match="differs from the sin-cos table"):
        convert_tensors(config, as_f32)


def test_bf16_model_keeps_the_stored_bits():
    model, cfg = from_diffusers(TRANSFORMER / "qwen_image", dtype=jnp.bfloat16)
    _, tensors = read_component(TRANSFORMER / "qwen_image")
    assert cfg.dtype == cfg.param_dtype == "bfloat16"
    q = model.blocks[1].img.qkv.kernel[...]
    assert q.dtype == jnp.bfloat16
    want = np.asarray(tensors["transformer_blocks.1.attn.to_k.weight"]).T
    np.testing.assert_array_equal(np.asarray(q[:, 32:64]).view(np.uint16), want.view(np.uint16))
    inp = fixture_inputs("qwen_image", "square")
    v = np.asarray(forward("qwen_image", inp, split=(nnx.split(model), cfg)))
    assert v.dtype == np.float32 and np.isfinite(v).all()


def errors_of(name, edit):
    config, tensors = read_component(TRANSFORMER / name)
    tensors = dict(tensors)
    config = dict(config)
    edit(config, tensors)
    with pytest.raises(CheckpointError) as e:
        convert_tensors(config, tensors, source=name)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_a_renamed_tensor_names_the_missing_key_and_the_unexpected_one():
    def rename(_, t):
        t["transformer_blocks.0.attn.to_query.weight"] = t.pop(
            "transformer_blocks.0.attn.to_q.weight")
    msg = errors_of("qwen_image", rename)
    assert msg == ("qwen_image: missing tensor 'transformer_blocks.0.attn.to_q.weight' (for our "
                   "blocks/0/img/qkv/kernel); it has unexpected "
                   "'transformer_blocks.0.attn.to_query.weight'")


def test_a_missing_an_unexpected_and_a_misshaped_tensor_are_named():
    msg = errors_of("sd3", lambda _, t: t.pop("transformer_blocks.1.attn.add_v_proj.bias"))
    assert "missing tensor 'transformer_blocks.1.attn.add_v_proj.bias'" in msg
    assert "blocks/1/txt/qkv/bias" in msg
    msg = errors_of("sd3", lambda _, t: t.update({"extra.weight": np.zeros(3, np.float32)}))
    assert msg.startswith("sd3: unexpected tensor 'extra.weight'")
    msg = errors_of("qwen_image", lambda _, t: t.update({"txt_in.weight": np.zeros((32, 20))}))
    assert "tensor 'txt_in.weight' has shape (32, 20), expected (32, 24)" in msg
    assert "text_proj/kernel" in msg


def test_unsupported_configs_and_a_foreign_position_table_are_named():
    msg = errors_of("sd3", lambda c, _: c.update(_class_name="HunyuanDiT2DModel"))
    assert "_class_name='HunyuanDiT2DModel' is not a transformer we convert" in msg
    assert "'Flux2Transformer2DModel'" in msg and "'ZImageTransformer2DModel'" in msg  # listed
    msg = errors_of("flux_dev", lambda c, _: c.update(patch_size=2))
    assert "patch_size=2: Flux's transformer takes packed 2x2 latents" in msg
    msg = errors_of("qwen_image", lambda c, _: c.update(use_layer3d_rope=True))
    assert "use_layer3d_rope=True is not supported (a layered Qwen-Image variant)" in msg
    msg = errors_of("sd3", lambda c, _: c.update(sample_size=32))   # base_size 16, not 8
    assert "'pos_embed.pos_embed' differs from the sin-cos table recomputed with " \
           "base_size=16" in msg


@pytest.mark.parametrize("name, strategy, sp", [("qwen_image", "ulysses", 2),
                                                ("qwen_image", "ring", 4),
                                                ("sd35", "ring", 2), ("flux_dev", "ulysses", 2)])
def test_sequence_parallel_attention_equals_dense(name, strategy, sp):
    inp = fixture_inputs(name, "wide")
    mesh = make_mesh(jax.devices()[:sp], MeshConfig(data=1, fsdp=1, sp=sp))
    dense = forward(name, inp)
    split = converted(name)
    graphdef, state = split[0]

    @jax.jit
    def run(state, x, t, text, mask, pooled, guidance):
        return nnx.merge(graphdef, state)(x, t, text, mask, pooled, guidance,
                                          attn=AttentionSpec(mesh=mesh, strategy=strategy))
    out = run(state, inp["x"], inp["t"], inp["text"], inp.get("mask"), inp.get("pooled"),
              inp.get("guidance"))
    np.testing.assert_allclose(out, dense, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", ["qwen_image", "flux_dev"])
def test_scan_over_blocks_equals_the_loop(name):
    """Flux: both stacks (dual- and single-stream blocks) scanned."""
    model, cfg = from_diffusers(TRANSFORMER / name, scan_blocks=True, remat=True)
    assert cfg.scan_blocks
    inp = fixture_inputs(name, "tall")
    np.testing.assert_allclose(forward(name, inp, split=(nnx.split(model), cfg)),
                               reference(inp), rtol=0, atol=ATOL)


def test_lora_adapts_every_attention_projection_including_sd35s_second():
    (_, state), cfg = converted("sd35")
    adapters = lora.init_lora(state, 2, jax.random.key(0))
    names = sorted(adapters)
    # block 0: img and txt qkv/out + attn2 qkv/out; block 1 (text pre-only): img qkv/out, txt qkv
    assert len(names) == 6 + 3, names
    assert any("attn2" in n and "qkv" in n for n in names)
    assert any("attn2" in n and "out" in n for n in names)
    (_, state), cfg = converted("flux_schnell")
    adapters = lora.init_lora(state, 2, jax.random.key(0))
    names = sorted(adapters)
    # 2 dual-stream blocks x (img, txt) x (qkv, out) + 2 single-stream blocks x (qkv, out)
    assert len(names) == 8 + 4 and sum("single_blocks" in n for n in names) == 4, names
    sizes = sum(int(np.size(x)) for ad in adapters.values() for x in ad.values())
    assert sizes == flops.lora_param_count(cfg, 2)      # what the cost model charges


def test_family_options_are_validated_with_the_fix():
    base = dict(width=32, num_heads=2, text_width=0, text_embed_dim=8)
    with pytest.raises(ValueError, match=r"^rope_axes=\(4, 4, 4\): must be 3 even sizes "
                                         r"\(frame, height, width\), summing to head_dim=16"):
        MMDiTConfig(**base, pos_embed="rope3d", rope_axes=(4, 4, 4)).validate()
    with pytest.raises(ValueError, match=r"^pooled_dim=0: must be >= 1 with pooled='input'"):
        MMDiTConfig(**base, pooled="input").validate()
    with pytest.raises(ValueError, match=r"^dual_attention_layers=\(4,\): must be distinct"):
        MMDiTConfig(**base, depth=2, dual_attention_layers=(4,)).validate()
    with pytest.raises(ValueError, match=r"^scan_blocks=True: needs identical blocks"):
        MMDiTConfig(**base, scan_blocks=True, context_pre_only_last=True).validate()
    with pytest.raises(ValueError, match=r"^pos_embed='learned': choose one of"):
        MMDiTConfig(**base, pos_embed="learned").validate()
    assert dataclasses.replace(MMDiTConfig(**base), rope_axes=[2, 6, 8]).rope_axes == (2, 6, 8)


@pytest.mark.parametrize("name", ["qwen_image", "sd35", "flux_dev"])
def test_live_regenerated_model_equals_diffusers(tmp_path, name):
    pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    spec = importlib.util.spec_from_file_location(
        "make_transformer_fixtures", FIXTURES / "make_transformer_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    model = gen.build(name, seed=5)
    model.save_pretrained(tmp_path / name, safe_serialization=True)      # float32 this time
    inp = gen.inputs(name, "wide", seed=11)
    want = (gen.reference_rounded_exp if name == "flux_dev" else gen.reference)(model, name, inp)
    ours, cfg = from_diffusers(tmp_path / name)
    got = forward(name, inp, split=(nnx.split(ours), cfg))
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    shutil.rmtree(tmp_path / name)


def test_diffusers_euler_step_is_our_ode_step():
    """diffusers' flow-matching Euler step is ``x + (s_next - s) v`` with ``v`` the model's
    output, as our ODE step, so the converted velocity (``noise - x0``) needs no sign change."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    from spotlight_jax.diffusion.sde import ode_step

    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(6)
    rng = np.random.default_rng(0)
    x, v = (rng.normal(size=(2, 4, 8, 8)).astype(np.float32) for _ in range(2))
    want, got = torch.from_numpy(x), x
    for i in range(3):
        want = sched.step(torch.from_numpy(v), sched.timesteps[i], want).prev_sample
        got = ode_step(got, v, float(sched.sigmas[i]), float(sched.sigmas[i + 1]))
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-6)
