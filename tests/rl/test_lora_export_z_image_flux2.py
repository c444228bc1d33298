"""Z-Image's and FLUX.2's LoRA targets and their export to the PEFT/diffusers format, offline
(no torch): which kernels are adapted (Z-Image: to_q/to_k/to_v/to_out of the main ``layers`` and
the ``noise_refiner``, not the ``context_refiner`` the prompt encoding runs; FLUX.2: the fused
qkv and out of both streams of every dual-stream block and of every single-stream block), and
every written ``lora_B @ lora_A`` equal to what our merge adds to that kernel: FLUX.2's
single-stream ``qkv`` as the first rows of diffusers' fused ``attn.to_qkv_mlp_proj`` (the MLP
rows zero). The scanned model's stacked adapters export the same file. Loading into diffusers
is checked in tests/models/test_lora_diffusers.py; the adapters' size is what the cost model
charges (``emulation.flops.lora_param_count``)."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from spotlight_jax.emulation import flops
from spotlight_jax.models import convert
from spotlight_jax.rl import lora as lora_lib
from spotlight_jax.rl import lora_export

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "diffusers" / "transformer"
SCALE = 2.0


def _lora(state, rank=4):
    lora = lora_lib.init_lora(state, rank, jax.random.key(0))
    keys = jax.random.split(jax.random.key(1), len(lora))
    return {p: {"a": ad["a"], "b": 0.3 * jax.random.normal(k, ad["b"].shape)}
            for k, (p, ad) in zip(keys, sorted(lora.items()))}


def _size(lora) -> int:
    return sum(int(np.size(x)) for ad in lora.values() for x in ad.values())


def _deltas(state, lora):
    """``{adapter path: merged - base kernel}`` (our ``[in, out]`` layout)."""
    def flat(st):
        return {jax.tree_util.keystr(p): np.asarray(w)
                for p, w in jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(st))}

    merged, base = flat(lora_lib.merge(state, lora, SCALE)), flat(state)
    return {k: merged[k] - base[k] for k in lora}


def _written(back, module):
    """A written module's delta ``(lora_B @ lora_A)^T`` in our layout."""
    return (back[f"{module}.lora_B.weight"] @ back[f"{module}.lora_A.weight"]).T


def _stacked(scanned_state, lora, n_of):
    """The scanned model's adapters holding ``lora``'s per-block ones stacked (``n_of(stack)``
    blocks per stack)."""
    stacked = lora_lib.init_lora(scanned_state, 4, jax.random.key(0))
    for path in stacked:
        stack = path.split("']")[0][2:]
        per_block = [lora[path.replace(f"['{stack}']", f"['{stack}'][{i}]", 1)]
                     for i in range(n_of(stack))]
        stacked[path] = {k: jnp.stack([ad[k] for ad in per_block]) for k in ("a", "b")}
    return stacked


def test_z_image_targets_and_export(tmp_path):
    model, cfg = convert.from_diffusers(FIXTURE / "z_image")
    _, state = nnx.split(model)
    lora = _lora(state)
    proj = ("to_q", "to_k", "to_v", "to_out")
    blocks = [("layers", i) for i in range(cfg.n_layers)] + \
        [("noise_refiner", i) for i in range(cfg.n_refiner_layers)]
    assert sorted(lora) == sorted(f"['{g}'][{i}]['{p}']['kernel']" for g, i in blocks
                                  for p in proj)
    assert len(lora) == 12 and not any("context_refiner" in k for k in lora)
    assert _size(lora) == flops.lora_param_count(cfg, 4)      # what the cost model charges
    back = lora_export.export(lora, SCALE, tmp_path / "lora.safetensors", rank=4)
    assert len(back) == 2 * len(lora)
    deltas = _deltas(state, lora)
    for g, i in blocks:
        for p in proj:
            module = f"transformer.{g}.{i}.attention.{p}{'.0' if p == 'to_out' else ''}"
            np.testing.assert_allclose(_written(back, module),
                                       deltas[f"['{g}'][{i}]['{p}']['kernel']"],
                                       rtol=1e-5, atol=1e-6)
    scanned, _ = convert.from_diffusers(FIXTURE / "z_image", scan_blocks=True)
    n = {"layers": cfg.n_layers, "noise_refiner": cfg.n_refiner_layers}
    again = lora_export.to_diffusers(_stacked(nnx.split(scanned)[1], lora, n.__getitem__),
                                     SCALE)
    assert again.keys() == back.keys()
    for k in back:
        np.testing.assert_array_equal(again[k], back[k])


@pytest.mark.parametrize("name", ["flux2_dev", "flux2_klein"])
def test_flux2_targets_and_export(tmp_path, name):
    model, cfg = convert.from_diffusers(FIXTURE / name)
    _, state = nnx.split(model)
    lora = _lora(state)
    dual = [f"['blocks'][{i}]['{s}']['{p}']['kernel']" for i in range(cfg.num_layers)
            for s in ("img", "txt") for p in ("qkv", "out")]
    single = [f"['single_blocks'][{i}]['{p}']['kernel']" for i in range(cfg.num_single_layers)
              for p in ("qkv", "out")]
    assert sorted(lora) == sorted(dual + single) and len(lora) == 12
    assert _size(lora) == flops.lora_param_count(cfg, 4)      # what the cost model charges
    back = lora_export.export(lora, SCALE, tmp_path / "lora.safetensors", rank=4, model=cfg)
    deltas = _deltas(state, lora)
    d, h = cfg.dim, cfg.mlp_hidden
    checked = set()

    def check(module, want):
        np.testing.assert_allclose(_written(back, f"transformer.{module}"), want, rtol=1e-5,
                                   atol=1e-6)
        checked.add(module)

    for i in range(cfg.num_layers):
        for s, qkv, out in (("img", ("to_q", "to_k", "to_v"), "to_out.0"),
                            ("txt", ("add_q_proj", "add_k_proj", "add_v_proj"), "to_add_out")):
            fused = deltas[f"['blocks'][{i}]['{s}']['qkv']['kernel']"]
            for j, m in enumerate(qkv):
                check(f"transformer_blocks.{i}.attn.{m}", fused[:, j * d:(j + 1) * d])
            check(f"transformer_blocks.{i}.attn.{out}",
                  deltas[f"['blocks'][{i}]['{s}']['out']['kernel']"])
    for i in range(cfg.num_single_layers):
        # q/k/v then the MLP input's 2h rows (zero: the adapter leaves the MLP alone)
        qkv = deltas[f"['single_blocks'][{i}]['qkv']['kernel']"]
        check(f"single_transformer_blocks.{i}.attn.to_qkv_mlp_proj",
              np.concatenate([qkv, np.zeros((d, 2 * h), np.float32)], axis=1))
        assert not back[f"transformer.single_transformer_blocks.{i}.attn.to_qkv_mlp_proj"
                        ".lora_B.weight"][3 * d:].any()
        check(f"single_transformer_blocks.{i}.attn.to_out",
              deltas[f"['single_blocks'][{i}]['out']['kernel']"])
    assert 2 * len(checked) == len(back)        # every written pair checked once
    scanned, _ = convert.from_diffusers(FIXTURE / name, scan_blocks=True)
    n = {"blocks": cfg.num_layers, "single_blocks": cfg.num_single_layers}
    again = lora_export.to_diffusers(_stacked(nnx.split(scanned)[1], lora, n.__getitem__),
                                     SCALE, model=cfg)
    assert again.keys() == back.keys()
    for k in back:
        np.testing.assert_array_equal(again[k], back[k])


def test_flux2_adapters_of_another_config_are_a_clear_error():
    _, cfg = convert.from_diffusers(FIXTURE / "flux2_klein")
    wide = {"['single_blocks'][0]['qkv']['kernel']": {"a": np.ones((32, 2)),
                                                      "b": np.ones((2, 3 * 32 + 2 * 96 + 1))}}
    with pytest.raises(ValueError, match=r"do not fit the diffusers module's 288"):
        lora_export.to_diffusers(wide, 1.0, model=cfg)
