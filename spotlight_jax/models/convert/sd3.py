"""SD3 / SD3.5 (diffusers ``SD3Transformer2DModel``) as a config of our MMDiT.

What maps where: the conv patch embedding (a Dense over our patch order), the stored 2-D
sin-cos table ``pos_embed.pos_embed`` (``pos_embed='sd3_table'``: recomputed and centre cropped
at run time, never a parameter; checked here against the stored one, and rounded through its
stored dtype as diffusers adds it), the pooled text input through ``time_text_embed.
text_embedder`` (``pooled='input'``), no text mask (``use_text_mask=False``), the last block's
``context_pre_only`` text stream (``context_pre_only_last``: only its (scale, shift) norm and
q/k/v projections exist), SD3.5's ``dual_attention_layers`` (``attn2`` and the 9-way
``SD35AdaLayerNormZeroX`` modulation), optional ``qk_norm='rms_norm'`` and the final norm's
(scale, shift) order. The model is fed ``t`` = sigma; diffusers' ``sigma * 1000`` happens
inside (``timestep_embedding`` scales by 1000).
"""
from __future__ import annotations

import numpy as np

from spotlight_jax.models.convert import layout
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.layers import sd3_sincos_rows
from spotlight_jax.models.mmdit import MMDiTConfig

CLASS_NAME = "SD3Transformer2DModel"
CHECKED = ("pos_embed.pos_embed",)
# how far the stored table may sit from ours, per stored dtype (values are in [-1, 1])
_TABLE_ATOL = {"float32": 1e-5, "bfloat16": 8e-3, "float16": 1e-3}


def model_config(config: dict, tensors: dict, source: str = "checkpoint") -> MMDiTConfig:
    """Our config of the diffusers ``config`` (its ``config.json``)."""
    heads = int(config.get("num_attention_heads", 18))
    d = heads * int(config.get("attention_head_dim", 64))
    p = int(config.get("patch_size", 2))
    cin = int(config.get("in_channels", 16))
    cout = int(config.get("out_channels") or cin)
    caption = int(config.get("caption_projection_dim", 1152))
    if cout != cin:
        raise CheckpointError(f"{source}: out_channels={cout} differs from in_channels={cin}; "
                              f"the velocity has the latent's channels")
    if caption != d:
        raise CheckpointError(f"{source}: caption_projection_dim={caption} differs from the "
                              f"width num_attention_heads * attention_head_dim = {d}")
    qk_norm = config.get("qk_norm")
    if qk_norm not in (None, "rms_norm"):
        raise CheckpointError(f"{source}: qk_norm={qk_norm!r} is not supported (None or "
                              f"'rms_norm', as SD3 and SD3.5 use)")
    max_size = config.get("pos_embed_max_size", 96)
    if not max_size:
        raise CheckpointError(f"{source}: pos_embed_max_size={max_size!r}: SD3 needs its stored "
                              f"position table (e.g. 96 or 192)")
    sample = int(config.get("sample_size", 128))
    table = tensors.get(CHECKED[0])
    table_dtype = np.dtype(table.dtype).name if table is not None else "float32"
    return MMDiTConfig(
        image_size=sample, channels=cin, patch_size=p, width=d,
        depth=int(config.get("num_layers", 18)), num_heads=heads, mlp_ratio=4.0,
        qk_norm=qk_norm == "rms_norm", text_width=0,
        text_embed_dim=int(config.get("joint_attention_dim", 4096)), text_len=333,
        pos_embed="sd3_table", pos_embed_max_size=int(max_size),
        pos_embed_base_size=sample // p,
        pos_embed_dtype=table_dtype if table_dtype in _TABLE_ATOL else "float32",
        pooled="input", pooled_dim=int(config.get("pooled_projection_dim", 2048)),
        use_text_mask=False, context_pre_only_last=True, timestep_freqs="rounded",
        dual_attention_layers=tuple(int(i) for i in config.get("dual_attention_layers", ())))


def rules(cfg: MMDiTConfig) -> list[layout.Rule]:
    p, c = cfg.patch_size, cfg.channels
    tt = "time_text_embed"
    out = [
        *layout.dense(("patch_embed",), "pos_embed.proj", kernel_op=layout.ConvPatch(p, c)),
        *layout.dense(("t_fc1",), f"{tt}.timestep_embedder.linear_1"),
        *layout.dense(("t_fc2",), f"{tt}.timestep_embedder.linear_2"),
        *layout.dense(("pool_fc1",), f"{tt}.text_embedder.linear_1"),
        *layout.dense(("pool_fc2",), f"{tt}.text_embedder.linear_2"),
        *layout.dense(("text_proj",), "context_embedder"),
        *layout.dense(("final_mod",), "norm_out.linear",
                      kernel_op=layout.SwapHalves(layout.Linear()), bias_op=layout.SwapHalves()),
        *layout.dense(("final",), "proj_out"),
    ]
    swap = dict(kernel_op=layout.SwapHalves(layout.Linear()), bias_op=layout.SwapHalves())
    for i in range(cfg.depth):
        blk, src = ("blocks", i), f"transformer_blocks.{i}"
        a = f"{src}.attn"
        pre_only = cfg.context_pre_only_last and i == cfg.depth - 1
        img, txt = blk + ("img",), blk + ("txt",)
        out += [*layout.dense(img + ("mod",), f"{src}.norm1.linear"),
                *layout.dense(img + ("qkv",), (f"{a}.to_q", f"{a}.to_k", f"{a}.to_v")),
                *layout.dense(img + ("out",), f"{a}.to_out.0"),
                *layout.dense(img + ("fc1",), f"{src}.ff.net.0.proj"),
                *layout.dense(img + ("fc2",), f"{src}.ff.net.2"),
                *layout.dense(txt + ("mod",), f"{src}.norm1_context.linear",
                              **(swap if pre_only else {})),
                *layout.dense(txt + ("qkv",), (f"{a}.add_q_proj", f"{a}.add_k_proj",
                                               f"{a}.add_v_proj"))]
        if not pre_only:
            out += [*layout.dense(txt + ("out",), f"{a}.to_add_out"),
                    *layout.dense(txt + ("fc1",), f"{src}.ff_context.net.0.proj"),
                    *layout.dense(txt + ("fc2",), f"{src}.ff_context.net.2")]
        norms = [(img, a, "norm_q", "norm_k"), (txt, a, "norm_added_q", "norm_added_k")]
        if i in cfg.dual_attention_layers:
            a2 = f"{src}.attn2"
            out += [*layout.dense(img + ("attn2", "qkv"),
                                  (f"{a2}.to_q", f"{a2}.to_k", f"{a2}.to_v")),
                    *layout.dense(img + ("attn2", "out"), f"{a2}.to_out.0")]
            norms.append((img + ("attn2",), a2, "norm_q", "norm_k"))
        if cfg.qk_norm:
            for ours, theirs, qn, kn in norms:
                out += [layout.Rule(ours + ("q_norm", "scale"), (f"{theirs}.{qn}.weight",)),
                        layout.Rule(ours + ("k_norm", "scale"), (f"{theirs}.{kn}.weight",))]
    return out


def check(tensors: dict, cfg: MMDiTConfig, source: str = "checkpoint") -> None:
    """The stored position table equals the one the model recomputes (in row blocks, so the
    full table, 900 MB in float32 for SD3.5 medium, is never built twice)."""
    name = CHECKED[0]
    if name not in tensors:
        raise CheckpointError(f"{source}: missing tensor {name!r} (SD3's position table)")
    g, d = cfg.pos_embed_max_size, cfg.width
    stored = tensors[name]
    if tuple(stored.shape) != (1, g * g, d):
        raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(stored.shape)}, "
                              f"expected {(1, g * g, d)} (pos_embed_max_size={g}, width={d})")
    atol = _TABLE_ATOL.get(cfg.pos_embed_dtype, 1e-5)
    step = max(1, 4096 // g)
    for r0 in range(0, g, step):
        rows = np.arange(r0, min(r0 + step, g))
        ours = sd3_sincos_rows(rows, np.arange(g), d, g, cfg.pos_embed_base_size)
        theirs = np.asarray(stored[0, r0 * g:(r0 + len(rows)) * g], np.float32)
        err = float(np.abs(ours - theirs).max())
        if err > atol:
            raise CheckpointError(f"{source}: {name!r} differs from the sin-cos table "
                                  f"recomputed with base_size={cfg.pos_embed_base_size} "
                                  f"(sample_size // patch_size) by {err:.3g} at grid rows "
                                  f"{r0}..{rows[-1]}; this checkpoint's table is not "
                                  f"diffusers' PatchEmbed table")
