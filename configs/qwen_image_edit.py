"""Paper scale: Qwen-Image-Edit's transformer (Qwen-Image's 20B MMDiT, called with the input
image's latents as extra tokens).

The transformer is Qwen-Image's (``QwenImageTransformer2DModel``, the same config.json); what
makes it an editing model is how ``QwenImageEditPipeline`` calls it: the input image's packed
VAE latents after the target's, ``img_shapes`` giving the reference grid frame index 1 in the
3-axis RoPE, the velocity cut to the target's tokens. ``from_diffusers`` of the
``Qwen/Qwen-Image-Edit`` folder's ``transformer`` gives this model section (``reference_images=1``
from the pipeline's model_index.json; Qwen-Image-Edit-2511 adds ``reference_zero_t``). At 1024 x
1024 (128 x 128 latent cells, patch 2) the target and the input image make 4096 + 4096 image
tokens: twice Qwen-Image's sequence at that size. Text comes from Qwen2.5-VL, which sees the
input image (its embeddings are per prompt and image): a run from the folder reads them, with
the image's latents, from an edit file written by ``spotlight_jax.tools.encode_prompts``
(docs/editing.md, "A run from a Qwen-Image-Edit folder"; its text_len is the file's, about
1536 with a 1024 x 1024 input image).

Dry run on any machine (no parameters are allocated):
  python -m spotlight_jax.main --config=configs/qwen_image_edit.py --workdir=/tmp/qe --dry_run
"""
import pathlib
import runpy

_qwen = runpy.run_path(str(pathlib.Path(__file__).with_name("qwen_image.py")))


def get_config():
    c = _qwen["get_config"]()
    m = c.model
    m.image_size = 128            # latent cells (1024 / 8)
    m.reference_images = 1        # the input image's latents, at the target's size
    return c
