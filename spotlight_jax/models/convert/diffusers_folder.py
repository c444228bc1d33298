"""Read one diffusers component folder (``.../transformer``, ``.../vae``): its ``config.json``
and its weights, one safetensors file or several shards with their ``*.index.json``.

No torch: the tensors come back as numpy arrays in the stored dtype (fp32, bf16, fp16),
memory-mapped. Every error names the folder and what is missing or wrong.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

from spotlight_jax.io import safetensors_format


class CheckpointError(ValueError):
    """A diffusers component folder that cannot be read (the message names it and the fix)."""


def read_config(checkpoint_dir) -> dict:
    d = pathlib.Path(checkpoint_dir)
    if not d.is_dir():
        raise CheckpointError(f"{d}: not a folder (pass a diffusers component folder such as "
                              f"<model>/transformer or <model>/vae)")
    cfg_path = d / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{d}: no config.json (pass the component folder, e.g. "
                              f"<model>/transformer, not the pipeline folder)")
    try:
        return json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path}: not JSON ({e})") from e


def weight_files(checkpoint_dir) -> list[pathlib.Path]:
    """The folder's safetensors files: the shards an index names, else the single file."""
    d = pathlib.Path(checkpoint_dir)
    indexes = sorted(d.glob("*.safetensors.index.json"))
    if indexes:
        try:
            index = json.loads(indexes[0].read_text())
            shards = sorted(set(index["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{indexes[0]}: not a safetensors index ({e!r})") from e
        missing = [s for s in shards if not (d / s).exists()]
        if missing:
            raise CheckpointError(f"{d}: the index names {len(shards)} shards, missing "
                                  f"{missing[:3]} (download every shard)")
        return [d / s for s in shards]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        bins = sorted(p.name for p in d.glob("*.bin"))
        hint = (f" (found {bins}: convert them to safetensors first)" if bins else "")
        raise CheckpointError(f"{d}: no *.safetensors weights{hint}")
    if len(files) > 1:
        raise CheckpointError(f"{d}: {len(files)} safetensors files and no index "
                              f"({[f.name for f in files]}); keep one, or add the index")
    return files


def read_component(checkpoint_dir) -> tuple[dict, dict[str, np.ndarray]]:
    """``(config, tensors)`` of a diffusers component folder."""
    config = read_config(checkpoint_dir)
    tensors: dict[str, np.ndarray] = {}
    for f in weight_files(checkpoint_dir):
        for name, a in safetensors_format.load(f).items():
            if name in tensors:
                raise CheckpointError(f"{checkpoint_dir}: tensor {name!r} is in two shards")
            tensors[name] = a
    return config, tensors
