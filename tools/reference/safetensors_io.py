"""Minimal safetensors reader/writer (no `safetensors` package needed).

File layout: u64 little-endian header length N, then N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian tensor bytes (offsets relative to the end of the header).
Supports F32, F16, BF16, I32, I64 for reading and F32 / BF16 for writing.
"""
import json
import struct

import numpy as np
import torch

_NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "F64": np.float64}


def load(path):
    """Returns {name: torch.Tensor} (BF16 widened to float32, others in their own dtype)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[base + b: base + e]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "BF16":
            u16 = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        elif dt in _NP:
            arr = np.frombuffer(buf, dtype=np.dtype(_NP[dt]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: unsupported dtype {dt} for {name}")
        out[name] = torch.from_numpy(np.array(arr, copy=True).reshape(shape))
    return out


def round_bf16(t):
    """Round a float32 tensor to the nearest BF16 (round-half-to-even), returned as float32."""
    u = t.detach().to(torch.float32).contiguous().numpy().view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return torch.from_numpy(rounded.astype(np.uint32).view(np.float32).copy()).reshape(t.shape)


def save(path, tensors, dtype="F32"):
    """Writes {name: tensor} as safetensors. dtype "F32" or "BF16" (values are rounded
    to BF16 first; pass tensors already rounded with round_bf16 to keep them exact)."""
    header = {"__metadata__": {"format": "pt"}}
    chunks = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.float32).contiguous()
        if dtype == "F32":
            data = t.numpy().astype("<f4").tobytes()
        elif dtype == "BF16":
            u = round_bf16(t).numpy().view(np.uint32)
            data = (u >> 16).astype("<u2").tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # align the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)
