"""Our exported LoRA loads into diffusers and gives our model's output: a tiny random SD3.5,
Qwen-Image and FLUX.1 [dev] transformer (the converter's fixtures; Flux's single-stream blocks
too), and a tiny random Z-Image and FLUX.2 [dev] / [klein] one (their own fixture scripts;
FLUX.2's single-stream q/k/v exported into diffusers' fused ``to_qkv_mlp_proj``), with a random
trained-looking LoRA merged on our side, and the exported file loaded by diffusers'
``load_lora_adapter`` (PEFT) on theirs: every written module adapted, none ignored.
Needs torch, diffusers and peft (skipped without them: CI has none)."""
import importlib.util
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.models.convert import from_diffusers
from spotlight_jax.rl import lora as lora_lib
from spotlight_jax.rl import lora_export

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers"


def _generator(script="make_transformer_fixtures"):
    spec = importlib.util.spec_from_file_location(script, FIXTURES / f"{script}.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def _trained(state):
    """Random rank-4 adapters on every LoRA target, ``b`` nonzero (a fresh one is zero)."""
    lora = lora_lib.init_lora(state, 4, jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), len(lora))
    return {p: {"a": ad["a"], "b": 0.3 * jax.random.normal(k, ad["b"].shape)}
            for k, (p, ad) in zip(keys, sorted(lora.items()))}


@pytest.mark.parametrize("name", ["sd35", "qwen_image", "flux_dev"])
def test_exported_lora_in_diffusers_equals_our_merged_model(tmp_path, name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    pytest.importorskip("peft")
    gen = _generator()
    model = gen.build(name, seed=2)
    model.save_pretrained(tmp_path / name, safe_serialization=True)
    ours, _ = from_diffusers(tmp_path / name)
    graphdef, state = nnx.split(ours)
    lora = lora_lib.init_lora(state, 4, jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), len(lora))
    lora = {p: {"a": ad["a"], "b": 0.3 * jax.random.normal(k, ad["b"].shape)}
            for k, (p, ad) in zip(keys, sorted(lora.items()))}
    scale = 2.0
    path = tmp_path / "lora.safetensors"
    tensors = lora_export.export(lora, scale, path, rank=4)
    merged = nnx.merge(graphdef, lora_lib.merge(state, lora, scale))

    inp = gen.inputs(name, "wide", seed=3)
    # Flux [dev]: torch's exp rounding in the guidance embedding set aside (the fixtures' note)
    reference = gen.reference_rounded_exp if name == "flux_dev" else gen.reference
    before = reference(model, name, inp)
    # what pipeline.load_lora_weights(path) hands the transformer: the file's keys, prefixed
    model.load_lora_adapter({k: torch.from_numpy(v) for k, v in tensors.items()},
                            prefix="transformer", adapter_name="ours")
    want = reference(model, name, inp)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(merged(inp["x"], inp["t"], inp["text"], inp.get("mask"),
                                inp.get("pooled"), inp.get("guidance")))
    assert np.abs(want - before).max() > 1e-2          # the adapter changed diffusers' output
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


# family: (fixture script, its model name or None, input case)
FAMILIES = {"z_image": ("make_z_image_fixture", None, "odd"),
            "flux2_dev": ("make_flux2_fixture", "flux2_dev", "odd"),
            "flux2_klein": ("make_flux2_fixture", "flux2_klein", "odd")}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_exported_z_image_and_flux2_lora_in_diffusers_equals_our_merged_model(tmp_path, name):
    """Z-Image on its padded-caption, non-square case (adapters on the main layers and the
    noise refiner); FLUX.2 on its odd patch grid (the dual streams' q/k/v split three ways,
    the single-stream blocks' as the first rows of ``to_qkv_mlp_proj``). Each compared with
    diffusers' velocity under a correctly rounded ``exp`` (the fixtures' note)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    peft = pytest.importorskip("peft")
    script, model_name, case = FAMILIES[name]
    gen = _generator(script)
    args = () if model_name is None else (model_name,)
    model = gen.build(*args, seed=2)
    model.save_pretrained(tmp_path / name, safe_serialization=True)
    ours, cfg = from_diffusers(tmp_path / name)
    graphdef, state = nnx.split(ours)
    lora, scale = _trained(state), 2.0
    tensors = lora_export.export(lora, scale, tmp_path / "lora.safetensors", rank=4, model=cfg)
    merged = nnx.merge(graphdef, lora_lib.merge(state, lora, scale))

    inp = gen.inputs(*args, case, seed=3)
    before = gen.reference_rounded_exp(model, *args, inp)
    model.load_lora_adapter({k: torch.from_numpy(v) for k, v in tensors.items()},
                            prefix="transformer", adapter_name="ours")
    adapted = {n for n, m in model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
    assert adapted == {k.removeprefix("transformer.").removesuffix(".lora_A.weight")
                       for k in tensors if k.endswith(".lora_A.weight")}
    want = gen.reference_rounded_exp(model, *args, inp)
    with jax.default_matmul_precision("highest"):
        got = np.asarray(merged(inp["x"], inp["t"], inp["text"], inp.get("mask"), None,
                                inp.get("guidance")))
    assert np.abs(want - before).max() > 1e-2          # the adapter changed diffusers' output
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
