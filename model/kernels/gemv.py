"""Matrix-vector kernels for M = 1: the GEMVs of a decode step, each fused with its neighbours.

cuBLAS runs batch-1 GEMV at about a quarter of the H200's bandwidth on these shapes, and
every separate norm, activation or residual add costs a launch of its own. These kernels
stream weight rows with wide coalesced loads and fold the elementwise work in:

- `norm_gemv`: RMSNorm(x) @ W.T, optionally with SwiGLU (gate and up rows in one matrix)
  or ReLU^2. The norm costs no extra pass: the sum of squares is gathered from the same x
  chunks the product uses, and the scalar 1/rms is applied to the dot products at the end
  (one rounding fewer than the eager module, which rounds the normed vector to bf16 first).
- `gemv_residual`: x += W @ a, in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ACT_NONE, ACT_SWIGLU, ACT_RELU2 = 0, 1, 2


@triton.jit
def _norm_gemv_kernel(x_ptr, nw_ptr, w_ptr, out_ptr, N, K, eps,
                      ACT: tl.constexpr, HAS_NW: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = rows < N
    offs = tl.arange(0, BLOCK_K)
    acc1 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    ss = tl.zeros([BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs
        km = kk < K
        wm = rm[:, None] & km[None, :]
        w1 = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=wm, other=0.0)
        if ACT == 1:  # SwiGLU: the up rows sit N rows below the gate rows
            w2 = tl.load(w_ptr + (rows[:, None] + N) * K + kk[None, :], mask=wm, other=0.0)
        xk = tl.load(x_ptr + kk, mask=km, other=0.0).to(tl.float32)
        ss += xk * xk
        if HAS_NW:
            xk = xk * tl.load(nw_ptr + kk, mask=km, other=0.0).to(tl.float32)
        acc1 += w1.to(tl.float32) * xk[None, :]
        if ACT == 1:
            acc2 += w2.to(tl.float32) * xk[None, :]
    rstd = 1.0 / tl.sqrt(tl.sum(ss, 0) / K + eps)
    dt = w_ptr.dtype.element_ty
    y = (tl.sum(acc1, 1) * rstd).to(dt).to(tl.float32)
    if ACT == 1:
        up = (tl.sum(acc2, 1) * rstd).to(dt).to(tl.float32)
        y = (y / (1.0 + tl.exp(-y))).to(dt).to(tl.float32) * up
    elif ACT == 2:
        y = tl.maximum(y, 0.0)
        y = y * y
    tl.store(out_ptr + rows, y.to(dt).to(out_ptr.dtype.element_ty), mask=rm)


@triton.jit
def _gemv_residual_kernel(w_ptr, a_ptr, res_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = rows < N
    offs = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs
        km = kk < K
        w = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=rm[:, None] & km[None, :], other=0.0)
        a = tl.load(a_ptr + kk, mask=km, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * a[None, :]
    dt = w_ptr.dtype.element_ty
    y = tl.sum(acc, 1).to(dt).to(tl.float32)
    r = tl.load(res_ptr + rows, mask=rm, other=0.0)
    tl.store(res_ptr + rows, (r.to(tl.float32) + y).to(r.dtype), mask=rm)


def gemv_config(n: int, k: int, mats: int = 1, tile: int = 8192, programs: int = 256) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K): a 16 KB tile per matrix and iteration, and enough programs to keep
    every SM streaming; small matrices trade rows per program for programs (latency-bound)."""
    block_k = min(triton.next_power_of_2(k), 1024)
    block_n = max(1, tile // (block_k * mats))
    while block_n > 1 and triton.cdiv(n, block_n) < programs:
        block_n //= 2
    return block_n, block_k


def norm_gemv(x: torch.Tensor, norm_w: torch.Tensor | None, w: torch.Tensor, out: torch.Tensor,
              eps: float, act: int = ACT_NONE) -> torch.Tensor:
    """out[:N] = act(RMSNorm(x) @ W.T); W is (N, K), or (2N, K) gate-then-up for SwiGLU."""
    n, k = out.shape[-1], x.shape[-1]
    bn, bk = gemv_config(n, k, 2 if act == ACT_SWIGLU else 1)
    _norm_gemv_kernel[(triton.cdiv(n, bn),)](
        x, norm_w if norm_w is not None else x, w, out, n, k, eps,
        ACT=act, HAS_NW=norm_w is not None, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return out


def gemv_residual(w: torch.Tensor, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x += W @ a in place, rounded like `x + linear(a)`."""
    n, k = w.shape
    bn, bk = gemv_config(n, k)
    _gemv_residual_kernel[(triton.cdiv(n, bn),)](w, a, x, n, k, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return x
