"""Export a post-trained LoRA to the PEFT / diffusers LoRA format.

Our adapters (``rl.lora``) sit on the fused projections of each dual-stream block: ``qkv``
``[in, 3d]`` and ``out`` ``[d, d]`` of the image stream (``img``), the text stream (``txt``) and
SD3.5's image-only second attention (``img.attn2``). diffusers keeps q, k and v as three Linear
layers, so a fused adapter ``W + s a b`` becomes three adapters that share ``lora_A = a^T`` and
take their thirds of ``lora_B = (s b)^T``; the scale ``s = alpha / rank`` is folded into
``lora_B`` and no alpha is written, so a loader's default ``lora_alpha = rank`` applies them
exactly. Module names are diffusers' attention names, the same for SD3/SD3.5 and Qwen-Image
(``transformer_blocks.{i}.attn.to_q``, ``add_q_proj``, ``to_out.0``, ``to_add_out``,
``attn2.*``), and Flux's single-stream blocks (``single_transformer_blocks.{i}.attn.to_q``,
``proj_out``), prefixed ``transformer.`` as ``pipeline.load_lora_weights`` expects. The Wan
transformer's adapters sit on its unfused ``to_q/to_k/to_v/to_out`` of ``attn1`` (self) and
``attn2`` (cross) and keep diffusers' names (``blocks.{i}.attn1.to_q``, ``...to_out.0``).
"""
from __future__ import annotations

import json
import re

import numpy as np

from spotlight_jax.io import safetensors_format

# (stream path inside a block, projection) -> diffusers module names under transformer_blocks.{i}
_MODULES = {
    ("img", "qkv"): ("attn.to_q", "attn.to_k", "attn.to_v"),
    ("img", "out"): ("attn.to_out.0",),
    ("txt", "qkv"): ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
    ("txt", "out"): ("attn.to_add_out",),
    ("img.attn2", "qkv"): ("attn2.to_q", "attn2.to_k", "attn2.to_v"),
    ("img.attn2", "out"): ("attn2.to_out.0",),
    ("", "qkv"): ("attn.to_q", "attn.to_k", "attn.to_v"),     # Flux's single-stream blocks
    ("", "out"): ("proj_out",),
}
_STACKS = {"blocks": "transformer_blocks", "single_blocks": "single_transformer_blocks"}
_PATH = re.compile(r"^\['(blocks|single_blocks)'\](?:\[(\d+)\])?((?:\['\w+'\])*)"
                   r"\['(qkv|out)'\]\['kernel'\]$")


_WAN_PATH = re.compile(r"^\['blocks'\](?:\[(\d+)\])?\['(attn1|attn2)'\]"
                       r"\['(to_q|to_k|to_v|to_out)'\]\['kernel'\]$")


def _parse(path: str):
    """``(diffusers block list, block index or None for stacked blocks, stream path,
    projection)`` of an adapter key."""
    wan = _WAN_PATH.match(path)
    if wan is not None:         # (diffusers block list, index, stream, projection = module)
        attn, proj = wan.group(2), wan.group(3)
        return ("blocks", None if wan.group(1) is None else int(wan.group(1)), attn,
                proj + (".0" if proj == "to_out" else ""))
    m = _PATH.match(path)
    if m is None:
        raise ValueError(f"LoRA adapter {path!r} is not on a block's qkv/out projection; "
                         "only those export to the diffusers format")
    stack, index, proj = m.group(1), m.group(2), m.group(4)
    stream = ".".join(re.findall(r"\['(\w+)'\]", m.group(3)))
    if (stream, proj) not in _MODULES or (stream == "") != (stack == "single_blocks"):
        raise ValueError(f"LoRA adapter {path!r}: no diffusers module for stream {stream!r}")
    return _STACKS[stack], (None if index is None else int(index)), stream, proj


def to_diffusers(lora: dict, scale: float, prefix: str = "transformer") -> dict[str, np.ndarray]:
    """The PEFT state dict (float32 numpy) of ``lora`` (``rl.lora.init_lora``'s pytree, trained)
    merged at ``scale`` (``lora_alpha / lora_rank``): ``{prefix}.transformer_blocks.{i}.<module>
    .lora_A.weight [r, in]`` and ``.lora_B.weight [out, r]``."""
    out = {}
    for path, ad in sorted(lora.items()):
        blocks, index, stream, proj = _parse(path)
        a = np.asarray(ad["a"], np.float32)
        b = np.asarray(ad["b"], np.float32) * np.float32(scale)
        if index is None:                          # stacked blocks: one leading axis per block
            pairs = [(i, a[i], b[i]) for i in range(a.shape[0])]
        else:
            pairs = [(index, a, b)]
        modules = (_MODULES[(stream, proj)] if (stream, proj) in _MODULES
                   else (f"{stream}.{proj}",))            # the Wan transformer's own names
        for i, ai, bi in pairs:
            parts = np.split(bi, len(modules), axis=-1)   # fused [q | k | v] along the output
            for name, bpart in zip(modules, parts):
                key = f"{prefix}.{blocks}.{i}.{name}"
                out[f"{key}.lora_A.weight"] = np.ascontiguousarray(ai.T)
                out[f"{key}.lora_B.weight"] = np.ascontiguousarray(bpart.T)
    return out


def export(lora: dict, scale: float, path, *, rank: int, base: str = "") -> dict:
    """Writes ``to_diffusers(lora, scale)`` to ``path`` (safetensors) with metadata naming the
    format, rank and base model; returns the state dict written."""
    tensors = to_diffusers(lora, scale)
    meta = {"format": "pt", "spotlight_jax": json.dumps({"rank": int(rank), "base": base,
                                                         "scale_folded_into_lora_B": True})}
    safetensors_format.save(path, tensors, meta)
    return tensors
