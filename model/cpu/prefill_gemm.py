"""The prefill's int8 GEMM (qgemm.c): Y = X W^T for a block-format weight and many tokens.

A QLinear given more than one token calls `matmul`; None means "not here" (no VNNI build, a
dense or unsupported weight, NANOCHAT_QGEMM=0) and the caller runs PyTorch's fp32 GEMM on the
dequantized matrix. Activations are rounded to int16 per 32 values, exactly as the decode step
rounds them, and split into two bytes for VNNI's u8 x s8 products; int8 (llama.cpp's choice,
~1.6x faster in the kernel) moved the default model's answer to "What is the capital of
France?" off Paris, so it is opt-in (docs/cpu-prefill.md has both errors). The GEMM runs on its
own pool of threads (dynamic row blocks, waits that sleep), sized by torch's thread count.

Where the CPU has AMX or AVX-512 BF16, the bf16 GEMM (qgemm_bf16.c, on this pool: AMX tiles, or
VDPBF16PS) is faster still, and `matmul`/`glu` hand the matrices to it; oneDNN's bf16 GEMM
(model/cpu/prefill_bf16.py) where only oneDNN has AMX.

NANOCHAT_QGEMM: unset: bf16 where the CPU has AMX or AVX-512 BF16 (chunks of bf16_min_tokens()
tokens or more: 288 on AMX, 64 on VDPBF16PS), else the int16 GEMM where the kernels have AVX-512
VNNI; 1: the int16 GEMM on any build (the portable C path, for tests); int8: the GEMM with int8
activations; bf16: the bf16 path on any CPU; 0: off (the exact fp32 prefill).
"""

from __future__ import annotations

import ctypes
import os
import weakref

import torch

from model.cpu import gemm_pool, native, prefill_bf16

_LAST: list = [None, -1, 0]            # the last input (a weak reference), its version, the context


def lib() -> ctypes.CDLL | None:
    return bind(native.library())


def bind(lib: ctypes.CDLL | None) -> ctypes.CDLL | None:
    """lib with the GEMM's signatures set (any build of qdecode.c: the default, portable, clang)."""
    if lib is None or not hasattr(lib, "qg_gemm"):
        return None
    if lib.qg_gemm.argtypes is None:
        lib.qg_supports.argtypes = [ctypes.POINTER(native.QW)]
        lib.qg_gemm.argtypes = [ctypes.c_void_p, ctypes.POINTER(native.QW), ctypes.c_void_p, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.qg_simd.restype = ctypes.c_int
        lib.qg_bf16.restype = ctypes.c_int
        lib.qg_gemm_glu.argtypes = [ctypes.c_void_p, ctypes.POINTER(native.QW), ctypes.POINTER(native.QW),
                                    ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_int]
    return lib


# Below this many tokens the int16 GEMM wins on AMX: there the bf16 path attends through PyTorch's
# SDPA, and with oneDNN's GEMM it paid ~100 ms a prefill whatever its length (every PyTorch op
# wakes sleeping OpenMP threads, ~150 us each, and each matrix was dequantized again): a chat
# turn's 40 tokens took 170 ms against 70; crossover ~300 tokens on SmolLM2, ~190 on Gemma 3 270M.
# On VDPBF16PS (no AMX) everything runs on our pool, and bf16 led from 64 tokens up (SmolLM2, 2
# threads, alternating: pp64 509-642 against 337-463 tok/s, pp128 545-848 against 547-639).
BF16_MIN_TOKENS = {1: 288, 2: 64}   # by qg_bf16(): 1 AMX tiles, 2 VDPBF16PS; oneDNN's AMX alone: 288


def bf16_min_tokens(lib_: ctypes.CDLL | None = None) -> int:
    """The shortest chunk the default path prefills in bf16 here."""
    return BF16_MIN_TOKENS.get((lib_ or lib()).qg_bf16(), 288)


def path(tokens: int | None = None) -> str | None:
    """The GEMM a prefill of `tokens` rows takes for its block matmuls: "bf16", "int16" or
    "int8" (qgemm.c), or None (PyTorch's fp32 GEMM on the dequantized matrix)."""
    mode = os.environ.get("NANOCHAT_QGEMM", "")
    if mode == "0" or (lib_ := lib()) is None:
        return None
    bf16_here = bool(lib_.qg_bf16() or prefill_bf16.amx())
    if mode == "bf16" or (not mode and bf16_here and (tokens or 0) >= bf16_min_tokens(lib_)):
        return "bf16"
    if mode == "int8":
        return "int8"
    return "int16" if mode == "1" or lib_.qg_simd() == 2 else None


def enabled() -> bool:
    """Whether a prefill's block matmuls leave PyTorch's fp32 GEMM."""
    return path() is not None


def activation_bits() -> int:
    return 8 if os.environ.get("NANOCHAT_QGEMM", "") == "int8" else 16


def _version(x: torch.Tensor) -> int:
    """x's version counter (in-place writes bump it); inference tensors have none, and are
    never written in place by the forward: 0."""
    return 0 if x.is_inference() else x._version


FLOATS = (torch.float32, torch.bfloat16)   # bf16: the bf16 path's own GLU output, for the down projection


def matmul(qw: native.QW, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """x (..., cols) fp32 (or the bf16 path's bf16) through the weight `qw` (+ `bias`, which is
    also qw's) on torch's thread count; None where the GEMM does not serve it (the caller runs
    the fp32 GEMM)."""
    if (how := path(x.numel() // qw.cols)) is None or x.dtype not in FLOATS or x.device.type != "cpu":
        return None
    if how == "bf16":
        if (y := tiles(qw, x)) is not None or (y := prefill_bf16.matmul(qw, x, bias)) is not None:
            return y
    return gemm(lib(), qw, x.float(), torch.get_num_threads(), activation_bits())


def tiles(qw: native.QW, x: torch.Tensor) -> torch.Tensor | None:
    """x through `qw` on our bf16 GEMM (qgemm_bf16.c: bf16 products, fp32 sums, on the pool);
    None where the build or the CPU has none (oneDNN's bf16 GEMM serves the bf16 path then)."""
    lib_ = lib()
    return gemm(lib_, qw, x.float(), torch.get_num_threads(), 0) if lib_.qg_bf16() else None


def stacked(qws: list[native.QW], x: torch.Tensor, biases: list) -> tuple[torch.Tensor, ...] | None:
    """Several weights over one input as one GEMM, on the bf16 path (oneDNN's per-call cost is
    what a 512-token chunk's small matrices pay most); None elsewhere: the int16 GEMM already
    quantizes a shared input once."""
    if (path(x.numel() // qws[0].cols) != "bf16" or x.dtype != torch.float32 or x.device.type != "cpu"
            or lib().qg_bf16()):   # the tile GEMM takes them one by one, the input converted once
        return None
    return prefill_bf16.stacked(qws, x, biases)


def gemm(lib_: ctypes.CDLL, qw: native.QW, x: torch.Tensor, threads: int, bits: int = 16) -> torch.Tensor | None:
    """x (..., cols) fp32 through `qw` with the library `lib_` (bound by `bind`) on `threads`,
    the activations rounded to `bits` (16 or 8)."""
    if not lib_.qg_supports(ctypes.byref(qw)):
        return None
    return _call(lib_, x, qw.cols, qw.rows, threads,
                 lambda ctx, xp, t, yp, fresh: lib_.qg_gemm(ctx, ctypes.byref(qw), xp, t, yp, fresh, bits))


ACTS = {"silu": 0, "gelu_tanh": 1}   # qdecode.c's ACT_SILU, ACT_GELU_TANH


def glu(gate: native.QW, up: native.QW, x: torch.Tensor, act: str) -> torch.Tensor | None:
    """act(x Wg^T) * (x Wu^T) in one C call (a gated MLP's first half, the product formed as the
    up matrix's blocks are published); None where the GEMM does not serve them."""
    how = path(x.numel() // gate.cols)
    if how is None or x.dtype != torch.float32 or x.device.type != "cpu" or act not in ACTS:
        return None
    if how == "bf16" and lib().qg_bf16():
        return glu_with(lib(), gate, up, x, torch.get_num_threads(), act, 0)
    if how == "bf16" and (y := prefill_bf16.glu(gate, up, x, act)) is not None:
        return y
    return glu_with(lib(), gate, up, x, torch.get_num_threads(), act, activation_bits())


def glu_with(lib_: ctypes.CDLL, gate: native.QW, up: native.QW, x: torch.Tensor, threads: int, act: str,
             bits: int = 16) -> torch.Tensor | None:
    if gate.rows != up.rows or gate.cols != up.cols:
        return None
    return _call(lib_, x, gate.cols, gate.rows, threads, lambda ctx, xp, t, yp, fresh: lib_.qg_gemm_glu(
        ctx, ctypes.byref(gate), ctypes.byref(up), xp, t, yp, fresh, bits, ACTS[act]))


def _call(lib_: ctypes.CDLL, x: torch.Tensor, cols: int, rows: int, threads: int, run) -> torch.Tensor | None:
    """y (..., rows) from `run(ctx, x pointer, tokens, y pointer, fresh)`, 0 on success."""
    xc = x.reshape(-1, cols).contiguous()
    t = xc.shape[0]
    y = torch.empty(t, rows)
    with gemm_pool.LOCK:
        ctx = gemm_pool.context(lib_, threads, cols)
        if not ctx:
            return None
        # q, k and v (and gate and up) read the same input: quantize it once
        ref, version, last_ctx = _LAST
        fresh = int(ref is None or ref() is not x or version != _version(x) or last_ctx != ctx)
        if run(ctx, xc.data_ptr(), t, y.data_ptr(), fresh) != 0:
            return None
        _LAST[:] = [weakref.ref(x), _version(x), ctx]
    return y.reshape(*x.shape[:-1], rows)
