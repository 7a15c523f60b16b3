"""GGUF block types kept as the file's own bytes (docs/weight-formats.md).

Q5_0, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, Q4_K and Q5_K are not repacked: a weight of `rows x cols` is stored
as `NAME.<type in lower case>`, uint8 `(rows, cols / values_per_block * bytes_per_block)`,
exactly the GGUF tensor's bytes, and the C kernels (model/cpu/qformats.h) read those
blocks directly, at the file's bits per weight. Rows are whole blocks, so rows can be permuted
or picked (the embedding lookup) byte-wise.

Every other type the gguf package can dequantize (the other IQ types, TQ1_0/TQ2_0, MXFP4, ...)
has no kernel: it is dequantized exactly to fp32 at conversion (model/loading/gguf.py).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

FILE_TYPES = ("Q5_0", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "Q4_K", "Q5_K")
KIND_CODE = {t.lower(): 5 + i for i, t in enumerate(FILE_TYPES)}   # the C enum in qformats.h
KINDS = tuple(KIND_CODE)


@cache
def _gguf():
    """The gguf package, imported on first use (the import keeps it off a model that has none of
    these kinds: the default model's q4/q8 blocks are ours): gguf with the yaml and numpy typing
    it pulls in was 0.1 s of CPU on every start."""
    import gguf
    from gguf import quants

    return gguf, quants


def block(kind: str) -> tuple[int, int]:
    """(values, bytes) of one block of a file kind ('q6_k', ...)."""
    gguf, _ = _gguf()
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind.upper()]]


def row_bytes(kind: str, cols: int) -> int:
    values, nbytes = block(kind)
    return cols // values * nbytes


def cols_of(kind: str, nbytes: int) -> int:
    values, size = block(kind)
    return nbytes // size * values


def as_rows(kind: str, raw: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A GGUF tensor's bytes as (rows, row bytes)."""
    return np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, row_bytes(kind, cols))


def dequantize(kind: str, q: torch.Tensor) -> torch.Tensor:
    """fp32 (rows, cols) of (rows, row bytes): the gguf package's own dequantization, which is
    the definition of these types' values."""
    gguf, quants = _gguf()
    out = quants.dequantize(q.contiguous().numpy(), gguf.GGMLQuantizationType[kind.upper()])
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(q.shape[0], -1)


def dequantizable(type_name: str) -> bool:
    """A block type the gguf package can dequantize (it can then run, as fp32)."""
    gguf, quants = _gguf()
    try:
        kind = gguf.GGMLQuantizationType[type_name]
        quants.dequantize(np.zeros(gguf.GGML_QUANT_SIZES[kind][1], np.uint8), kind)
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True
