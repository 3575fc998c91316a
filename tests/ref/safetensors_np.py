"""Minimal safetensors reader on numpy (spec K3_MODEL.md §1.1, §1.3).

File layout (§1.3): [u64 little-endian N][N bytes of UTF-8 JSON][data section].
Each JSON entry is {"dtype", "shape", "data_offsets": [a, b]}, offsets relative to the
start of the data section; an optional "__metadata__" key is skipped.

A checkpoint directory (§1.1) is either one `model.safetensors`, or shards listed by
`model.safetensors.index.json` (key `weight_map`: tensor name -> shard file name).

Only numpy and the standard library are used. Arrays are memory-mapped, so opening a
large shard costs nothing until a tensor is read.
"""
import json
import os
import struct

import numpy as np

# storage dtype name -> (numpy dtype of the raw bytes, element size)
_RAW = {
    "BF16": (np.dtype("<u2"), 2),   # widened by bf16_to_f32 below
    "F16": (np.dtype("<f2"), 2),
    "F32": (np.dtype("<f4"), 4),
    "F64": (np.dtype("<f8"), 8),
    "U8": (np.dtype("u1"), 1),
}


def bf16_to_f32(u16):
    """BF16 -> F32, exactly: the 16 bits become the high half of a u32 (§1.3)."""
    return (np.asarray(u16, dtype=np.uint32) << 16).view(np.float32)


class SafetensorsFile:
    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError(f"{path}: shorter than 8 bytes")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or 8 + n > size:
                raise ValueError(f"{path}: header length {n} does not fit a {size}-byte file")
            try:
                header = json.loads(f.read(n).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{path}: header is not UTF-8 JSON: {e}") from None
        if not isinstance(header, dict):
            raise ValueError(f"{path}: header is not a JSON object")
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        data_len = size - self.data_start
        self.tensors = {}
        for name, info in header.items():
            dt = info.get("dtype")
            if dt not in _RAW:
                raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt!r}")
            shape = [int(s) for s in info["shape"]]
            a, b = (int(x) for x in info["data_offsets"])
            numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if not (0 <= a <= b <= data_len) or b - a != numel * _RAW[dt][1]:
                raise ValueError(f"{path}: tensor {name}: bad data_offsets {a},{b} for "
                                 f"{dt}{shape} (data section {data_len} bytes)")
            self.tensors[name] = (dt, tuple(shape), a, b)
        self._mm = None

    def _map(self):
        if self._mm is None:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._mm

    def keys(self):
        return self.tensors.keys()

    def dtype(self, name):
        return self.tensors[name][0]

    def shape(self, name):
        return self.tensors[name][1]

    def raw(self, name):
        """The tensor in its storage dtype (BF16 as uint16 bit patterns), read-only."""
        dt, shape, a, b = self.tensors[name]
        buf = self._map()[self.data_start + a: self.data_start + b]
        # The data section need not be aligned (the tiny fixture's starts at an odd
        # byte), so copy the bytes rather than reinterpret the map in place.
        return np.frombuffer(buf.tobytes(), dtype=_RAW[dt][0]).reshape(shape)

    def float64(self, name):
        """The tensor widened exactly to float64, honouring its header dtype."""
        dt = self.tensors[name][0]
        r = self.raw(name)
        if dt == "BF16":
            return bf16_to_f32(r).astype(np.float64)
        if dt == "U8":
            raise ValueError(f"{name}: U8 tensor requested as float")
        return r.astype(np.float64)


class Checkpoint:
    """All tensors of a checkpoint directory, by name."""

    def __init__(self, ckpt_dir):
        self.dir = ckpt_dir
        index = os.path.join(ckpt_dir, "model.safetensors.index.json")
        single = os.path.join(ckpt_dir, "model.safetensors")
        self.where = {}   # tensor name -> SafetensorsFile
        files = {}
        if os.path.exists(index):
            with open(index) as f:
                wm = json.load(f).get("weight_map")
            if not isinstance(wm, dict) or not wm:
                raise ValueError(f"{index}: no weight_map")
            for name, shard in wm.items():
                if shard not in files:
                    files[shard] = SafetensorsFile(os.path.join(ckpt_dir, shard))
                if name not in files[shard].tensors:
                    raise ValueError(f"{index}: {name} mapped to {shard}, which lacks it")
                self.where[name] = files[shard]
        elif os.path.exists(single):
            st = SafetensorsFile(single)
            for name in st.keys():
                self.where[name] = st
        else:
            raise FileNotFoundError(f"{ckpt_dir}: neither model.safetensors.index.json "
                                    f"nor model.safetensors")

    def __contains__(self, name):
        return name in self.where

    def keys(self):
        return self.where.keys()

    def dtype(self, name):
        return self._file(name).dtype(name)

    def shape(self, name):
        return self._file(name).shape(name)

    def raw(self, name):
        return self._file(name).raw(name)

    def float64(self, name):
        return self._file(name).float64(name)

    def _file(self, name):
        try:
            return self.where[name]
        except KeyError:
            raise KeyError(f"tensor missing from checkpoint {self.dir}: {name}") from None
