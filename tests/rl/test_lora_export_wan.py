"""The Wan transformer's LoRA (on to_q/to_k/to_v/to_out of its self- and cross-attention)
exports under diffusers' own module names: offline, every written ``lora_B @ lora_A`` equals
what our merge adds to that kernel; where torch, diffusers and peft are installed, the file
loaded by diffusers' ``load_lora_adapter`` (what ``WanPipeline.load_lora_weights`` hands the
transformer) gives our merged model's velocity on the tiny random Wan fixture."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.models import convert
from spotlight_jax.rl import lora as lora_lib
from spotlight_jax.rl import lora_export

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers" / "transformer"
PROJ = ("to_q", "to_k", "to_v", "to_out")


def _lora(state, rank=4):
    lora = lora_lib.init_lora(state, rank, jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), len(lora))
    return {p: {"a": ad["a"], "b": 0.3 * jax.random.normal(k, ad["b"].shape)}
            for k, (p, ad) in zip(keys, sorted(lora.items()))}


def test_wan_lora_exports_every_attention_projection(tmp_path):
    model, cfg = convert.from_diffusers(FIXTURE / "wan")
    graphdef, state = nnx.split(model)
    lora, scale = _lora(state), 2.0
    assert len(lora) == cfg.num_layers * 2 * len(PROJ)
    back = lora_export.export(lora, scale, tmp_path / "lora.safetensors", rank=4)
    merged = nnx.to_pure_dict(lora_lib.merge(state, lora, scale))
    base = nnx.to_pure_dict(state)
    for i in range(cfg.num_layers):
        for attn in ("attn1", "attn2"):
            for proj in PROJ:
                key = (f"transformer.blocks.{i}.{attn}.{proj}"
                       f"{'.0' if proj == 'to_out' else ''}")
                delta = (back[f"{key}.lora_B.weight"] @ back[f"{key}.lora_A.weight"]).T
                want = (np.asarray(merged["blocks"][i][attn][proj]["kernel"])
                        - np.asarray(base["blocks"][i][attn][proj]["kernel"]))
                np.testing.assert_allclose(delta, want, rtol=1e-5, atol=1e-6)
    assert len(back) == 2 * len(lora)
    # the scanned model's adapters (each stacked over the blocks) export the same file
    scanned, _ = convert.from_diffusers(FIXTURE / "wan", scan_blocks=True)
    stacked_lora = lora_lib.init_lora(nnx.split(scanned)[1], 4, jax.random.key(0))
    for path in stacked_lora:
        per_block = [lora[path.replace("['blocks']", f"['blocks'][{i}]")]
                     for i in range(cfg.num_layers)]
        stacked_lora[path] = {k: jnp.stack([ad[k] for ad in per_block]) for k in ("a", "b")}
    again = lora_export.to_diffusers(stacked_lora, scale)
    assert again.keys() == back.keys()
    for k in back:
        np.testing.assert_array_equal(again[k], back[k])


def test_wan_lora_in_diffusers_equals_our_merged_model(tmp_path):
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    pytest.importorskip("peft")
    theirs = diffusers.WanTransformer3DModel.from_pretrained(FIXTURE / "wan").eval()
    model, _ = convert.from_diffusers(FIXTURE / "wan")
    graphdef, state = nnx.split(model)
    lora, scale = _lora(state), 2.0
    tensors = lora_export.export(lora, scale, tmp_path / "lora.safetensors", rank=4)
    merged = nnx.merge(graphdef, lora_lib.merge(state, lora, scale))
    ref = np.load(FIXTURE / "wan.npz")
    x, t, text = ref["odd_x"], ref["odd_t"], ref["odd_text"]

    def diffusers_velocity():
        with torch.no_grad():
            out = theirs(torch.from_numpy(x.transpose(0, 4, 1, 2, 3)),
                         torch.from_numpy(np.float32(1000.0) * t), torch.from_numpy(text),
                         return_dict=False)[0].numpy()
        return out.transpose(0, 2, 3, 4, 1)

    before = diffusers_velocity()
    theirs.load_lora_adapter({k: torch.from_numpy(v) for k, v in tensors.items()},
                             prefix="transformer", adapter_name="ours")
    want = diffusers_velocity()
    with jax.default_matmul_precision("highest"):
        got = np.asarray(merged(jnp.asarray(x), jnp.asarray(t), jnp.asarray(text)))
    assert np.abs(want - before).max() > 1e-2           # the adapter changed diffusers' output
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
