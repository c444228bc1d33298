"""The numpy-only safetensors reader/writer: round trips every stored dtype (bf16 included),
reads the byte layout the format defines (checked against a hand-built file), and names the file
and the tensor when a file is truncated or its header is broken."""
import json
import struct

import ml_dtypes
import numpy as np
import pytest

from spotlight_jax.io import safetensors_format as io


def test_round_trip_of_every_dtype(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"f32": rng.normal(size=(3, 4)).astype(np.float32),
               "bf16": rng.normal(size=(5,)).astype(ml_dtypes.bfloat16),
               "f16": rng.normal(size=(2, 2, 2)).astype(np.float16),
               "i64": np.arange(7, dtype=np.int64), "mask": np.array([True, False, True]),
               "empty": np.zeros((0, 3), np.float32), "scalar": np.float32(2.5)}
    io.save(tmp_path / "x.safetensors", tensors, {"prompts": json.dumps(["a", "b"])})
    back = io.load(tmp_path / "x.safetensors")
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == np.asarray(v).dtype and back[k].shape == np.shape(v)
        np.testing.assert_array_equal(back[k], v)
    assert json.loads(io.metadata(tmp_path / "x.safetensors")["prompts"]) == ["a", "b"]
    assert list(io.load(tmp_path / "x.safetensors", names=["i64"])) == ["i64"]


def test_reads_the_format_byte_layout(tmp_path):
    """A file written by hand from the format's definition (not by our writer)."""
    a = np.array([[1.0, -2.0]], np.float32)
    b = np.array([0.5], ml_dtypes.bfloat16)
    header = {"b": {"dtype": "BF16", "shape": [1], "data_offsets": [8, 10]},
              "a": {"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header).encode()
    (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + a.tobytes()
                                             + b.tobytes())
    got = io.load(tmp_path / "h.safetensors")
    np.testing.assert_array_equal(got["a"], a)
    np.testing.assert_array_equal(got["b"].astype(np.float32), [0.5])


def test_errors_name_the_file_and_tensor(tmp_path):
    path = tmp_path / "t.safetensors"
    io.save(path, {"w": np.ones((4, 4), np.float32)})
    path.write_bytes(path.read_bytes()[:-8])                     # truncated body
    with pytest.raises(io.SafetensorsError, match=r"t\.safetensors: tensor 'w'.*truncated"):
        io.load(path)
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(io.SafetensorsError, match="bad.safetensors: header is not JSON"):
        io.load(tmp_path / "bad.safetensors")
    (tmp_path / "short.safetensors").write_bytes(b"abc")
    with pytest.raises(io.SafetensorsError, match="not a safetensors file"):
        io.load(tmp_path / "short.safetensors")
    with pytest.raises(io.SafetensorsError, match="cannot read"):
        io.load(tmp_path / "missing.safetensors")
    with pytest.raises(io.SafetensorsError, match="cannot store"):
        io.save(tmp_path / "c.safetensors", {"c": np.ones(2, np.complex64)})
    with pytest.raises(io.SafetensorsError, match="no tensor 'v'"):
        io.load(_one(tmp_path), names=["v"])


def _one(tmp_path):
    p = tmp_path / "one.safetensors"
    io.save(p, {"w": np.zeros(1, np.float32)})
    return p
