"""Reading a diffusers component folder: one file or index-named shards, and one-line errors for
a missing config, missing shard, no weights or two unindexed files."""
import json

import numpy as np
import pytest

from spotlight_jax.io import safetensors_format
from spotlight_jax.models.convert.diffusers_folder import CheckpointError, read_component


def _folder(tmp_path, shards):
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "X", "num_layers": 1}))
    weight_map = {}
    for name, tensors in shards.items():
        safetensors_format.save(tmp_path / name, tensors)
        weight_map.update({k: name for k in tensors})
    return weight_map


def test_single_file_and_shards(tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    _folder(one, {"diffusion_pytorch_model.safetensors": {"a": np.ones(2, np.float32)}})
    config, tensors = read_component(one)
    assert config["num_layers"] == 1 and list(tensors) == ["a"]

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    weight_map = _folder(sharded, {"m-00001-of-00002.safetensors": {"a": np.ones(2, np.float32)},
                                   "m-00002-of-00002.safetensors": {"b": np.zeros(3, np.float16)}})
    (sharded / "m.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _, tensors = read_component(sharded)
    assert sorted(tensors) == ["a", "b"] and tensors["b"].dtype == np.float16
    (sharded / "m-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing .*m-00002-of-00002"):
        read_component(sharded)


def test_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not a folder"):
        read_component(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        read_component(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no \\*.safetensors weights"):
        read_component(tmp_path)
    for n in ("a", "b"):
        safetensors_format.save(tmp_path / f"{n}.safetensors", {n: np.ones(1, np.float32)})
    with pytest.raises(CheckpointError, match="2 safetensors files and no index"):
        read_component(tmp_path)
