"""FLUX.1 [dev] and [schnell] (diffusers ``FluxTransformer2DModel``) as a config of our MMDiT.

What maps where: packed 2x2 latents ``(c, py, px)`` (the transformer's ``patch_size`` is 1; the
pipeline packs, so ``in_channels`` is 4 x the latent's channels; permuted into our patch order at
conversion, so the model takes unpacked ``[B, H, W, C]`` latents), the dual-stream
``transformer_blocks`` (SD3's layout with QK-norm on both streams and no pre-only last block),
the ``single_transformer_blocks`` (``single_blocks``: ``norm.linear`` (shift, scale, gate), q/k/v
with QK-norm, ``proj_mlp``, ``proj_out`` over [attention; MLP]), the pooled CLIP embedding
through ``time_text_embed.text_embedder`` (``pooled='input'``), [dev]'s
``time_text_embed.guidance_embedder`` (``guidance_embed``: the guidance scale x 1000 embedded
as the timestep is), 3-axis RoPE on q/k after QK-norm with Flux's positions (image patches at
(0, row, col), text at the origin: ``pos_embed='rope3d_flux'``), no text mask, and
``norm_out`` (scale, shift) + ``proj_out``. The model is fed ``t`` = sigma (diffusers'
``timestep * 1000`` happens inside).
"""
from __future__ import annotations

from spotlight_jax.models.convert import layout
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.mmdit import MMDiTConfig

CLASS_NAME = "FluxTransformer2DModel"
CHECKED: tuple[str, ...] = ()
PACK = 2        # FluxPipeline packs 2x2 latent patches into the transformer's tokens


def model_config(config: dict, tensors: dict, source: str = "checkpoint") -> MMDiTConfig:
    """Our config of the diffusers ``config`` (its ``config.json``)."""
    if int(config.get("patch_size", 1)) != 1:
        raise CheckpointError(f"{source}: patch_size={config['patch_size']!r}: Flux's "
                              f"transformer takes packed 2x2 latents with patch_size=1")
    cin = int(config.get("in_channels", 64))
    cout = int(config.get("out_channels") or cin)
    if cin != cout or cin % (PACK * PACK):
        raise CheckpointError(f"{source}: in_channels={cin}, out_channels={cout}: Flux packs "
                              f"{PACK}x{PACK} patches of the latent's channels into both, so "
                              f"they must be equal and a multiple of {PACK * PACK}")
    heads = int(config.get("num_attention_heads", 24))
    head_dim = int(config.get("attention_head_dim", 128))
    return MMDiTConfig(
        image_size=128, channels=cin // (PACK * PACK), patch_size=PACK, width=heads * head_dim,
        depth=int(config.get("num_layers", 19)),
        single_blocks=int(config.get("num_single_layers", 38)), num_heads=heads,
        mlp_ratio=4.0, qk_norm=True, text_width=0,
        text_embed_dim=int(config.get("joint_attention_dim", 4096)), text_len=512,
        pos_embed="rope3d_flux",
        rope_axes=tuple(int(a) for a in config.get("axes_dims_rope", (16, 56, 56))),
        rope_theta=10_000.0, pooled="input",
        pooled_dim=int(config.get("pooled_projection_dim", 768)),
        guidance_embed=bool(config.get("guidance_embeds", False)), use_text_mask=False,
        timestep_freqs="rounded")


def rules(cfg: MMDiTConfig) -> list[layout.Rule]:
    p, c = cfg.patch_size, cfg.channels
    tt = "time_text_embed"
    out = [
        *layout.dense(("patch_embed",), "x_embedder", kernel_op=layout.PackedIn(p, c)),
        *layout.dense(("t_fc1",), f"{tt}.timestep_embedder.linear_1"),
        *layout.dense(("t_fc2",), f"{tt}.timestep_embedder.linear_2"),
        *layout.dense(("pool_fc1",), f"{tt}.text_embedder.linear_1"),
        *layout.dense(("pool_fc2",), f"{tt}.text_embedder.linear_2"),
        *layout.dense(("text_proj",), "context_embedder"),
        *layout.dense(("final_mod",), "norm_out.linear",
                      kernel_op=layout.SwapHalves(layout.Linear()), bias_op=layout.SwapHalves()),
        *layout.dense(("final",), "proj_out", kernel_op=layout.PackedOut(p, c),
                      bias_op=layout.PackedOutBias(p, c)),
    ]
    if cfg.guidance_embed:
        out += [*layout.dense(("g_fc1",), f"{tt}.guidance_embedder.linear_1"),
                *layout.dense(("g_fc2",), f"{tt}.guidance_embedder.linear_2")]
    for i in range(cfg.depth):
        blk, src = ("blocks", i), f"transformer_blocks.{i}"
        a = f"{src}.attn"
        for stream, norm, qkv, proj, ff, qn, kn in (
                ("img", "norm1", ("to_q", "to_k", "to_v"), "to_out.0", "ff", "norm_q",
                 "norm_k"),
                ("txt", "norm1_context", ("add_q_proj", "add_k_proj", "add_v_proj"),
                 "to_add_out", "ff_context", "norm_added_q", "norm_added_k")):
            s = blk + (stream,)
            out += [*layout.dense(s + ("mod",), f"{src}.{norm}.linear"),
                    *layout.dense(s + ("qkv",), tuple(f"{a}.{n}" for n in qkv)),
                    *layout.dense(s + ("out",), f"{a}.{proj}"),
                    *layout.dense(s + ("fc1",), f"{src}.{ff}.net.0.proj"),
                    *layout.dense(s + ("fc2",), f"{src}.{ff}.net.2"),
                    layout.Rule(s + ("q_norm", "scale"), (f"{a}.{qn}.weight",)),
                    layout.Rule(s + ("k_norm", "scale"), (f"{a}.{kn}.weight",))]
    for i in range(cfg.single_blocks):
        blk, src = ("single_blocks", i), f"single_transformer_blocks.{i}"
        a = f"{src}.attn"
        out += [*layout.dense(blk + ("mod",), f"{src}.norm.linear"),
                *layout.dense(blk + ("qkv",), (f"{a}.to_q", f"{a}.to_k", f"{a}.to_v")),
                *layout.dense(blk + ("fc1",), f"{src}.proj_mlp"),
                *layout.dense(blk + ("out",), f"{src}.proj_out"),
                layout.Rule(blk + ("q_norm", "scale"), (f"{a}.norm_q.weight",)),
                layout.Rule(blk + ("k_norm", "scale"), (f"{a}.norm_k.weight",))]
    return out


def check(tensors: dict, cfg: MMDiTConfig, source: str = "checkpoint") -> None:
    """Nothing beyond the rules: Flux stores no computed tables."""
