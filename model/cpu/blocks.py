"""GGUF tensors repacked into our block formats, and dequantized back (docs/weight-formats.md).

Every block type becomes one of two layouts our CPU kernels read, with the file's own
numbers: integer values, a scale per sub-block and optionally a min, value = scale * q + min.

    Q4  4-bit values 0..15, 16 bytes per 32 (byte j: value j low, value j+16 high)
    Q8  int8 values

Scales and mins stay fp16, as the file stores them (Q4_0's min, -8 d, is exact in fp16).
Because q * scale is exact in fp32 for these widths, scale * q + min rounds once, exactly as
the gguf package's dequantization does: our weights equal the file's bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

Q4, Q8 = "q4", "q8"
DENSE = ("F32", "F16", "BF16")
BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_1")   # repacked; the K, IQ4 and Q5_0 types: file_blocks.py


@dataclass
class Packed:
    """One weight matrix (rows, cols) in a block layout."""

    kind: str                  # q4 or q8
    q: np.ndarray              # q4: uint8 (rows, cols/2); q8: int8 (rows, cols)
    scale: np.ndarray          # float16 or float32 (rows, cols/sub)
    min: np.ndarray | None     # same dtype and shape as scale, or None
    sub: int                   # values per scale: 32

    @property
    def shape(self) -> tuple[int, int]:
        rows, n = self.q.shape
        return rows, n * 2 if self.kind == Q4 else n


def _f16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.float16)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes of llama.cpp's 32-value layout -> (n, 32) values: low nibbles first."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _unpack(kind: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(values, scales, mins or None, values per scale) of a block array (n, bytes). The 4-bit
    types' values stay packed: llama.cpp's 32-value layout (byte j: value j in the low nibble,
    value j+16 in the high one) is our Q4's, so their bytes are copied as they are."""
    if kind == "Q8_0":
        return raw[:, 2:].view(np.int8), _f16(raw[:, :2]), None, 32
    if kind == "Q4_0":
        d = _f16(raw[:, :2])
        return raw[:, 2:], d, d * np.float16(-8), 32   # (q - 8) d == q d - 8 d, both exact
    if kind == "Q4_1":
        return raw[:, 4:], _f16(raw[:, :2]), _f16(raw[:, 2:4]), 32
    if kind == "Q5_1":
        high = np.unpackbits(raw[:, 4:8], axis=-1, bitorder="little")
        q = _nibbles(raw[:, 8:]) | (high << 4)
        return q.astype(np.int8), _f16(raw[:, :2]), _f16(raw[:, 2:4]), 32
    raise ValueError(f"no block layout for {kind}")


def repack(kind: str, raw: np.ndarray, rows: int, cols: int) -> Packed:
    """A GGUF block tensor's bytes (as the gguf reader gives them) -> Packed (rows, cols)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows * cols // 32, -1)
    q, scale, mn, sub = _unpack(kind, raw)
    scale = np.ascontiguousarray(scale.reshape(rows, cols // sub))
    mn = None if mn is None else np.ascontiguousarray(mn.reshape(rows, cols // sub))
    if kind in ("Q4_0", "Q4_1"):
        return Packed(Q4, np.ascontiguousarray(q).reshape(rows, cols // 2), scale, mn, sub)
    return Packed(Q8, np.ascontiguousarray(q).reshape(rows, cols), scale, mn, sub)


# ---- back to floats (torch): the reference the kernels and the fp32 path use -------------------
def values(kind: str, q: torch.Tensor) -> torch.Tensor:
    """Integer values per element as fp32, (rows, cols)."""
    if kind == Q8:
        return q.float()
    rows, half = q.shape
    b = q.reshape(rows, half // 16, 16)
    return torch.cat([b & 0x0F, b >> 4], dim=-1).reshape(rows, half * 2).float()


def dequantize(kind: str, q: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor | None) -> torch.Tensor:
    """fp32 (rows, cols): scale * q (+ min), rounded once, as the gguf package computes it."""
    v = values(kind, q)
    sub = v.shape[1] // scale.shape[1]
    s = scale.float().repeat_interleave(sub, dim=1)
    return torch.addcmul(mn.float().repeat_interleave(sub, dim=1), s, v) if mn is not None else s * v
