"""Tiny CPU config: ~1.5M-parameter MMDiT, 32x32 RGB pixels, 4x4 patches (64 image tokens).

Run:  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/spotlight
Dry run:  python -m spotlight_jax.main --config=configs/tiny.py --workdir=/tmp/x --dry_run
"""
import pathlib
import runpy

_base = runpy.run_path(str(pathlib.Path(__file__).with_name("base.py")))


def get_config():
    return _base["get_config"]()
