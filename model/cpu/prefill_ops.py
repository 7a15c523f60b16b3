"""A prefill's RMSNorms and rotary embedding in C (prefill_ops.c), on the calling thread.

`rms_norm` serves the norms the quantized CPU loader marks `NativeNorm` (model/loading/quantized.py): within
an ulp or two of PyTorch's (the sum of squares in another order), so the fp32 reference keeps
PyTorch's. `rotary` gives PyTorch's apply_rotary bits exactly (each product rounded, no fused
multiply-add), so it serves any fp32 prefill on the CPU. None: not here (the caller runs PyTorch).
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch
import torch.nn as nn

from model.cpu import native


def lib() -> ctypes.CDLL | None:
    lib_ = native.library()
    if lib_ is None or not hasattr(lib_, "qp_rotary"):
        return None
    if lib_.qp_rotary.argtypes is None:
        lib_.qp_rmsnorm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int,
                                                            ctypes.c_int, ctypes.c_long]
        lib_.qp_rotary.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + [ctypes.c_long]
    return lib_


def _plain(*ts: torch.Tensor) -> bool:
    """fp32 CPU tensors, and no autograd to feed (a C call records no graph)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in ts)
    return not grad and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in ts)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor | None:
    """x / rms(x) over the last dim, times weight (gemma: times 1 + weight)."""
    n = x.shape[-1]
    if not _plain(x, weight) or weight.numel() != n or (lib_ := lib()) is None:
        return None
    w = weight.detach().contiguous()
    inner, stride = _row_groups(x)
    xc = x if inner else x.contiguous()
    y = torch.empty(x.shape)
    lib_.qp_rmsnorm(xc.data_ptr(), y.data_ptr(), w.data_ptr(), x.numel() // n, n, eps, int(gemma), inner or 1,
                    stride if inner else n)
    return y


def _row_groups(x: torch.Tensor) -> tuple[int, int]:
    """(rows a group, floats between groups) for x (..., T, H, D) whose H x D rows are contiguous
    and whose T steps are one stride apart (a column slice of the stacked q/k/v product); (0, 0)
    when the C norm must read a contiguous copy."""
    if x.is_contiguous():
        return x.numel() // x.shape[-1], 0
    if x.dim() >= 3 and x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] and all(d == 1 for d in x.shape[:-3]):
        return x.shape[-2], x.stride(-3)
    return 0, 0


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """apply_rotary (model/families/layers.py) for x (1, T, H, D) and (T, D/2) tables."""
    if x.dim() != 4 or x.shape[0] != 1 or x.shape[1] < 2 or not _plain(x, cos, sin) or (lib_ := lib()) is None:
        return None
    _, t, h, d = x.shape
    if d % 2 or cos.shape != (t, d // 2) or sin.shape != (t, d // 2):
        return None
    inner, stride = _row_groups(x)
    xc, c, s = x if inner else x.contiguous(), cos.contiguous(), sin.contiguous()
    y = torch.empty(x.shape)
    lib_.qp_rotary(xc.data_ptr(), y.data_ptr(), c.data_ptr(), s.data_ptr(), t, h, d,
                   stride if inner and not x.is_contiguous() else h * d)
    return y


class NativeNorm(nn.Module):
    """Mixed in before a family's RMSNorm (any class with weight, eps and one_plus_weight): an fp32
    input in one C pass, within an ulp or two of PyTorch's six (rms_norm above)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = rms_norm(x, self.weight, self.eps, gemma=self.one_plus_weight)
        return super().forward(x) if y is None else y


@cache
def native_norm(cls: type) -> type:
    return type(f"Native{cls.__name__}", (NativeNorm, cls), {})
