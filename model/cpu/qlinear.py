"""Linear layers and embeddings that keep a GGUF's weights as the file holds them.

A `QLinear` holds one weight matrix in a block format (model/cpu/blocks.py) or dense
f32/f16/bf16, memory-mapped from the converted model directory. The decode step on the
CPU (model/cpu/) reads these buffers directly. In PyTorch, a prefill dequantizes
each matrix to fp32 when it is used (exact: the file's own values) and runs one GEMM; a
single row (the last position's logits) goes through the same int16-activation kernel as
the decode step, so the tied 49k-row head is never expanded. Where the CPU has AVX-512 VNNI,
many rows go through the integer GEMM instead (model/cpu/prefill_gemm.py, qgemm.c), which
reads the blocks as they are.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.cpu import file_blocks, native, prefill_gemm
from model.cpu.blocks import Q4, Q8, dequantize

SCRATCH_MAX = 4 << 20   # floats: a 16 MB buffer serves every layer's matrix of models this size
_SCRATCH: list[torch.Tensor] = []


def _scratch(n: int) -> torch.Tensor:
    """The shared dequantization buffer, grown to the largest matrix seen. Only one forward
    runs at a time (the session's thread), and F.linear is done with it before the next."""
    if not _SCRATCH or _SCRATCH[0].numel() < n:
        _SCRATCH[:] = [torch.empty(n)]
    return _SCRATCH[0][:n]


DENSE = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
KIND_CODE = {"f32": 0, "f16": 1, "bf16": 2, Q8: 3, Q4: 4, **file_blocks.KIND_CODE}


class QLinear(nn.Module):
    def __init__(self, kind: str, q: torch.Tensor, scale: torch.Tensor | None = None,
                 mn: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        self.kind = kind
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("min", mn, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float().contiguous(), persistent=False)
        rows, n = q.shape
        cols = file_blocks.cols_of(kind, n) if kind in file_blocks.KINDS else n * 2 if kind == Q4 else n
        self.out_features, self.in_features = rows, cols
        self._qw: native.QW | None = None

    def set_bias(self, bias: torch.Tensor) -> None:
        self.register_buffer("bias", bias.detach().float().contiguous(), persistent=False)
        self._qw = None

    @classmethod
    def dense(cls, w: torch.Tensor, bias: torch.Tensor | None = None) -> QLinear:
        return cls(DENSE[w.dtype], w.contiguous(), bias=bias)

    @property
    def blocks(self) -> bool:
        return self.kind in (Q4, Q8) or self.file_format

    @property
    def file_format(self) -> bool:
        """Blocks kept as the GGUF's own bytes (file_blocks.py): no scale tensors of ours."""
        return self.kind in file_blocks.KINDS

    def nbytes(self) -> int:
        """Bytes a token's matmul reads."""
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.min, self.bias) if t is not None)

    def qw(self) -> native.QW:
        """The C view of this weight (pointers into the buffers, which never move)."""
        if self._qw is None:
            sub = self.in_features // self.scale.shape[1] if self.blocks and not self.file_format else 0
            sdt = int(self.scale is not None and self.scale.dtype == torch.float32)
            ptrs = [t.data_ptr() if t is not None else None for t in (self.q, self.scale, self.min, self.bias)]
            self._qw = native.QW(KIND_CODE[self.kind], sdt, self.out_features, self.in_features, sub, 0, *ptrs)
        return self._qw

    def weight_fp32(self) -> torch.Tensor:
        """The file's weights as fp32, exactly. A prefill uses them one matrix at a time, so
        layers' matrices share one scratch buffer: allocating each anew left ~80 MB of freed
        heap resident after the first prefill (glibc keeps blocks of that size)."""
        lib = native.library()
        if lib is not None:
            n = self.out_features * self.in_features
            out = _scratch(n).view(self.out_features, self.in_features) if n <= SCRATCH_MAX else torch.empty(
                self.out_features, self.in_features)
            lib.qd_dequant(self.qw(), out.data_ptr(), torch.get_num_threads())
            return out
        return self.rows(None)

    def rows(self, idx: torch.Tensor | None) -> torch.Tensor:
        """fp32 rows `idx` (all rows for None), in PyTorch: the embedding lookup."""
        if not self.blocks:
            return (self.q if idx is None else self.q[idx]).float()
        if self.file_format:
            if idx is None and (lib := native.library()) is not None:   # the C dequantizer: same bits, faster
                out = torch.empty(self.out_features, self.in_features)
                lib.qd_dequant(self.qw(), out.data_ptr(), torch.get_num_threads())
                return out
            flat = None if idx is None else idx.reshape(-1)
            out = file_blocks.dequantize(self.kind, self.q if flat is None else self.q[flat])
            return out if idx is None else out.reshape(*idx.shape, self.in_features)
        if idx is None:
            return dequantize(self.kind, self.q, self.scale, self.min)
        flat = idx.reshape(-1)
        out = dequantize(self.kind, self.q[flat], self.scale[flat], None if self.min is None else self.min[flat])
        return out.reshape(*idx.shape, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lib = native.library()
        if lib is not None and x.numel() == self.in_features and x.dtype == torch.float32:
            xc = x.reshape(-1).contiguous()
            y = torch.empty(self.out_features)
            lib.qd_gemv(self.qw(), xc.data_ptr(), y.data_ptr(), torch.get_num_threads())
            return y.reshape(*x.shape[:-1], self.out_features)
        if self.blocks and (y := prefill_gemm.matmul(self.qw(), x, self.bias)) is not None:   # a prefill
            return y
        return F.linear(x.float(), self.weight_fp32(), self.bias)


    def stacked(self, others: tuple[nn.Module, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """(self(x), *(o(x) for o in others)) as one GEMM for a prefill where the path stacks
        matrices (bf16: q, k and v ask), else None."""
        mods = (self, *others)
        if x.numel() == self.in_features or not all(isinstance(m, QLinear) and m.blocks for m in mods):
            return None
        return prefill_gemm.stacked([m.qw() for m in mods], x, [m.bias for m in mods])

    def glu(self, up: nn.Module, x: torch.Tensor, act: str) -> torch.Tensor | None:
        """act(self(x)) * up(x) in one C call for a prefill (GatedMLP asks), else None."""
        if not (isinstance(up, QLinear) and self.blocks and up.blocks) or x.numel() == self.in_features:
            return None
        return prefill_gemm.glu(self.qw(), up.qw(), x, act)


class QEmbedding(nn.Module):
    """Token embeddings read from a QLinear's rows (shared with the head when tied)."""

    def __init__(self, table: QLinear):
        super().__init__()
        self.table = table

    @property
    def embedding_dim(self) -> int:
        return self.table.in_features

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table.rows(idx)
