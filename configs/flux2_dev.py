"""Paper scale on FLUX.2 [dev] (32B: 8 dual-stream + 48 single-stream blocks, width 6144, 48
heads of 128).

The real architecture, as diffusers' ``Flux2Transformer2DModel`` (its defaults are FLUX.2
[dev]'s config.json): packed 2x2 latents of the 32-channel FLUX.2 VAE (128 channels in), no
biases, SwiGLU MLPs (ratio 3), one set of modulation weights shared by every block of a kind,
4-axis RoPE (32, 32, 32, 32) with theta 2000 (image patches at (0, row, col, 0), text token i at
(0, 0, 0, i)), Mistral-Small-3.1's stacked hidden states as text (width 15360), the distilled
guidance scale embedded with the timestep (``sampler.guidance`` is a model input: one pass per
velocity). ``spotlight_jax.models.convert.from_diffusers`` of its ``transformer`` folder gives
this model section (``model.family='flux2'``). 1024x1024 images: 128x128 latent cells, 4096
image tokens, 512 text tokens; bf16, remat, a scan over both block stacks; FSDP x SP.

Dry run on any machine (no parameters are allocated):
  python -m spotlight_jax.main --config=configs/flux2_dev.py --workdir=/tmp/f2 --dry_run
"""
import pathlib
import runpy

import ml_collections

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def flux2_model(**fields):
    """A FLUX.2 transformer section (``models.Flux2Config``): [dev]'s, with ``fields`` changed
    (configs/flux2_klein_4b.py and flux2_klein_9b.py)."""
    return ml_collections.ConfigDict(dict(dict(
        family="flux2", in_channels=128, num_layers=8, num_single_layers=48,
        attention_head_dim=128, num_attention_heads=48, joint_attention_dim=15360,
        timestep_guidance_channels=256, mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32),
        rope_theta=2000.0, eps=1e-6, guidance_embeds=True, dtype="bfloat16",
        param_dtype="bfloat16", remat=True, remat_policy="nothing", scan_blocks=True,
        use_text_mask=False, image_size=128, image_width=0, text_len=512), **fields))


def get_config():
    c = _base["get_config"]()
    _base["paper_scale"](c, sp=4, attention="ulysses", scan_blocks=True)
    c.model = flux2_model()
    c.sampler.guidance = 4.0          # the [dev] pipeline's default, a model input
    return c
