"""Qwen-Image (diffusers ``QwenImageTransformer2DModel``) as a config of our MMDiT.

What maps where: 3-axis RoPE on q/k after QK-norm (``pos_embed='rope3d'``, ``axes_dims_rope``;
centred image positions, text positions after the image's, as diffusers derives them),
``txt_norm`` RMSNorm before ``txt_in`` (``text_norm``), timestep-only conditioning
(``pooled='none'``, diffusers scales ``t * freq`` by 1000: ``timestep_scaling='after_freqs'``),
every block dual-stream with a text key mask, packed 2x2 latents ``(c, py, px)`` (permuted into
our patch order at conversion, so the model takes unpacked ``[B, H, W, C]`` latents), and
``norm_out`` (scale, shift) + ``proj_out``. The model is fed ``t`` = sigma, as the pipeline
does (it divides the scheduler's ``sigma * 1000`` by 1000).

Qwen-Image-Edit (and Edit Plus, -2509, -2511) is the same transformer called with the input
images' packed latents after the target's: a folder whose pipeline (``model_index.json`` beside
it) is an edit pipeline converts to ``reference_images`` > 0, and ``zero_cond_t``
(Qwen-Image-Edit-2511: reference tokens modulated as at t = 0) to ``reference_zero_t``.
"""
from __future__ import annotations

from spotlight_jax.models.convert import layout
from spotlight_jax.models.convert.diffusers_folder import CheckpointError
from spotlight_jax.models.mmdit import MMDiTConfig

CLASS_NAME = "QwenImageTransformer2DModel"

# config.json options of variants this converter does not reproduce, with their plain value
_UNSUPPORTED = {"guidance_embeds": False, "use_additional_t_cond": False,
                "use_layer3d_rope": False}
# edit pipelines (model_index.json's _class_name) and the most input images each passes
EDIT_PIPELINES = {"QwenImageEditPipeline": 1, "QwenImageEditInpaintPipeline": 1,
                  "QwenImageEditPlusPipeline": 3}


def model_config(config: dict, tensors: dict, source: str = "checkpoint") -> MMDiTConfig:
    """Our config of the diffusers ``config`` (its ``config.json``)."""
    for key, plain in _UNSUPPORTED.items():
        if config.get(key, plain) != plain:
            raise CheckpointError(f"{source}: {key}={config[key]!r} is not supported (a "
                                  f"layered Qwen-Image variant); convert Qwen-Image or "
                                  f"Qwen-Image-Edit")
    p = int(config.get("patch_size", 2))
    cin = int(config.get("in_channels", 64))
    cout = int(config.get("out_channels") or cin)
    if cin != cout * p * p:
        raise CheckpointError(f"{source}: in_channels={cin} is not out_channels * patch_size**2 "
                              f"= {cout * p * p} (packed {p}x{p} latents of {cout} channels)")
    zero_t = bool(config.get("zero_cond_t", False))
    # an edit pipeline beside the folder (transformer.pipeline_class), or -2511's zero_cond_t
    refs = EDIT_PIPELINES.get(config.get("_pipeline_class"), 3 if zero_t else 0)
    heads = int(config.get("num_attention_heads", 24))
    head_dim = int(config.get("attention_head_dim", 128))
    return MMDiTConfig(
        image_size=128, channels=cout, patch_size=p, width=heads * head_dim,
        depth=int(config.get("num_layers", 60)), num_heads=heads, mlp_ratio=4.0, qk_norm=True,
        text_width=0, text_embed_dim=int(config.get("joint_attention_dim", 3584)), text_len=512,
        pos_embed="rope3d", rope_axes=tuple(int(a) for a in config.get("axes_dims_rope",
                                                                        (16, 56, 56))),
        rope_theta=10_000.0, pooled="none", text_norm=True, timestep_scaling="after_freqs",
        timestep_freqs="rounded", reference_images=refs, reference_zero_t=zero_t)


def rules(cfg: MMDiTConfig) -> list[layout.Rule]:
    p, c = cfg.patch_size, cfg.channels
    out = [
        *layout.dense(("patch_embed",), "img_in", kernel_op=layout.PackedIn(p, c)),
        layout.Rule(("text_norm", "scale"), ("txt_norm.weight",)),
        *layout.dense(("text_proj",), "txt_in"),
        *layout.dense(("t_fc1",), "time_text_embed.timestep_embedder.linear_1"),
        *layout.dense(("t_fc2",), "time_text_embed.timestep_embedder.linear_2"),
        *layout.dense(("final_mod",), "norm_out.linear",
                      kernel_op=layout.SwapHalves(layout.Linear()), bias_op=layout.SwapHalves()),
        *layout.dense(("final",), "proj_out", kernel_op=layout.PackedOut(p, c),
                      bias_op=layout.PackedOutBias(p, c)),
    ]
    for i in range(cfg.depth):
        blk, src = ("blocks", i), f"transformer_blocks.{i}"
        a = f"{src}.attn"
        for stream, mod, mlp, qkv, proj, qn, kn in (
                ("img", "img_mod.1", "img_mlp", ("to_q", "to_k", "to_v"), "to_out.0",
                 "norm_q", "norm_k"),
                ("txt", "txt_mod.1", "txt_mlp", ("add_q_proj", "add_k_proj", "add_v_proj"),
                 "to_add_out", "norm_added_q", "norm_added_k")):
            s = blk + (stream,)
            out += [*layout.dense(s + ("mod",), f"{src}.{mod}"),
                    *layout.dense(s + ("qkv",), tuple(f"{a}.{n}" for n in qkv)),
                    *layout.dense(s + ("out",), f"{a}.{proj}"),
                    *layout.dense(s + ("fc1",), f"{src}.{mlp}.net.0.proj"),
                    *layout.dense(s + ("fc2",), f"{src}.{mlp}.net.2"),
                    layout.Rule(s + ("q_norm", "scale"), (f"{a}.{qn}.weight",)),
                    layout.Rule(s + ("k_norm", "scale"), (f"{a}.{kn}.weight",))]
    return out


def check(tensors: dict, cfg: MMDiTConfig, source: str = "checkpoint") -> None:
    """Nothing beyond the rules: Qwen-Image stores no computed tables."""


CHECKED: tuple[str, ...] = ()
