"""Paper scale: Qwen-Image's transformer (20B MMDiT, 60 blocks, width 3072, 24 heads of 128).

The real architecture, as diffusers' ``QwenImageTransformer2DModel`` (its ``config.json``):
3-axis RoPE (16, 56, 56) on q/k after QK-norm, an RMSNorm on the text embeddings before their
projection, timestep-only conditioning, every block dual-stream with a text key mask; so the
weights of ``Qwen/Qwen-Image`` load into it (``spotlight_jax.models.convert.from_diffusers`` of
its ``transformer`` folder gives this model section). 1280x1280 images through the 16-channel
VAE latent at /8 (160x160 latent cells), patch 2 -> 6400 image tokens; bf16 compute and
parameters; FSDP x SP mesh; remat and a scan over blocks. Text comes from Qwen2.5-VL's
precomputed embeddings (width 3584, up to 256 tokens here).

Dry run on any machine (no parameters are allocated):
  python -m spotlight_jax.main --config=configs/qwen_image.py --workdir=/tmp/q --dry_run
"""
import pathlib
import runpy

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def get_config():
    c = _base["get_config"]()
    m = c.model
    m.image_size = 160            # latent cells (1280 / 8)
    m.channels = 16               # VAE latent channels
    m.patch_size = 2
    m.width = 3072
    m.depth = 60
    m.num_heads = 24
    m.mlp_ratio = 4.0
    m.qk_norm = True
    m.text_width = 0              # precomputed embeddings of a real text encoder
    m.text_embed_dim = 3584
    m.text_len = 256
    m.pos_embed = "rope3d"        # RoPE over (frame, height, width), centred image positions
    m.rope_axes = (16, 56, 56)
    m.rope_theta = 10_000.0
    m.pooled = "none"             # timestep-only conditioning
    m.text_norm = True            # txt_norm RMSNorm before txt_in
    m.timestep_scaling = "after_freqs"
    m.timestep_freqs = "rounded"
    _base["paper_scale"](c, sp=4, attention="ulysses", scan_blocks=True)
    return c
