"""Paper scale on Z-Image (6.2B single-stream DiT: 2 noise-refiner + 2 caption-refiner + 30 main
layers, width 3840, 30 heads of 128).

The real architecture, as diffusers' ``ZImageTransformer2DModel`` (its defaults are Z-Image's
config.json): the caption (Qwen3-4B's hidden states, width 2560) refined alone, the image
tokens refined with the timestep, then one stream over [image; caption] with 3-axis RoPE
(caption tokens along the first axis, image patches after them), each run padded to a multiple
of 32 with learned pad tokens; ``spotlight_jax.models.convert.from_diffusers`` of a Z-Image
``transformer`` folder gives this model section (``model.family='z_image'``). The model takes
``t`` = sigma and returns ``noise - x0`` like every other family here (the pipeline's reversed
time and negated output are converted inside). 1024x1024 images through the 16-channel VAE at
/8 (128x128 latent cells), patch 2 -> 4096 image tokens, 512 caption tokens; bf16, remat, a
scan over each layer stack; FSDP x SP (30 heads: ring attention over sp 4).

Dry run on any machine (no parameters are allocated):
  python -m spotlight_jax.main --config=configs/z_image.py --workdir=/tmp/z --dry_run
"""
import pathlib
import runpy

import ml_collections

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def get_config():
    c = _base["get_config"]()
    _base["paper_scale"](c, sp=4, attention="ring", scan_blocks=True)
    c.model = ml_collections.ConfigDict(dict(
        family="z_image", all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=3840,
        n_layers=30, n_refiner_layers=2, n_heads=30, n_kv_heads=30, norm_eps=1e-5,
        qk_norm=True, cap_feat_dim=2560, rope_theta=256.0, t_scale=1000.0,
        axes_dims=(32, 48, 48), axes_lens=(1024, 512, 512), dtype="bfloat16",
        param_dtype="bfloat16", remat=True, remat_policy="nothing", scan_blocks=True,
        image_size=128, image_width=0, text_len=512))
    c.sampler.guidance = 4.0
    return c
