"""Paper scale on FLUX.2 [klein] 4B (3.9B: 5 dual + 20 single-stream blocks,
24 heads of 128).

FLUX.2's transformer (configs/flux2_dev.py) at [klein]'s size: no guidance embedding (the base
[klein] models take classifier-free guidance: two passes per velocity at
``sampler.guidance`` 4.0, the Flux2KleinPipeline default), Qwen3's stacked hidden states as
text (width 7680). The sizes are those of the published [klein] 4B config.json as read
by other ports; the parameter count of this section is checked against diffusers' model of
these sizes on the meta device (tests/test_configs.py). 1024x1024 images: 4096 image tokens,
512 text tokens; bf16, remat, block scans; FSDP x SP.

Dry run on any machine (no parameters are allocated):
  python -m spotlight_jax.main --config=configs/flux2_klein_4b.py --workdir=/tmp/k --dry_run
"""
import pathlib
import runpy

_dev = runpy.run_path(str(pathlib.Path(__file__).with_name("flux2_dev.py")))


def get_config():
    c = _dev["get_config"]()
    c.model = _dev["flux2_model"](num_layers=5, num_single_layers=20, num_attention_heads=24,
                                  joint_attention_dim=7680, guidance_embeds=False)
    c.sampler.guidance = 4.0          # classifier-free guidance: two passes per velocity
    return c
