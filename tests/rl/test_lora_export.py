"""LoRA export to the PEFT/diffusers format: every adapted projection becomes diffusers' modules
(q/k/v split of the fused projection, text stream -> add_*_proj / to_add_out, SD3.5's attn2), and
the deltas ``lora_B @ lora_A`` of the written file equal what our merge adds to each slice of the
fused kernels. Where diffusers is installed, ``test_convert_transformer``-style live checks load
the file into a diffusers model (tests/models/test_lora_diffusers.py)."""
import jax
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.io import safetensors_format
from spotlight_jax.models import MMDiTConfig
from spotlight_jax.models.factory import create_model
from spotlight_jax.rl import lora as lora_lib
from spotlight_jax.rl import lora_export

CFG = MMDiTConfig(image_size=8, channels=4, patch_size=2, width=32, depth=3, num_heads=2,
                  text_width=0, text_embed_dim=16, text_len=4, pooled="input", pooled_dim=8,
                  context_pre_only_last=True, dual_attention_layers=(0,), use_text_mask=False)


def _trained_lora(state, rank=4):
    lora = lora_lib.init_lora(state, rank, jax.random.key(1))
    keys = jax.random.split(jax.random.key(2), len(lora))
    return {p: {"a": ad["a"], "b": jax.random.normal(k, ad["b"].shape)}
            for k, (p, ad) in zip(keys, sorted(lora.items()))}


def test_exported_deltas_equal_the_merged_kernels(tmp_path):
    _, state = create_model(CFG)
    lora = _trained_lora(state)
    scale = 8.0 / 4
    merged = nnx.to_pure_dict(lora_lib.merge(state, lora, scale))
    base = nnx.to_pure_dict(state)
    tensors = lora_export.export(lora, scale, tmp_path / "lora.safetensors", rank=4)
    back = safetensors_format.load(tmp_path / "lora.safetensors")
    assert sorted(back) == sorted(tensors)
    d = CFG.width

    def delta(module):
        a = back[f"transformer.transformer_blocks.{module}.lora_A.weight"]
        b = back[f"transformer.transformer_blocks.{module}.lora_B.weight"]
        assert a.shape[0] == 4 and b.shape[1] == 4
        return (b @ a).T                                   # torch [out, in] -> our [in, out]

    def ours(i, *path):
        node_m, node_b = merged["blocks"][i], base["blocks"][i]
        for p in path:
            node_m, node_b = node_m[p], node_b[p]
        return np.asarray(node_m["kernel"]) - np.asarray(node_b["kernel"])

    checked = 0
    for i in range(CFG.depth):
        streams = [("img", ("attn.to_q", "attn.to_k", "attn.to_v"), "attn.to_out.0"),
                   ("txt", ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
                    None if i == CFG.depth - 1 else "attn.to_add_out")]
        if i in CFG.dual_attention_layers:
            streams.append(("img.attn2", ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
                            "attn2.to_out.0"))
        for stream, qkv, out in streams:
            path = stream.split(".")
            fused = ours(i, *path, "qkv")
            for j, name in enumerate(qkv):
                np.testing.assert_allclose(delta(f"{i}.{name}"), fused[:, j * d:(j + 1) * d],
                                           rtol=1e-5, atol=1e-6)
                checked += 1
            if out is not None:
                np.testing.assert_allclose(delta(f"{i}.{out}"), ours(i, *path, "out"),
                                           rtol=1e-5, atol=1e-6)
                checked += 1
    assert checked * 2 == len(back)          # every written tensor pair was checked once
    assert not any("to_add_out" in k for k in back if f".{CFG.depth - 1}.attn." in k)


def test_unknown_adapter_is_a_clear_error():
    with pytest.raises(ValueError, match="not on a block's qkv/out projection"):
        lora_export.to_diffusers({"['final']['kernel']": {"a": np.ones((2, 1)),
                                                           "b": np.ones((1, 2))}}, 1.0)
