"""Write a safetensors file one tensor at a time.

The header needs every tensor's dtype and shape up front; a GGUF tells us those before any
data is dequantized, so a conversion never holds more than one tensor in memory.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# numpy has no bfloat16: BF16 tensors arrive as little-endian uint16 bit patterns.
NUMPY = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "U8": "|u1", "I8": "|i1"}


@dataclass
class TensorSpec:
    name: str
    dtype: str            # safetensors dtype: F32, F16, BF16, U8, I8
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(NUMPY[self.dtype]).itemsize


def write_safetensors(path: Path, specs: list[TensorSpec], produce: Callable[[TensorSpec], np.ndarray],
                      metadata: dict[str, str] | None = None, on_tensor: Callable[[int], None] | None = None) -> None:
    """Write `specs` in order, asking `produce(spec)` for each tensor's data when it is due."""
    header: dict = {"__metadata__": metadata or {}}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, so memory-mapped views are aligned too
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for i, s in enumerate(specs):
            _write_one(f, s, produce(s))
            if on_tensor:
                on_tensor(i + 1)


def _write_one(f, s: TensorSpec, data: np.ndarray) -> None:
    want = np.dtype(NUMPY[s.dtype])
    if data.dtype.kind != want.kind or data.dtype.itemsize != want.itemsize or tuple(data.shape) != s.shape:
        raise ValueError(f"{s.name}: got {data.dtype}{tuple(data.shape)}, header says {s.dtype}{s.shape}")
    np.ascontiguousarray(data, dtype=want).tofile(f)
