"""Export a post-trained LoRA to the PEFT / diffusers LoRA format.

Our adapters (``rl.lora``) sit on the fused projections of each dual-stream block: ``qkv``
``[in, 3d]`` and ``out`` ``[d, d]`` of the image stream (``img``), the text stream (``txt``) and
SD3.5's image-only second attention (``img.attn2``). diffusers keeps q, k and v as three Linear
layers, so a fused adapter ``W + s a b`` becomes three adapters that share ``lora_A = a^T`` and
take their thirds of ``lora_B = (s b)^T``; the scale ``s = alpha / rank`` is folded into
``lora_B`` and no alpha is written, so a loader's default ``lora_alpha = rank`` applies them
exactly. Module names are diffusers' attention names, the same for SD3/SD3.5, Qwen-Image,
FLUX.1 and FLUX.2 (``transformer_blocks.{i}.attn.to_q``, ``add_q_proj``, ``to_out.0``,
``to_add_out``, ``attn2.*``), prefixed ``transformer.`` as ``pipeline.load_lora_weights``
expects. The single-stream blocks differ: FLUX.1's become
``single_transformer_blocks.{i}.attn.to_q/to_k/to_v`` and ``proj_out``; FLUX.2's (``model=`` a
``Flux2Config``: their paths are FLUX.1's) become ``attn.to_qkv_mlp_proj``, the Linear that
diffusers fuses with the MLP input (our ``qkv`` and ``fc1`` hold its rows), with our ``a`` as
its ``lora_A`` and its ``lora_B`` zero on the MLP rows, and ``attn.to_out`` over [attention;
MLP]. The Wan transformer's adapters sit on its unfused ``to_q/to_k/to_v/to_out`` of ``attn1``
(self) and ``attn2`` (cross) and keep diffusers' names (``blocks.{i}.attn1.to_q``,
``...to_out.0``); Z-Image's on ``to_q/to_k/to_v/to_out`` of its ``layers`` and
``noise_refiner`` become ``layers.{i}.attention.to_q``, ``...attention.to_out.0``. None of
these kernels is permuted by the converters (only the patch embedding and output are), so each
exports as it is.
"""
from __future__ import annotations

import json
import re

import numpy as np

from spotlight_jax.io import safetensors_format
from spotlight_jax.models.flux2_transformer import Flux2Config

# (stream path inside a block, projection) -> diffusers module names under transformer_blocks.{i}
_MODULES = {
    ("img", "qkv"): ("attn.to_q", "attn.to_k", "attn.to_v"),
    ("img", "out"): ("attn.to_out.0",),
    ("txt", "qkv"): ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    ("txt", "out"): ("attn.to_add_out",),
    ("img.attn2", "qkv"): ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
    ("img.attn2", "out"): ("attn2.to_out.0",),
    ("", "qkv"): ("attn.to_q", "attn.to_k", "attn.to_v"),     # FLUX.1's single-stream blocks
    ("", "out"): ("proj_out",),
}
# FLUX.2's single-stream blocks: q/k/v are the first rows of the fused [q; k; v; MLP input]
_FLUX2_QKV_MLP, _FLUX2_SINGLE_OUT = "attn.to_qkv_mlp_proj", "attn.to_out"
_STACKS = {"blocks": "transformer_blocks", "single_blocks": "single_transformer_blocks"}
_PATH = re.compile(r"^\['(blocks|single_blocks)'\](?:\[(\d+)\])?((?:\['\w+'\])*)"
                   r"\['(qkv|out)'\]\['kernel'\]$")


_WAN_PATH = re.compile(r"^\['blocks'\](?:\[(\d+)\])?\['(attn1|attn2)'\]"
                       r"\['(to_q|to_k|to_v|to_out)'\]\['kernel'\]$")
_Z_IMAGE_PATH = re.compile(r"^\['(layers|noise_refiner)'\](?:\[(\d+)\])?"
                           r"\['(to_q|to_k|to_v|to_out)'\]\['kernel'\]$")


def _index(group: str | None) -> int | None:
    return None if group is None else int(group)


def _unfused(proj: str) -> str:
    """diffusers' name of an unfused projection (its output Linear is ``to_out[0]``)."""
    return proj + (".0" if proj == "to_out" else "")


def _parse(path: str, model=None):
    """``(diffusers block list, block index or None for stacked blocks, modules)`` of an
    adapter key; ``modules``: ``(name, rows)`` per diffusers Linear it becomes, each taking the
    next equal share of our output columns (``rows`` None), or all of them as the first rows of
    its ``rows`` outputs (the rest zero)."""
    wan = _WAN_PATH.match(path)
    if wan is not None:
        index, attn, proj = wan.groups()
        return "blocks", _index(index), ((f"{attn}.{_unfused(proj)}", None),)
    z_image = _Z_IMAGE_PATH.match(path)
    if z_image is not None:
        stack, index, proj = z_image.groups()
        return stack, _index(index), ((f"attention.{_unfused(proj)}", None),)
    m = _PATH.match(path)
    if m is None:
        raise ValueError(f"LoRA adapter {path!r} is not on a block's qkv/out projection; "
                         "only those export to the diffusers format")
    stack, index, proj = m.group(1), m.group(2), m.group(4)
    stream = ".".join(re.findall(r"\['(\w+)'\]", m.group(3)))
    if (stream, proj) not in _MODULES or (stream == "") != (stack == "single_blocks"):
        raise ValueError(f"LoRA adapter {path!r}: no diffusers module for stream {stream!r}")
    if stream == "" and isinstance(model, Flux2Config):
        modules = (((_FLUX2_QKV_MLP, 3 * model.dim + 2 * model.mlp_hidden),) if proj == "qkv"
                   else ((_FLUX2_SINGLE_OUT, None),))
    else:
        modules = tuple((name, None) for name in _MODULES[(stream, proj)])
    return _STACKS[stack], _index(index), modules


def to_diffusers(lora: dict, scale: float, prefix: str = "transformer", *,
                 model=None) -> dict[str, np.ndarray]:
    """The PEFT state dict (float32 numpy) of ``lora`` (``rl.lora.init_lora``'s pytree, trained)
    merged at ``scale`` (``lora_alpha / lora_rank``): ``{prefix}.<block list>.{i}.<module>
    .lora_A.weight [r, in]`` and ``.lora_B.weight [out, r]``. ``model``: the adapted model's
    config, needed for FLUX.2 (a ``Flux2Config``), whose adapter paths are FLUX.1's but whose
    single-stream modules are not; the other families are told apart by their paths."""
    out = {}
    for path, ad in sorted(lora.items()):
        blocks, index, modules = _parse(path, model)
        a = np.asarray(ad["a"], np.float32)
        b = np.asarray(ad["b"], np.float32) * np.float32(scale)
        if index is None:                          # stacked blocks: one leading axis per block
            pairs = [(i, a[i], b[i]) for i in range(a.shape[0])]
        else:
            pairs = [(index, a, b)]
        shares = sum(rows is None for _, rows in modules)
        for i, ai, bi in pairs:
            # fused [q | k | v] along the output: each unpadded module takes its share
            parts = iter(np.split(bi, shares, axis=-1) if shares else ())
            for name, rows in modules:
                bpart = next(parts) if rows is None else _pad_outputs(bi, rows, path)
                key = f"{prefix}.{blocks}.{i}.{name}"
                out[f"{key}.lora_A.weight"] = np.ascontiguousarray(ai.T)
                out[f"{key}.lora_B.weight"] = np.ascontiguousarray(bpart.T)
    return out


def _pad_outputs(b: np.ndarray, rows: int, path: str) -> np.ndarray:
    """``b [r, n]`` as the first ``n`` of ``rows`` outputs, the others zero (the adapter leaves
    them alone)."""
    if b.shape[-1] > rows:
        raise ValueError(f"LoRA adapter {path!r}: {b.shape[-1]} outputs do not fit the "
                         f"diffusers module's {rows} (adapters of another model config?)")
    return np.concatenate([b, np.zeros(b.shape[:-1] + (rows - b.shape[-1],), b.dtype)], -1)


def export(lora: dict, scale: float, path, *, rank: int, base: str = "", model=None) -> dict:
    """Writes ``to_diffusers(lora, scale, model=model)`` to ``path`` (safetensors) with metadata
    naming the format, rank and base model; returns the state dict written."""
    tensors = to_diffusers(lora, scale, model=model)
    meta = {"format": "pt", "spotlight_jax": json.dumps({"rank": int(rank), "base": base,
                                                         "scale_folded_into_lora_B": True})}
    safetensors_format.save(path, tensors, meta)
    return tensors
