"""Fused Triton kernels for batch-1 decode on CUDA, and the decode steps built from them.

Nothing here runs on the CPU path: the eager model forward stays the reference. The
kernels round to the model dtype at the same points as the eager PyTorch code, so a
fused step differs from eager only by fp32 summation order.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """True when Triton can be imported (it ships with CUDA builds of PyTorch)."""
    return importlib.util.find_spec("triton") is not None
