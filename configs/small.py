"""Small config: a wider/deeper MMDiT (~30M parameters), 64x64 pixels, for a single GPU.

Run:  python -m spotlight_jax.main --config=configs/small.py --workdir=/tmp/spotlight_small
"""
import pathlib
import runpy

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def get_config():
    c = _base["get_config"]()
    c.model.image_size = 64
    c.model.width = 384
    c.model.depth = 8
    c.model.num_heads = 6
    c.model.mlp_ratio = 4.0
    c.model.text_width = 256
    c.model.text_layers = 4
    c.model.text_heads = 4
    c.model.dtype = "bfloat16"
    c.trainer_devices = 0
    c.pretrain.batch_size = 128
    c.rl.prompts_per_iter = 16
    c.rl.group_size = 16
    return c
