"""Causal attention of a chunk of new queries over the cache, reading only each query's window.

FlashAttention's online softmax in Triton: one program owns BLOCK_M consecutive queries of one
query head and walks only the key blocks some of them may see, `[start + m0 - W + 1, start +
m0 + BLOCK_M)` for a window of W keys (the query's own included), or `[0, ...)` without one. So
a windowed layer costs (BLOCK_M + W) keys a query block whatever the context, and no (Tq, Tk)
score or mask matrix is ever built. It serves Gemma 3's local layers where the FlashAttention
build has no windows (fa3-fwd: `window_size` is compiled out), and any causal chunk where no
flash backend exists.

The chunk's K/V must already sit in the cache at [start, start + Tq). `start` is read on the
device (a pointer to `cache_seqlens`), so a CUDA graph of a prefill holds at any position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _window_attention(q_ptr, k_ptr, v_ptr, o_ptr, start_ptr, n_q, scale_log2,
                      sq_t, sq_h, sk_t, sk_h, so_t, so_h,
                      WINDOW: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    pid_m, head = tl.program_id(0), tl.program_id(1)
    kvh = head // G
    start = tl.load(start_ptr).to(tl.int32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DP)
    dmask = offs_d < D
    qpos = start + offs_m
    q = tl.load(q_ptr + offs_m[:, None] * sq_t + head * sq_h + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & dmask[None, :], other=0.0)
    hi = start + tl.minimum((pid_m + 1) * BLOCK_M, n_q)          # one past the newest key any row sees
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(start + pid_m * BLOCK_M - WINDOW + 1, 0)  # the oldest key the first row sees
        lo = (lo // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DP], tl.float32)
    for k0 in range(lo, hi, BLOCK_N):
        offs_n = k0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < hi) & dmask[None, :]
        k = tl.load(k_ptr + offs_n[:, None] * sk_t + kvh * sk_h + offs_d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * scale_log2
        visible = offs_n[None, :] <= qpos[:, None]
        if WINDOW > 0:
            visible = visible & (offs_n[None, :] > qpos[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with nothing visible yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs_n[:, None] * sk_t + kvh * sk_h + offs_d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / tl.maximum(l_i, 1e-30)[:, None]   # every real row sees its own key: l_i > 0 there
    tl.store(o_ptr + offs_m[:, None] * so_t + head * so_h + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < n_q) & dmask[None, :])


SMS = 132   # the H200's multiprocessors: fewer programs than this leave most of the GPU idle


def blocks_for(head_dim: int, tq: int = 1 << 30, hq: int = 1 << 10) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, warps): 64x32 for Gemma's 256-wide heads, 128x64 for 64-128; query
    blocks halved (down to 16) while the grid has fewer programs than the GPU has SMs, since a
    short chunk's grid is tiny (Gemma's 4 heads at 512 tokens: 32 programs of 64 queries)."""
    bm, bn, warps = (64, 32, 8) if head_dim > 128 else (128, 64, 4 if head_dim <= 64 else 8)
    while bm > 16 and -(-tq // bm) * hq < SMS:
        bm //= 2
    return bm, bn, warps if bm >= 64 else 4


def window_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: torch.Tensor,
                     window_left: int = -1, scale: float | None = None,
                     blocks: tuple[int, int, int] | None = None) -> torch.Tensor:
    """q: (1, Tq, Hq, D) at absolute positions start..start+Tq-1; caches (1, T, Hk, D) with the
    chunk's K/V already written; `start`: int32 (1,) on the device. `window_left` as
    FlashAttention's window_size[0] (W - 1 keys before the query; -1: none). -> (1, Tq, Hq, D)."""
    _, tq, hq, d = q.shape
    hk = k_cache.shape[2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    kc, vc = k_cache[0], v_cache[0]
    if kc.stride(-1) != 1 or vc.stride() != kc.stride():
        raise ValueError("the cache must be contiguous in its head dimension, K and V alike")
    out = torch.empty((tq, hq, d), device=q.device, dtype=q.dtype)
    bm, bn, warps = blocks or blocks_for(d, tq, hq)
    scale = (scale if scale is not None else d ** -0.5) * LOG2E
    grid = (triton.cdiv(tq, bm), hq)
    _window_attention[grid](q[0], kc, vc, out, start, tq, scale,
                            q.stride(1), q.stride(2), kc.stride(0), kc.stride(1), out.stride(0), out.stride(1),
                            WINDOW=window_left + 1 if window_left >= 0 else 0, G=hq // hk, D=d,
                            DP=max(16, triton.next_power_of_2(d)), BLOCK_M=bm, BLOCK_N=bn,
                            IEEE=q.dtype == torch.float32, num_warps=warps)
    return out[None]
