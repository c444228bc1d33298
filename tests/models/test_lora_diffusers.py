"""Our exported LoRA loads into diffusers and gives our model's output: a tiny random SD3.5,
Qwen-Image and FLUX.1 [dev] transformer (the converter's fixtures; Flux's single-stream blocks
too) with a random trained-looking LoRA merged on
our side, and the exported file loaded by diffusers' ``load_lora_adapter`` (PEFT) on theirs.
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


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_transformer_fixtures", FIXTURES / "make_transformer_fixtures.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


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
