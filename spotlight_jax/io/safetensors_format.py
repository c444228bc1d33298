"""Read and write the safetensors format with numpy only (no torch, no extra dependency).

The format is an 8-byte little-endian header length, a JSON header mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (plus an optional ``"__metadata__"`` dict of
strings), then the raw little-endian bytes. bfloat16 and the float8 types come from
``ml_dtypes`` (a JAX dependency), so a bf16 checkpoint reads straight into numpy without a cast.

Used by the diffusers converters (``models.convert``), the prompt-embedding files and the LoRA
export: one reader, one writer, one error style (each error names the file and the tensor).
"""
from __future__ import annotations

import json
import os
import pathlib
import struct

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A safetensors file that cannot be read as one (the message names the file)."""


def read_header(path) -> tuple[dict, dict, int]:
    """``(tensors, metadata, data_start)``: the header's tensor entries, its ``__metadata__`` and
    the byte offset where tensor data begins."""
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise SafetensorsError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise SafetensorsError(f"{path}: not a safetensors file (header length {n})")
            header = f.read(n)
    except OSError as e:
        raise SafetensorsError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        entries = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not JSON ({e})") from e
    if not isinstance(entries, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = entries.pop("__metadata__", None) or {}
    return entries, metadata, 8 + n


def load(path, names=None) -> dict[str, np.ndarray]:
    """All tensors of ``path`` (or only ``names``) as numpy arrays, memory-mapped (read-only
    views; copy before writing). Errors name the file and the offending tensor."""
    path = pathlib.Path(path)
    entries, _, start = read_header(path)
    size = path.stat().st_size
    data = np.memmap(path, dtype=np.uint8, mode="r") if size > start else np.zeros(0, np.uint8)
    out = {}
    for name in (entries if names is None else names):
        if name not in entries:
            raise SafetensorsError(f"{path}: no tensor {name!r}")
        e = entries[name]
        try:
            dtype = _DTYPES[e["dtype"]]
            shape = tuple(int(s) for s in e["shape"])
            begin, end = (int(o) for o in e["data_offsets"])
        except (KeyError, TypeError, ValueError) as err:
            raise SafetensorsError(f"{path}: tensor {name!r} has a bad header entry {e!r} "
                                   f"(dtype one of {sorted(_DTYPES)})") from err
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * dtype.itemsize or start + end > size or begin < 0:
            raise SafetensorsError(f"{path}: tensor {name!r} ({e['dtype']} {list(shape)}) has "
                                   f"{end - begin} bytes at [{begin}, {end}) of a "
                                   f"{size - start}-byte body (truncated or corrupt file)")
        out[name] = data[start + begin:start + end].view(dtype).reshape(shape)
    return out


def metadata(path) -> dict[str, str]:
    """The file's ``__metadata__`` (string to string)."""
    return read_header(path)[1]


def save(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``tensors`` (name -> array-like) to ``path`` atomically (a temporary file, then a
    rename), in name order, 8-byte aligned as the reference implementation writes them."""
    path = pathlib.Path(path)
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.require(np.asarray(tensors[name]), requirements="C")  # keeps 0-d arrays 0-d
        if a.dtype not in _NAMES:
            raise SafetensorsError(f"{path}: tensor {name!r} has dtype {a.dtype}, which "
                                   f"safetensors cannot store (use one of {sorted(_DTYPES)})")
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if metadata:
        bad = {k: v for k, v in metadata.items() if not isinstance(v, str)}
        if bad:
            raise SafetensorsError(f"{path}: metadata values must be str, got {bad!r}")
        header["__metadata__"] = dict(metadata)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
