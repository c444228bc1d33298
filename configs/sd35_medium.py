"""Stable Diffusion 3.5 Medium's transformer (2.5B MMDiT-X: 24 blocks, width 1536, 24 heads of 64).

The real architecture, as diffusers' ``SD3Transformer2DModel`` with the ``config.json`` of
``stabilityai/stable-diffusion-3.5-medium``: the stored 2-D sin-cos position table (384 x 384
patches, centre cropped), CLIP's pooled text through a two-layer SiLU MLP, no text mask, QK
RMSNorm, a second image-only attention in blocks 0-12, and a last block whose text stream only
feeds the keys and values (so blocks differ: no scan). Its weights load with
``spotlight_jax.models.convert.from_diffusers`` of the ``transformer`` folder, which gives this
model section. 512x512 images (Flow-GRPO's SD3.5-M setting) through the 16-channel VAE latent at
/8: 64x64 latent cells, patch 2 -> 1024 image tokens and 333 text tokens (77 CLIP + 256 T5);
bf16; weights FSDP-sharded; LoRA r=32 as Flow-GRPO.

Dry run on any machine (no parameters are allocated):
  python -m spotlight_jax.main --config=configs/sd35_medium.py --workdir=/tmp/sd35 --dry_run
"""
import pathlib
import runpy

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def get_config():
    c = _base["get_config"]()
    m = c.model
    m.image_size = 64             # latent cells (512 / 8)
    m.channels = 16               # VAE latent channels
    m.patch_size = 2
    m.width = 1536
    m.depth = 24
    m.num_heads = 24
    m.mlp_ratio = 4.0
    m.qk_norm = True
    m.text_width = 0              # precomputed CLIP-L/G + T5 embeddings
    m.text_embed_dim = 4096
    m.text_len = 333
    m.pos_embed = "sd3_table"
    m.pos_embed_max_size = 384
    m.pos_embed_base_size = 64    # diffusers' sample_size 128 // patch 2
    m.pos_embed_dtype = "bfloat16"
    m.pooled = "input"            # CLIP pooled embeddings, 768 + 1280
    m.pooled_dim = 2048
    m.use_text_mask = False
    m.context_pre_only_last = True
    m.dual_attention_layers = tuple(range(13))
    m.timestep_freqs = "rounded"
    _base["paper_scale"](c, sp=1, attention="dense", scan_blocks=False)
    return c
