"""The prefill's pool of threads (qgemm.c's context): one per library and thread count, grown to
the widest input seen, and the lock that keeps one call on it at a time. The GEMM
(prefill_gemm.py), the attention (prefill_attn.py) and the AMX path's dequantization
(prefill_bf16.py) all run their phases on it."""

from __future__ import annotations

import ctypes
import threading

LOCK = threading.Lock()
_CTX: dict[tuple[int, int], tuple[int, int]] = {}   # (library, threads) -> (context pointer, k_max)


def context(lib: ctypes.CDLL, threads: int, cols: int) -> int:
    """The context for `lib` on `threads` holding rows of `cols` values (0 if it could not be
    made). Call with LOCK held."""
    if lib.qg_new.restype is not ctypes.c_void_p:
        lib.qg_new.restype = ctypes.c_void_p
        lib.qg_new.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.qg_free.argtypes = [ctypes.c_void_p]
    key = (id(lib), threads)
    ctx, k_max = _CTX.get(key, (0, 0))
    if cols > k_max or not ctx:
        if ctx:
            lib.qg_free(ctx)
        k_max = max(4096, 1 << (cols - 1).bit_length())
        ctx = lib.qg_new(threads, k_max) or 0
        _CTX[key] = (ctx, k_max)
    return ctx
