"""Paper scale on FLUX.1 [dev] (12B MMDiT: 19 dual-stream + 38 single-stream blocks, width 3072,
24 heads of 128).

The real architecture, as diffusers' ``FluxTransformer2DModel`` (its ``config.json``): packed 2x2
latent patches, 3-axis RoPE (16, 56, 56) on q/k after QK-norm with image patches at (0, row,
col) and the text at the origin, dual-stream blocks then single-stream blocks (attention and MLP
in parallel over the joint sequence), the pooled CLIP-L embedding and [dev]'s distilled guidance
scale embedded into the conditioning (``sampler.guidance`` is a model input: one pass per
velocity, no CFG), no text mask; so the weights of ``black-forest-labs/FLUX.1-dev`` load into
it (``spotlight_jax.models.convert.from_diffusers`` of its ``transformer`` folder gives this
model section; ``--config.base_checkpoint=`` the pipeline folder). 1024x1024 images through
the 16-channel VAE latent at /8 (128x128 latent cells), patch 2 -> 4096 image tokens; T5-XXL's
512 tokens of width 4096 and CLIP-L's pooled 768 from a prompt-embedding file
(``python -m spotlight_jax.tools.encode_prompts --pipeline=<FLUX.1-dev folder>``); bf16 compute and
parameters; FSDP x SP mesh; remat and a scan over both block stacks.

FLUX.1 [schnell]: ``--config.model.guidance_embed=False --config.sampler.guidance=1.0
--config.sampler.num_steps=4`` (its pipeline folder sets the rest).

The sampler's shift is static here (3.0); FluxPipeline shifts by resolution (exp(mu), mu from
the image's token count: 3.16 at 1024 px).

Dry run on any machine (no parameters are allocated):
  python -m spotlight_jax.main --config=configs/flux_dev.py --workdir=/tmp/f --dry_run
"""
import pathlib
import runpy

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def get_config():
    c = _base["get_config"]()
    m = c.model
    m.image_size = 128            # latent cells (1024 / 8)
    m.channels = 16               # VAE latent channels
    m.patch_size = 2              # FluxPipeline's 2x2 packing
    m.width = 3072
    m.depth = 19                  # dual-stream blocks
    m.single_blocks = 38
    m.num_heads = 24
    m.mlp_ratio = 4.0
    m.qk_norm = True
    m.text_width = 0              # precomputed embeddings of a real text encoder (T5-XXL)
    m.text_embed_dim = 4096
    m.text_len = 512
    m.pos_embed = "rope3d_flux"
    m.rope_axes = (16, 56, 56)
    m.rope_theta = 10_000.0
    m.pooled = "input"            # CLIP-L's pooled embedding
    m.pooled_dim = 768
    m.guidance_embed = True       # [dev]: the distilled guidance scale is an input
    m.use_text_mask = False       # Flux attends to every T5 token
    m.timestep_freqs = "rounded"
    _base["paper_scale"](c, sp=4, attention="ulysses", scan_blocks=True)
    c.sampler.guidance = 3.5      # FluxPipeline's guidance_scale: the model's input, one pass
    return c
