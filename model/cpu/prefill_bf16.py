"""The bf16 prefill through PyTorch: its attention on AMX, and its matmuls where our own bf16 GEMM
(qgemm_bf16.c) does not run (NANOCHAT_QGEMM=bf16 on a CPU without AVX-512 BF16, for tests).

Where the CPU has AMX (Sapphire Rapids and later), `torch.matmul` on bf16 runs oneDNN's tile
kernels, several times faster than our int16 GEMM (qgemm.c) and PyTorch's fp32 one. A block
matrix is dequantized to bf16 (qg_dequant_bf16: the file's values, rounded to nearest even) into
one shared buffer, the activations are rounded to bf16, and the products are summed in fp32 and
rounded to bf16 once more on the way out. Attention likewise: PyTorch's bf16 SDPA (oneDNN's
tiles again) over the fp16 cache's rows, rounded to bf16. Over 512 teacher-forced tokens of text
this agrees with the fp32 reference on 99.2% (SmolLM2) and 98.6-99.6% (Gemma 3 270M) of greedy
picks, perplexity within 0.8% (docs/cpu-prefill.md); llama.cpp's int8 activations are coarser. The
decode step and the last position's logits are unchanged (the int16 row kernel).
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from model.cpu import gemm_pool, native

SCRATCH_MAX = 32 << 20   # values: a larger matrix (a 262k-row head) keeps the int16 path
_SCRATCH: list[torch.Tensor] = []


@functools.cache
def amx() -> bool:
    """Whether oneDNN's bf16 GEMM has AMX tiles here (it asks the kernel for them itself)."""
    cpu = getattr(torch, "cpu", None)
    try:
        return bool(torch.backends.mkldnn.is_available() and cpu._is_amx_tile_supported() and cpu._init_amx())
    except (AttributeError, RuntimeError):
        return False


def _weights(qws: tuple[native.QW, ...], threads: int) -> torch.Tensor | None:
    """The matrices `qws`, stacked by rows, as bf16 in the shared buffer, dequantized on the
    prefill's pool (None if too large, or the pool cannot: the caller keeps the int16 GEMM)."""
    rows, cols = sum(w.rows for w in qws), qws[0].cols
    if rows * cols > SCRATCH_MAX or any(w.cols != cols for w in qws) or (lib := native.library()) is None:
        return None
    if not _SCRATCH or _SCRATCH[0].numel() < rows * cols:
        _SCRATCH[:] = [torch.empty(rows * cols, dtype=torch.bfloat16)]
    out = _SCRATCH[0][:rows * cols].view(rows, cols)
    r = 0
    with gemm_pool.LOCK:
        ctx = gemm_pool.context(lib, threads, cols)
        for w in qws:
            if not ctx or lib.qg_dequant_bf16(ctx, ctypes.byref(w), out[r:].data_ptr()) != 0:
                return None
            r += w.rows
    return out


def matmul(qw: native.QW, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """x (..., cols) fp32 or bf16 through `qw` in bf16, fp32 out; None where this path does not serve it."""
    w = _weights((qw,), torch.get_num_threads())
    if w is None:
        return None
    y = F.linear(x.to(torch.bfloat16), w).float()
    return y if bias is None else y + bias


def stacked(qws: list[native.QW], x: torch.Tensor, biases: list) -> tuple[torch.Tensor, ...] | None:
    """x through each of `qws` (+ its bias), the matrices stacked into one bf16 GEMM."""
    if (w := _weights(tuple(qws), torch.get_num_threads())) is None:
        return None
    y = F.linear(x.to(torch.bfloat16), w).float().split([q.rows for q in qws], dim=-1)
    return tuple(part if b is None else part + b for part, b in zip(y, biases, strict=True))


ACTS = {"silu": 0, "gelu_tanh": 1}   # qdecode.c's ACT_SILU, ACT_GELU_TANH


def glu(gate: native.QW, up: native.QW, x: torch.Tensor, act: str) -> torch.Tensor | None:
    """act(x Wg^T) * (x Wu^T) as bf16 (the down projection's GEMM input, rounded where PyTorch
    rounded it before): both matrices in one GEMM (the tiles stay busy longer), then the
    activation in C straight from the bf16 product (qg_glu_bf16): a 512-token fp32 copy of
    both halves went through memory twice and cost more than the GEMM."""
    if act not in ACTS or gate.rows != up.rows or gate.bias or up.bias:
        return None
    threads = torch.get_num_threads()
    if (w := _weights((gate, up), threads)) is None:
        return None
    y = F.linear(x.reshape(-1, gate.cols).to(torch.bfloat16), w)
    out = torch.empty(*x.shape[:-1], gate.rows, dtype=torch.bfloat16)
    native.library().qg_glu_bf16(y.data_ptr(), out.data_ptr(), y.shape[0], gate.rows, ACTS[act], threads)
    return out


_MASK: list = [None, None]   # (t, pos, window) -> the additive mask: every layer of a chunk shares it


def _mask(t: int, pos: int, window_left: int) -> torch.Tensor:
    """Query i (at pos + i) sees keys j <= pos + i, and with a window only j >= pos + i - window."""
    key = (t, pos, window_left)
    if _MASK[0] != key:
        i = torch.arange(t)[:, None] + pos
        j = torch.arange(pos + t)[None, :]
        seen = (j <= i) & ((j >= i - window_left) if window_left >= 0 else True)
        _MASK[:] = [key, torch.zeros(t, pos + t).masked_fill_(~seen, float("-inf")).to(torch.bfloat16)]
    return _MASK[1]


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int, window_left: int,
           scale: float) -> torch.Tensor:
    """Causal attention of q (1, T, Hq, D) fp32 at positions pos.. over the caches' rows
    [0, pos + T) (already written), in bf16 through PyTorch's SDPA; fp32 (1, T, Hq, D) out.
    is_causal aligns the square's corner at key 0: right for a chunk at the start of the cache
    whose window covers it (13% faster: its blocks above the diagonal are skipped), wrong once
    the cache holds earlier turns, where the mask is explicit (and additive: SDPA converts a bool
    one on every call)."""
    t, n = q.shape[1], pos + q.shape[1]
    qb = q.transpose(1, 2).to(torch.bfloat16)
    kb, vb = (c[:, :n].transpose(1, 2).to(torch.bfloat16) for c in (k_cache, v_cache))
    causal = pos == 0 and (window_left < 0 or window_left >= t - 1)
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=None if causal else _mask(t, pos, window_left),
                                       is_causal=causal, scale=scale, enable_gqa=True)
    return o.transpose(1, 2).float()
